"""Talking to the API server while following a job: retries with a doubling wait, a 403
told once in words, and a watch that lives as long as the follower (list, watch, resume,
relist on 410 Gone), as an informer does it. ``Watcher`` is held by ``ClusterFollower`` and
lent to its other parts (``pods.py``, ``workload.py``), which watch through it; ``Emit`` is
how every part tells an event."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ...contract.event_types import Error, Kind
from .client import Connection, explain

WATCH_TIMEOUT_S = 30
RETRY_FIRST_S = 0.5  # a transient API error (429, 5xx, a dropped connection) is retried after this,
RETRY_MAX_S = 15.0  # doubling up to this: a control-plane upgrade takes minutes, not forever


class Transient(Exception):
    """The API server could not answer now (429, 5xx, unreachable): try again later."""


def is_forbidden(exc: BaseException) -> bool:
    from kubernetes.client.exceptions import ApiException

    return isinstance(exc, ApiException) and exc.status in (401, 403)


class Backoff:
    """Doubling waits between retries of one failing call; reset by a success."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.delay_s = RETRY_FIRST_S

    def wait(self) -> None:
        self.stop.wait(self.delay_s)
        self.delay_s = min(self.delay_s * 2, RETRY_MAX_S)

    def reset(self) -> None:
        self.delay_s = RETRY_FIRST_S


def parse_time(text: str) -> float:
    """RFC 3339 (nanoseconds allowed) -> epoch seconds."""
    text = text.rstrip("Z")
    whole, _, frac = text.partition(".")
    base = dt.datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def _ts(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.timestamp()
    return parse_time(str(value))


class Emit(Protocol):
    """``ClusterFollower.emit``: an event of ``kind`` about ``node`` (now, unless ``t``)."""

    def __call__(self, kind: str, node: str | None = None, t: float | None = None, **data: Any) -> None: ...


@dataclass(frozen=True)
class Followed:
    """What every part of the cluster follower works on: the connection, the job's name, the
    flag that ends the following, and where its events go."""

    conn: Connection
    job: str
    stop: threading.Event
    emit: Emit


class Watcher:
    """The follower's watches and its one sentence per missing right."""

    def __init__(self, followed: Followed) -> None:
        self.conn = followed.conn
        self.job = followed.job
        self.stop = followed.stop
        self.emit = followed.emit
        self.lock = threading.Lock()  # the watches, log readers and polls meet a 403 at once
        self.refused: set[str] = set()  # the 403 sentences told (each once)

    def forbidden(self, exc: BaseException, action: str) -> None:
        """Say once which right is missing (the verb and resource from the API server's
        message, in client.explain's words); the caller keeps retrying slowly, so a Role
        granted later is picked up."""
        message = str(explain(exc, action, self.conn))
        with self.lock:
            if message in self.refused:
                return
            self.refused.add(message)
        self.emit(Kind.ERROR, None, **Error(error="Forbidden", message=message))

    def watch(
        self,
        list_fn: Callable[..., Any],
        handle: Callable[[str, Any], None],
        *,
        optional: bool = False,
        relisted: Callable[[set[str]], None] | None = None,
        bookmarks: bool = False,
        **selector: str,
    ) -> None:
        """A watch that lives as long as the follower, as an informer does it: list, then
        watch from the list's resourceVersion; after a dropped connection resume from the
        last resourceVersion seen; after 410 Gone list again (ADDED for what exists; the
        handlers dedupe) and give ``relisted`` the names listed, so what was deleted while
        the watch was away is told too. ``optional``: a 401/403 ends it quietly."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        new_watch: Callable[[], Any] = watch.Watch  # the client's watch module has no annotations

        rv: str | None = None
        backoff = Backoff(self.stop)
        while not self.stop.is_set():
            if rv is None:
                try:
                    listed = list_fn(self.conn.namespace, **selector)
                except ApiException as exc:
                    if optional and exc.status in (401, 403):
                        return
                    if exc.status in (401, 403):
                        self.forbidden(exc, f"follow job {self.job!r}")
                    backoff.wait()
                    continue
                except Exception:
                    backoff.wait()
                    continue
                for obj in listed.items:
                    handle("ADDED", obj)
                if relisted is not None:
                    relisted({obj.metadata.name for obj in listed.items})
                rv = listed.metadata.resource_version
            w = new_watch()
            try:
                for item in w.stream(
                    list_fn,
                    self.conn.namespace,
                    resource_version=rv,
                    timeout_seconds=WATCH_TIMEOUT_S,
                    # A quiet watch keeps a fresh resourceVersion (only where the model's required
                    # fields allow a bookmark's bare metadata: V1Pod yes, CoreV1Event no).
                    **({"allow_watch_bookmarks": True} if bookmarks else {}),
                    **selector,
                ):
                    if self.stop.is_set():
                        w.stop()
                        return
                    if item["type"] == "BOOKMARK":
                        # Only a resourceVersion (the client keeps the object a raw dict): resume
                        # from there, not from before the server's compaction.
                        rv = w.resource_version or rv
                        continue
                    obj = item["object"]
                    rv = obj.metadata.resource_version
                    handle(item["type"], obj)
                    backoff.reset()
            except ApiException as exc:
                if optional and exc.status in (401, 403):
                    return
                if exc.status == 410:
                    rv = None
                    continue
                if exc.status in (401, 403):
                    self.forbidden(exc, f"follow job {self.job!r}")
                backoff.wait()
            except Exception:
                backoff.wait()  # dropped connection: resume from rv

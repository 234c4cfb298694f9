"""Following a pod's log as events: with timestamps, so that after a dropped connection
the follower reconnects and skips exactly the lines it already had (nothing duplicated or
lost); a restarted container's previous log read with ``previous=True``. Mixed into
``ClusterFollower``."""

from __future__ import annotations

import threading
import time

from ...events import LineParser
from .client import is_missing
from .pods import PodView
from .watch import Backoff, is_forbidden, parse_time


class LogFollowing:
    """One thread per pod log (and per restarted container's previous log)."""

    def _start_log_follower(self, view: PodView, previous: bool) -> None:
        t = threading.Thread(target=self._follow_log, args=(view.name, previous), name=f"log-{view.name}", daemon=True)
        view.log_threads.append(t)
        t.start()

    def _follow_log(self, pod: str, previous: bool) -> None:
        parser = LineParser(pod)
        last_ts: str | None = None  # RFC 3339 with nanoseconds: sorts as text
        at_last_ts = 0  # lines seen with exactly that timestamp
        backoff = Backoff(self.stop)
        while not self.stop.is_set():
            since = None
            if last_ts is not None:
                since = max(1, int(time.time() - parse_time(last_ts)) + 2)
            try:
                resp = self.core.read_namespaced_pod_log(
                    pod,
                    self.conn.namespace,
                    follow=not previous,
                    previous=previous,
                    timestamps=True,
                    since_seconds=since,
                    _preload_content=False,
                )
            except Exception as exc:
                if is_missing(exc):
                    return
                if is_forbidden(exc):
                    self._forbidden(exc, f"read the log of pod {pod}")
                backoff.wait()
                continue
            backoff.reset()
            skipped_at_last = 0
            buffer = b""
            try:
                for chunk in resp.stream(4096):
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for raw in lines:
                        stamp, _, text = raw.decode("utf-8", "replace").partition(" ")
                        if last_ts is not None:
                            if stamp < last_ts:
                                continue
                            if stamp == last_ts and skipped_at_last < at_last_ts:
                                skipped_at_last += 1
                                continue
                        if stamp == last_ts:
                            at_last_ts += 1
                            skipped_at_last += 1
                        else:
                            last_ts, at_last_ts, skipped_at_last = stamp, 1, 1
                        event = parser.feed(text, parse_time(stamp))
                        if event is not None:
                            self.events.put(event)
                ended = True
            except Exception:
                ended = False  # dropped mid-stream: reconnect and skip what we have
            finally:
                resp.release_conn()
            if previous:
                return
            if ended and self._container_done(pod):
                return
            time.sleep(0.2)

    def _container_done(self, pod: str) -> bool:
        try:
            obj = self.core.read_namespaced_pod(pod, self.conn.namespace)
        except Exception as exc:
            return is_missing(exc)
        statuses = obj.status.container_statuses or [] if obj.status else []
        return bool(statuses and statuses[0].state and statuses[0].state.terminated) or obj.status.phase in (
            "Succeeded",
            "Failed",
        )

"""Pod logs as events, with a bounded number of open streams per job (#16 item 6).

A job of hundreds of pods must not cost the notebook hundreds of log streams. At most
``LOG_STREAMS_MAX`` logs are *followed* (a held ``follow=true`` stream each), chosen in this
order: rank 0's pod (its losses), failing pods (a rank of theirs raised), pods someone asked
for (``follow_pod``), then the others by index; a job of up to ``LOG_STREAMS_MAX`` pods has every
log followed, as before. Rank 0's pod is found in the logs themselves: every agent's
``rendezvous`` event names the round's members with their addresses and group ranks, and a
pod's IP is in the pod watch.

The other pods are *caught up*: read once, without follow, from where we left them, by at
most ``CATCH_UP_READERS`` short requests at a time. Every unfollowed pod is caught up shortly
after rank 0's pod tells a group change (rendezvous, restart, a failure, its workers starting)
and again once the change settled, and before the job's end is told; one pod when it ends or
its container restarts (its tail); otherwise one pod at a time, in turn, at a pace that reads
each pod at least every ``CATCH_UP_EVERY_S`` in a small job and never more than
``CATCH_UP_PER_S`` reads a second in a big one (a 256-pod job: each pod every ~2 minutes).
Pod events (joined, left, pending, restarts) come from the one pod watch for every pod,
unchanged.

Lines are read with timestamps; each pod keeps a cursor (the last timestamp and how many
lines carried it), so any mix of followed stretches, catch-ups and reconnects after a dropped
connection delivers every line once. A restarted container's previous log is read with
``previous=True``. ``LogFollower`` is held by ``ClusterFollower``; the pod watch (``pods.py``)
tells it which pods run and end, and it reads the pods that watch keeps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ...contract.event_types import Kind, Metric, Rendezvous, WorkerFailed, WorkerStarted
from ...contract.events import Event
from ...plumbing import log as _logging
from .client import is_missing
from .pods import PodView
from .watch import Backoff, Followed, is_forbidden, parse_time

_log = _logging.get("backends.kubernetes.logs")

LOG_STREAMS_MAX = 4  # held follow streams per job
CATCH_UP_READERS = 2  # one-shot log reads at once
CATCH_UP_PER_S = 2.0  # the background catch-up's budget of log requests per second
CATCH_UP_EVERY_S = 10.0  # ...and how often it reads each pod at most (small jobs)
SETTLE_S = 1.0  # a group change is caught up this long after rank 0's pod tells it, and 5x that


class LogFollower:
    """Followed streams (bounded), catch-up readers and the choice of what to follow. It
    reads ``pods`` (under ``pods_lock``), which the pod watch writes; the lines it reads go
    to ``put`` as events, and a 403 to ``forbidden`` (told once)."""

    def __init__(
        self,
        followed: Followed,
        pods: dict[str, PodView],
        pods_lock: threading.Lock,
        put: Callable[[Event], None],
        forbidden: Callable[[BaseException, str], None],
    ) -> None:
        self.conn = followed.conn
        self.job = followed.job
        self.stop = followed.stop
        self.pods = pods
        self.pods_lock = pods_lock
        self.put = put
        self.forbidden = forbidden
        self.core = self.conn.core()
        # Guards the choice below (asked, held, due, reading, sweeps, first_words) and wakes the
        # scheduler and the catch-up readers when it changes.
        self.log_wake = threading.Condition()
        self.lead: str | None = None  # the pod of global rank 0, once known
        self.asked: set[str] = set()  # pods someone asked to follow (follow_pod)
        self.held: dict[str, Any] = {}  # pod -> its open follow response (None while connecting)
        self.due: dict[str, bool] = {}  # pods to catch up (True: its previous log first)
        self.reading: set[str] = set()  # pods a catch-up reader reads now
        self.sweeps: list[float] = []  # when catch-ups of every unfollowed pod are due
        self.first_words: list[tuple[float, str]] = []  # (when, pod): a new pod read again until it speaks

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._schedule_logs, name=f"logs-{self.job}", daemon=True)]
        threads += [
            threading.Thread(target=self._catch_up_loop, name=f"catch-up-{self.job}-{i}", daemon=True)
            for i in range(CATCH_UP_READERS)
        ]
        for t in threads:
            t.start()
        return threads

    # -- what the pod watch and the user tell ----------------------------------------------

    def pod_started(self, view: PodView) -> None:
        self._catch_up(view.name)  # its lines so far; followed instead if it gets a slot
        with self.log_wake:
            # Its first lines (its round, its ranks: maybe rank 0) come soon after it starts:
            # read it again after 1, 2, 4, 8 s while it has said nothing.
            now = time.monotonic()
            self.first_words += [(now + SETTLE_S * 2**k, view.name) for k in range(4)]
        self._rebalance()

    def pod_restarted(self, view: PodView) -> None:
        self._catch_up(view.name, previous=True)

    def pod_ended(self, view: PodView) -> None:
        self._catch_up(view.name)  # its tail: what it said before it went
        self._rebalance()

    def follow_pod(self, pod: str) -> None:
        """Follow this pod's log live (a dashboard or a user opened it), within the bound:
        it takes a slot before pods nobody asked for."""
        with self.log_wake:
            self.asked.add(pod)
        self._rebalance()

    def unfollow_pod(self, pod: str) -> None:
        """The pod is no longer asked for: its slot goes back to the others."""
        with self.log_wake:
            self.asked.discard(pod)
        self._rebalance()

    # -- the choice ---------------------------------------------------------------------

    def _wanted(self) -> list[str]:
        """The pods to follow, most wanted first, at most ``LOG_STREAMS_MAX``."""
        with self.pods_lock:
            live = [v for v in self.pods.values() if v.running_seen and not v.left]
        live.sort(key=lambda v: (v.index if v.index is not None else 1 << 30, v.name))
        order: dict[str, None] = {}  # insertion-ordered, no repeats
        for rule in (
            lambda v: v.name == self.lead,
            lambda v: v.failing,
            lambda v: v.name in self.asked,
            lambda v: True,
        ):
            for v in live:
                if len(order) >= LOG_STREAMS_MAX:
                    return list(order)
                if rule(v):
                    order.setdefault(v.name)
        return list(order)

    def _rebalance(self) -> None:
        with self.log_wake:
            self.log_wake.notify_all()

    def _schedule_logs(self) -> None:
        """Close the streams no longer wanted, open the wanted ones (never more than the
        bound at once), and queue the catch-ups that are due."""
        next_trickle = time.monotonic()
        last_trickled = ""
        while not self.stop.is_set():
            wanted = self._wanted()
            with self.log_wake:
                for pod, resp in list(self.held.items()):
                    if pod not in wanted and resp is not None:
                        _close(resp)  # its thread sees the stream end and leaves
                for pod in wanted:
                    if pod not in self.held and len(self.held) < LOG_STREAMS_MAX:
                        self.held[pod] = None
                        threading.Thread(target=self._follow, args=(pod,), name=f"log-{pod}", daemon=True).start()
                now = time.monotonic()
                if self.first_words:
                    ready = [pod for when, pod in self.first_words if when <= now]
                    self.first_words = [(when, pod) for when, pod in self.first_words if when > now]
                    for pod in ready:
                        view = self.pods.get(pod)
                        if view is not None and view.cursor.last_ts is None and pod not in self.held:
                            self.due.setdefault(pod, False)
                    if ready:
                        self.log_wake.notify_all()
                if self.sweeps and now >= self.sweeps[0]:
                    self.sweeps.pop(0)  # a group change: every unfollowed pod at once
                    for name in self._unfollowed():
                        self.due.setdefault(name, False)
                    self.log_wake.notify_all()
                if now >= next_trickle:
                    # Otherwise one pod at a time, in turn: each is read at least every
                    # CATCH_UP_EVERY_S in a small job, and never more than CATCH_UP_PER_S reads
                    # a second in a big one.
                    names = self._unfollowed()
                    if names:
                        turn = next((n for n in names if n > last_trickled), names[0])
                        last_trickled = turn
                        self.due.setdefault(turn, False)
                        self.log_wake.notify_all()
                    next_trickle = now + max(CATCH_UP_EVERY_S / max(1, len(names)), 1 / CATCH_UP_PER_S)
                until = min([next_trickle, *self.sweeps, *(when for when, _ in self.first_words)])
                self.log_wake.wait(max(0.05, min(1.0, until - now)))
        with self.log_wake:  # stopped: a quiet pod's stream would stay open until its next line
            for resp in self.held.values():
                if resp is not None:
                    _close(resp)

    def _unfollowed(self) -> list[str]:
        """Running pods whose log is not followed now, by name (called under ``log_wake``)."""
        with self.pods_lock:
            names = [v.name for v in self.pods.values() if v.running_seen and not v.left]
        return sorted(n for n in names if n not in self.held)

    def _catch_up(self, pod: str, previous: bool = False) -> None:
        with self.log_wake:
            self.due[pod] = self.due.get(pod, False) or previous
            self.log_wake.notify_all()

    def _sweep_soon(self) -> None:
        """Catch every unfollowed pod up soon (the others' lines of a group change come about
        when rank 0's do) and again once the change has settled (a slower node's): two sweeps
        pending at most, the second pushed back by each further change."""
        with self.log_wake:
            now = time.monotonic()
            soon = min([now + SETTLE_S, *self.sweeps])
            self.sweeps = [soon, max(soon, now + 5 * SETTLE_S)]
            self.log_wake.notify_all()

    def catch_up_all(self, timeout_s: float = 30.0) -> None:
        """Read every pod's log up to now (before the job's end is told), and wait for it."""
        with self.pods_lock:
            names = [v.name for v in self.pods.values() if v.running_seen]
        with self.log_wake:
            for name in names:
                if name not in self.held:
                    self.due.setdefault(name, False)
            self.log_wake.notify_all()
            deadline = time.monotonic() + timeout_s
            while (self.due or self.reading) and time.monotonic() < deadline:
                self.log_wake.wait(0.1)

    # -- reading --------------------------------------------------------------------------

    def _catch_up_loop(self) -> None:
        while not self.stop.is_set():
            with self.log_wake:
                pod = next((p for p in self.due if p not in self.reading), None)
                if pod is None:
                    self.log_wake.wait(0.5)
                    continue
                previous = self.due.pop(pod)
                self.reading.add(pod)
            try:
                view = self.pods.get(pod)
                if view is not None:
                    if previous:
                        self._read(view, previous=True)
                    if pod not in self.held:
                        self._read(view, previous=False)
            finally:
                with self.log_wake:
                    self.reading.discard(pod)
                    self.log_wake.notify_all()

    def _read(self, view: PodView, previous: bool) -> None:
        """One read of a pod's log from its cursor to the end there is now."""
        try:
            resp = self.core.read_namespaced_pod_log(
                view.name,
                self.conn.namespace,
                previous=previous,
                timestamps=True,
                since_seconds=view.cursor.since_seconds(),
                _preload_content=False,
            )
        except Exception as exc:
            if is_forbidden(exc):
                self.forbidden(exc, f"read the log of pod {view.name}")
            return  # gone, not started, or no answer now: the next catch-up tries again
        try:
            self._deliver(view, resp)
        except Exception:
            _log.debug("dropped: the cursor says where the next read starts", exc_info=True)
        finally:
            resp.release_conn()

    def _follow(self, pod: str) -> None:
        """Follow one pod's log while it is wanted; reconnect after a dropped connection."""
        backoff = Backoff(self.stop)
        view = self.pods.get(pod)
        try:
            while view is not None and not self.stop.is_set() and pod in self._wanted():
                try:
                    resp = self.core.read_namespaced_pod_log(
                        pod,
                        self.conn.namespace,
                        follow=True,
                        timestamps=True,
                        since_seconds=view.cursor.since_seconds(),
                        _preload_content=False,
                    )
                except Exception as exc:
                    if is_missing(exc):
                        return
                    if is_forbidden(exc):
                        self.forbidden(exc, f"read the log of pod {pod}")
                    backoff.wait()
                    continue
                backoff.reset()
                with self.log_wake:
                    self.held[pod] = resp
                ended = False
                try:
                    self._deliver(view, resp)
                    ended = True
                except Exception:
                    _log.debug("dropped mid-stream (or closed by the scheduler): reconnect or leave", exc_info=True)
                finally:
                    with self.log_wake:
                        self.held[pod] = None
                    resp.release_conn()
                if ended and self._container_done(pod):
                    return
                self.stop.wait(0.2)
        finally:
            with self.log_wake:
                self.held.pop(pod, None)
                self.log_wake.notify_all()
            if view is not None and not self.stop.is_set():
                self._catch_up(pod)  # what it said between the stream's end and now

    def _deliver(self, view: PodView, resp: Any) -> None:
        buffer = b""
        keep = None
        for chunk in resp.stream(4096):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                stamp, _, text = raw.decode("utf-8", "replace").partition(" ")
                with view.lock:
                    keep = keep or view.cursor.reading()
                    if not keep(stamp):
                        continue
                    event = view.parser.feed(text, parse_time(stamp))
                if event is not None:
                    self._told(view, event)
                    self.put(event)

    def _told(self, view: PodView, event: Event) -> None:
        """What a log line says about whom to follow: rank 0's pod, a failing pod; a group
        change on rank 0's pod makes the others' lines worth reading soon."""
        kind = event.kind
        if kind == Kind.RENDEZVOUS:
            round_ = event.fields(Rendezvous)
            lead = view.name if round_.get("group_rank") == 0 else None
            told = round_.get("lead")  # at any size (the members are told up to 64)
            for member in [*(round_.get("members") or []), *([told] if told else [])]:
                if member.get("group_rank") == 0:
                    lead = self._pod_at(member.get("addr")) or lead
            if lead is not None:
                self._lead(lead)
        elif (kind == Kind.WORKER_STARTED and event.fields(WorkerStarted).get("rank") == 0) or (
            kind == Kind.METRIC and event.fields(Metric).get("rank") == 0
        ):
            self._lead(view.name)
        if kind == Kind.WORKER_FAILED and event.fields(WorkerFailed).get("cause") != "peer":
            view.failing = True
            self._rebalance()
        elif kind == Kind.WORKER_STARTED and view.failing:
            view.failing = False  # a new group started on it
            self._rebalance()
        if view.name == self.lead and kind in (
            Kind.RENDEZVOUS,
            Kind.RESTART,
            Kind.WORKER_FAILED,
            Kind.WORKER_STARTED,
            Kind.PEER_LOST,
        ):
            self._sweep_soon()

    def _lead(self, pod: str) -> None:
        if pod != self.lead:
            self.lead = pod
            self._rebalance()

    def _pod_at(self, addr: str | None) -> str | None:
        if not addr:
            return None
        with self.pods_lock:
            return next((v.name for v in self.pods.values() if v.ip == addr and not v.left), None)

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


def _close(resp: Any) -> None:
    """End a held stream from another thread: its reader sees the stream end."""
    try:
        resp.shutdown()  # urllib3 >= 2.3: unblocks a read in another thread
    except Exception:
        try:
            resp.close()
        except Exception:
            _log.debug("could not close a log stream", exc_info=True)

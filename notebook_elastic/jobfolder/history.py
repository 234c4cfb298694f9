"""A job's history on disk, bounded: ``events.jsonl`` is rotated into a compacted
``events.1.jsonl`` once it grows past a size.

Compaction keeps every event that status, membership, restarts and the timeline are folded
from, exactly; worker output is dropped (the node logs keep it); metrics keep, per metric,
the minimum, the maximum and the last point of each of at most ``METRIC_BUCKETS`` step
buckets, which is what the chart draws anyway. A replay of the compacted history gives the
same status, world size, restarts, nodes and step as the full one, and a chart whose spikes
are all there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from ..contract.event_types import Kind, Metric
from ..contract.events import Event
from .folder import open_file  # a FIFO in a file's place: ValueError, not a reader held forever

#: events.jsonl is rotated past this size (a 600-step job writes ~100 KB; 100k metric points ~12 MiB).
ROTATE_BYTES = 16 * 1024 * 1024
METRIC_BUCKETS = 1000


def history_file(events_file: Path) -> Path:
    return events_file.with_name("events.1.jsonl")


def parse(line: bytes | str) -> Event | None:
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    if not text.strip():
        return None
    try:
        return Event.from_line(text)
    except (ValueError, KeyError, TypeError):
        return None  # a torn line (a writer killed mid-line, a full disk): skipped


def read_all(events_file: Path) -> Iterator[Event]:
    """Every event of the job, oldest first: the compacted history, then the current file."""
    for path in (history_file(events_file), events_file):
        try:
            with open_file(path) as f:
                for line in f:
                    event = parse(line)
                    if event is not None:
                        yield event
        except FileNotFoundError:
            continue


def compact(events: list[Event]) -> list[Event]:
    """The events a replay needs, in their order (see the module's docstring)."""
    metrics = [(i, e) for i, e in enumerate(events) if e.kind == Kind.METRIC]
    keep_metric: set[int] = set()
    by_name: dict[str, list[tuple[float, float, int]]] = {}
    latest_of_rank: dict[int, int] = {}  # the other ranks' (all_ranks=True): only their latest is shown
    for i, e in metrics:
        d = e.fields(Metric)
        rank = d.get("rank")
        if rank is not None and rank != 0:
            latest_of_rank[int(rank)] = i
            continue
        step = d.get("step")
        values = d.get("values")
        if not isinstance(step, (int, float)) or not isinstance(values, dict):
            continue
        for name, value in values.items():
            if isinstance(value, (int, float)):
                by_name.setdefault(name, []).append((float(step), float(value), i))
    for points in by_name.values():
        lo, hi = min(p[0] for p in points), max(p[0] for p in points)
        width = (hi - lo) / METRIC_BUCKETS or 1.0
        buckets: dict[int, list[tuple[float, float, int]]] = {}
        for point in points:
            buckets.setdefault(min(int((point[0] - lo) / width), METRIC_BUCKETS - 1), []).append(point)
        for bucket in buckets.values():
            keep_metric.add(min(bucket, key=lambda p: p[1])[2])
            keep_metric.add(max(bucket, key=lambda p: p[1])[2])
            keep_metric.add(bucket[-1][2])
    keep_metric.update(latest_of_rank.values())
    return [e for i, e in enumerate(events) if e.kind != Kind.LOG and (e.kind != Kind.METRIC or i in keep_metric)]


def rotate(events_file: Path, open_flags: int) -> int:
    """Fold the current file into the compacted history and start an empty one; returns the
    new file's descriptor. Followers that hold the old file read it to its end, then see the
    path is a new file and go on there."""
    history = history_file(events_file)
    events = list(read_all(events_file))
    kept = compact(events)
    tmp = history.with_name(f".{history.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.writelines(e.to_line() + "\n" for e in kept)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o600)
    fresh = events_file.with_name(f".{events_file.name}.{os.getpid()}.new")
    fd = os.open(fresh, open_flags, 0o600)
    os.replace(tmp, history)
    os.replace(fresh, events_file)
    return fd

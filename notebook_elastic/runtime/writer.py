"""Writing a checkpoint: rank 0's file (temp file, fsync, fenced rename, prune) written in
the foreground or a background thread, the sharded folder's async half, a full disk as a
pause rather than a crash, and the checkpoint events the notebook reads. ``State`` holds a
``CheckpointWriter`` once its generation is agreed, and hands it what each commit saves."""

from __future__ import annotations

import errno
import os
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..contract import protocol
from ..contract.event_types import Checkpoint, CheckpointFailed, Fenced, Kind
from ..plumbing import log as _logging
from . import sharded
from ._emit import emit
from .checkpoints import _HOST, _fsync_dir, _remove, _size, dead_writers_files, list_checkpoints, newest_generation
from .interval import SaveInterval, is_final
from .state_dicts import _Snapshotter
from .worker import StaleGenerationError, WorkerInfo

#: A full checkpoint disk is a state, not a crash: training goes on, saving is tried again
#: this often, and the notebook is told once per episode.
DISK_FULL_RETRY_S = 30.0
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# A checkpoint event per commit is one event per step (600 for a 600-step job): the history
# keeps the first checkpoint of each generation, one every this many seconds, and the last step.
CHECKPOINT_EVENT_EVERY_S = 10.0


class Loop(Protocol):
    """Where the training loop is (``State``): read when a write lands, which for a background
    write is some steps after the commit that started it."""

    @property
    def step(self) -> int: ...  # the next step to run

    @property
    def total(self) -> int | None: ...  # the loop's last step + 1, once ``steps()`` started


class CheckpointWriter:
    """Rank 0's writes (and every rank's sharded ones), fenced against newer groups.

    At most one write is in flight: a background thread of rank 0's, or a non-writer rank's
    unfinished async sharded save; ``wait()`` finishes it, and its error (or the fence it
    met) is raised by the next ``raise_pending()``.
    """

    def __init__(
        self,
        folder: Path,
        *,
        generation: int,
        keep: int,
        info: WorkerInfo,
        interval: SaveInterval,
        loop: Loop,
    ) -> None:
        self.keep = keep  # checkpoints kept in the folder (State(keep=...))
        self._folder = folder
        self._generation = generation
        self._info = info
        self._interval = interval  # told of each write; its window goes into the events
        # Weakly: the State holds its writer, and that cycle kept an ended State (its model: on a
        # GPU, device memory) alive past a change in place, until the collector's next full pass.
        self._loop = weakref.proxy(loop)
        self._snapshotter = _Snapshotter()
        self._thread: threading.Thread | None = None  # rank 0's background write
        self._error: BaseException | None = None  # what the background write raised
        self._pending_save: tuple[Any, int] | None = None  # a non-writer rank's (future, step)
        self._stale = False  # a newer generation was seen: this group writes nothing more
        self._disk_full_until = 0.0  # monotonic time before which commits skip the write
        self._announced: tuple[int, float] | None = None  # (generation, monotonic time) of the last event
        self._unannounced = 0  # commits written since the last checkpoint event

    @property
    def is_writer(self) -> bool:
        return self._info.rank == 0

    # -- what a commit asks ----------------------------------------------------------------

    def writing(self) -> bool:
        """Whether rank 0's last save is still being written in the background."""
        return self._thread is not None and self._thread.is_alive()

    def saving_paused(self) -> bool:
        """Whether a full disk pauses saving now (retried after ``DISK_FULL_RETRY_S``)."""
        return time.monotonic() < self._disk_full_until

    def on_disk(self) -> bool:
        """Wait for the save in flight; whether it reached the disk (a notice answers with it)."""
        self.wait()
        return self._error is None and not self._stale and time.monotonic() >= self._disk_full_until

    def wait(self) -> None:
        """Finish the write in flight, if any (a non-writer rank's sharded save raises here)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._pending_save is not None:
            (future, step), self._pending_save = self._pending_save, None
            try:
                future.result()
            except BaseException as exc:
                if not self.sharded_save_failed(exc, step):
                    raise

    def raise_pending(self) -> None:
        """Raise what the last background write met: its error, or a newer generation."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._stale:
            raise StaleGenerationError(self.stale_message())

    def stale_message(self) -> str:
        return (
            f"worker group of generation {self._generation} was superseded by generation "
            f"{newest_generation(self._folder)} in {self._folder}; it stops without writing"
        )

    def check_fence(self) -> bool:
        """Whether a newer generation has announced itself in the folder (said once, in an event)."""
        newer = newest_generation(self._folder)
        if newer > self._generation:
            if not self._stale:
                emit(
                    Kind.FENCED,
                    **Fenced(
                        rank=self._info.rank,
                        generation=self._generation,
                        newer_generation=newer,
                        step=self._loop.step,
                    ),
                )
            self._stale = True
        return self._stale

    # -- rank 0's checkpoint file ------------------------------------------------------------

    def write_in_background(self, tree: dict[str, Any]) -> None:
        """Copy ``tree`` to CPU memory now and write it from a background thread."""
        snapshot = self._snapshotter.copy(tree)
        self._thread = threading.Thread(target=self._write_in_background, args=(snapshot,), daemon=True)
        self._thread.start()

    def write(self, tree: dict[str, Any]) -> None:
        """Write ``tree`` now; a full disk pauses saving instead of raising."""
        try:
            self._write(tree)
        except OSError as exc:
            if not self._disk_is_full(exc, tree["step"]):
                raise

    def _write_in_background(self, tree: dict[str, Any]) -> None:
        try:
            self._write(tree)
        except StaleGenerationError:
            pass  # _stale is set; the next commit raises
        except OSError as exc:
            if not self._disk_is_full(exc, tree["step"]):
                self._error = exc
                emit(
                    Kind.CHECKPOINT_FAILED,
                    **CheckpointFailed(error=f"{type(exc).__name__}: {exc}"[:500], step=tree["step"]),
                )
        except BaseException as exc:
            self._error = exc
            emit(
                Kind.CHECKPOINT_FAILED,
                **CheckpointFailed(error=f"{type(exc).__name__}: {exc}"[:500], step=tree["step"]),
            )

    def _write(self, tree: dict[str, Any]) -> None:
        import torch

        started = time.perf_counter()
        self._folder.mkdir(parents=True, exist_ok=True)
        final = self._folder / protocol.checkpoint_name(self._generation, tree["step"])
        tmp = self._folder / f".{final.name}.tmp-{_HOST}-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                # The legacy format skips the zip format's CRC32 of every record, which is
                # ~75 % of the save time (175 -> 45 ms for 117 MB here); a torn write is
                # already impossible (temp file + rename), and torch.load reads both.
                try:
                    torch.save(tree, f, _use_new_zipfile_serialization=False)
                except RuntimeError as exc:  # torch's writer says ENOSPC in words, not an errno
                    full = next((e for e in _DISK_FULL if os.strerror(e) in str(exc)), None)
                    if full is None:
                        raise
                    raise OSError(full, os.strerror(full)) from exc
                f.flush()
                os.fsync(f.fileno())
            self.land(tmp, final, tree["step"], started, tree["every"])
        finally:
            if tmp.exists():
                tmp.unlink()

    # -- sharded folders -----------------------------------------------------------------------

    def finish_in_background(self, future: Any, tmp: Path, final: Path, step: int, started: float, every: int) -> None:
        """Rank 0: land an async sharded save from a background thread once every rank wrote."""
        args = (future, tmp, final, step, started, every)
        self._thread = threading.Thread(target=self._finish_sharded_save, args=args, daemon=True)
        self._thread.start()

    def pending(self, future: Any, step: int) -> None:
        """A non-writer rank: its async sharded save of ``step``, finished by the next ``wait()``."""
        self._pending_save = (future, step)

    def sharded_save_failed(self, exc: BaseException, step: int) -> bool:
        """A full disk pauses saving on every rank alike (DCP tells every rank); True if it was that."""
        os_error = sharded.os_error_in(exc)
        if os_error is None or os_error.errno not in _DISK_FULL:
            return False
        if self.is_writer:
            self._disk_is_full(os_error, step)
        return True

    def _finish_sharded_save(self, future: Any, tmp: Path, final: Path, step: int, started: float, every: int) -> None:
        """Rank 0's background half of an async sharded save: wait for every rank's shards, land."""
        try:
            future.result()
            self.land(tmp, final, step, started, every)
        except StaleGenerationError:
            pass  # _stale is set; the next commit tells every rank
        except BaseException as exc:
            if not self.sharded_save_failed(exc, step):
                self._error = exc
                emit(Kind.CHECKPOINT_FAILED, **CheckpointFailed(error=f"{type(exc).__name__}: {exc}"[:500], step=step))
        finally:
            if tmp.exists():
                _remove(tmp)

    # -- landing -------------------------------------------------------------------------------

    def _disk_is_full(self, exc: OSError, step: int) -> bool:
        """A full disk (the good checkpoints are intact: writes go to a temp file first) pauses
        saving instead of failing the worker, which would only fail again at every restart."""
        if exc.errno not in _DISK_FULL:
            return False
        final = is_final(step, self._loop.total)  # the write's own step: a background one may be older
        if self._disk_full_until == 0.0 or final:  # once per episode, and the last step's save
            saved = list_checkpoints(self._folder)
            emit(
                Kind.CHECKPOINT_FAILED,
                **CheckpointFailed(
                    error=f"{type(exc).__name__}: {exc}"[:500],
                    step=step,
                    disk_full=True,
                    retry_s=DISK_FULL_RETRY_S,
                    folder=str(self._folder),
                    final=final,
                    # What a resume would start from: the newest checkpoint on the disk.
                    saved_step=saved[-1][1] if saved else None,
                ),
            )
        self._disk_full_until = time.monotonic() + DISK_FULL_RETRY_S
        return True

    def land(self, tmp: Path, final: Path, step: int, started: float, every: int) -> None:
        """Rename a written checkpoint into place (fenced), prune, and tell the notebook."""
        # Last look before the rename: a newer group may have started meanwhile.
        if self.check_fence():
            raise StaleGenerationError(self.stale_message())
        os.replace(tmp, final)
        _fsync_dir(self._folder)
        self._interval.wrote(started, time.perf_counter())
        size = _size(final)
        self._prune(final)
        self._unannounced += 1
        now = time.monotonic()
        recovered, self._disk_full_until = self._disk_full_until != 0.0, 0.0
        if (
            recovered
            or self._announced is None
            or self._announced[0] != self._generation
            or now - self._announced[1] >= CHECKPOINT_EVENT_EVERY_S
            or step == self._loop.total
        ):
            blocked, trained = self._interval.take_window()
            emit(
                Kind.CHECKPOINT,
                **Checkpoint(
                    step=step,
                    generation=self._generation,
                    bytes=size,
                    ms=round((time.perf_counter() - started) * 1000, 2),
                    commits=self._unannounced,
                    # The share of the loop's time commit() blocked since the last such event, and
                    # how often it saves (steps), chosen or given.
                    blocked_pct=round(100 * blocked / (blocked + trained), 1) if blocked + trained > 0 else 0.0,
                    every=every,
                    chosen=self._interval.chosen,
                ),
            )
            self._announced, self._unannounced = (self._generation, now), 0

    def _prune(self, newest_written: Path) -> None:
        """Keep the last ``keep`` checkpoints; never delete one that sorts above ours."""
        files = [path for _g, _s, path in list_checkpoints(self._folder)]
        if newest_written not in files:
            return
        candidates = files[: files.index(newest_written) + 1]
        for path in candidates[: -self.keep]:
            _remove(path)
        names = os.listdir(self._folder)
        claims = sorted(n for n in names if protocol.CLAIM_RE.match(n))
        doomed = [n for n in claims[: -self.keep] if _claimed(n) < self._generation]
        doomed += dead_writers_files(self._folder, names)
        for name in doomed:
            _remove(self._folder / name)


def _claimed(claim: str) -> int:
    """The generation a claim file's name announces."""
    m = protocol.CLAIM_RE.match(claim)
    assert m is not None  # only names that matched CLAIM_RE are asked
    return int(m.group(1))


def checkpoint_header(
    *, step: int, generation: int, world_size: int, samples_seen: int, interval: SaveInterval
) -> dict[str, Any]:
    """What every checkpoint says about itself, beside the objects' states."""
    return {
        "format": 1,
        "step": step,
        "generation": generation,
        "world_size": world_size,
        "samples_seen": samples_seen,
        "time": time.time(),
        "every": interval.steps_since_save,  # steps since the previous save
        "save_s": interval.save_cost,  # what the previous save blocked: a resumed group's estimate
    }


@dataclass
class _Stood:
    """Where the loop stood, for a writer with no State (``save_handed_on``)."""

    step: int
    total: int | None


def save_handed_on(
    handoff: Any,
    *,
    folder: Path,
    generation: int,
    keep: int,
    info: WorkerInfo,
    interval: SaveInterval,
    total: int | None,
) -> None:
    """Save the values a State handed on at a change (``runtime/handoff.py``) as that State's
    writer would have: its node goes before any next State took them (a stop, a scale-down,
    while the cell ran again), and a resume must not lose the steps since the last save. Under
    the newest generation claimed (the next group's rank 0 may have claimed one before it
    broke; it never trained), so the fence lets it land."""
    step = int(handoff.next_step)
    generation = max(generation, newest_generation(folder))
    loop = _Stood(step, total)
    writer = CheckpointWriter(folder, generation=generation, keep=keep, info=info, interval=interval, loop=loop)
    tree = {
        **checkpoint_header(
            step=step,
            generation=generation,
            world_size=info.world_size,
            samples_seen=handoff.samples_seen,
            interval=interval,
        ),
        "objects": handoff.states,
        "extra": dict(handoff.extra),
    }
    try:
        writer.write(tree)
    except Exception:  # its node goes either way: said, and the resume starts from the last save
        _logging.get("runtime.writer").warning(
            "the values handed on at step %s could not be saved", step, exc_info=True
        )

"""Writing a checkpoint: rank 0's file (temp file, fsync, fenced rename, prune) written in
the foreground or a background thread, the sharded folder's async half, a full disk as a
pause rather than a crash, and the checkpoint events the notebook reads. Mixed into
``State``, whose folder, generation and counters it uses."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

from . import protocol, sharded
from ._emit import emit
from .checkpoints import _HOST, _fsync_dir, _remove, _size, dead_writers_files, list_checkpoints, newest_generation
from .worker import StaleGenerationError, device

#: A full checkpoint disk is a state, not a crash: training goes on, saving is tried again
#: this often, and the notebook is told once per episode.
DISK_FULL_RETRY_S = 30.0
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# A checkpoint event per commit is one event per step (600 for a 600-step job): the history
# keeps the first checkpoint of each generation, one every this many seconds, and the last step.
CHECKPOINT_EVENT_EVERY_S = 10.0


class CheckpointWriter:
    """Rank 0's writes (and every rank's sharded ones), fenced against newer groups."""

    def _sharded_save_failed(self, exc: BaseException, step: int) -> bool:
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
            self._land(tmp, final, step, started, every)
        except StaleGenerationError:
            pass  # _stale is set; the next commit tells every rank
        except BaseException as exc:
            if not self._sharded_save_failed(exc, step):
                self._writer_error = exc
                emit("checkpoint_failed", error=f"{type(exc).__name__}: {exc}"[:500], step=step)
        finally:
            if tmp.exists():
                _remove(tmp)

    def _group_for_saves(self) -> Any:
        """A gloo group for async sharded saves: their collectives run in a background thread
        and must not interleave with the training loop's on the default group. None (saves
        stay synchronous) without a process group or without ``async_commit``."""
        dist = self._dist()
        if dist is None or not self.async_commit:
            return None
        return dist.new_group(backend="gloo")

    def _broadcast_int(self, value: int) -> int:
        dist = self._dist()
        if dist is None:
            return value
        import torch

        on = device() if dist.get_backend() == "nccl" else torch.device("cpu")
        t = torch.tensor([value], dtype=torch.long, device=on)
        dist.broadcast(t, src=0)
        return int(t.item())

    def _broadcast_text(self, text: str) -> str:
        """Rank 0's ``text`` on every rank (a collective, as ``_broadcast_int``)."""
        dist = self._dist()
        if dist is None:
            return text
        box = [text]
        dist.broadcast_object_list(box, src=0)
        return str(box[0])

    def _wait_for_writer(self) -> None:
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        if self._pending_save is not None:
            (future, step), self._pending_save = self._pending_save, None
            try:
                future.result()
            except BaseException as exc:
                if not self._sharded_save_failed(exc, step):
                    raise

    def _raise_pending(self) -> None:
        if self._writer_error is not None:
            error, self._writer_error = self._writer_error, None
            raise error
        if self._stale:
            raise StaleGenerationError(self._stale_message())

    def _stale_message(self) -> str:
        return (
            f"worker group of generation {self.generation} was superseded by generation "
            f"{newest_generation(self.folder)} in {self.folder}; it stops without writing"
        )

    def _check_fence(self) -> bool:
        newer = newest_generation(self.folder)
        if newer > self.generation:
            if not self._stale:
                emit("fenced", rank=self.info.rank, generation=self.generation, newer_generation=newer, step=self.step)
            self._stale = True
        return self._stale

    def _write_in_background(self, tree: dict) -> None:
        try:
            self._write(tree)
        except StaleGenerationError:
            pass  # _stale is set; the next commit raises
        except OSError as exc:
            if not self._disk_is_full(exc, tree["step"]):
                self._writer_error = exc
                emit("checkpoint_failed", error=f"{type(exc).__name__}: {exc}"[:500], step=tree["step"])
        except BaseException as exc:
            self._writer_error = exc
            emit("checkpoint_failed", error=f"{type(exc).__name__}: {exc}"[:500], step=tree["step"])

    def _disk_is_full(self, exc: OSError, step: int) -> bool:
        """A full disk (the good checkpoints are intact: writes go to a temp file first) pauses
        saving instead of failing the worker, which would only fail again at every restart."""
        if exc.errno not in _DISK_FULL:
            return False
        final = self._final(step)  # the write's own step: a background one may be older
        if self._disk_full_until == 0.0 or final:  # once per episode, and the last step's save
            saved = list_checkpoints(self.folder)
            emit(
                "checkpoint_failed",
                error=f"{type(exc).__name__}: {exc}"[:500],
                step=step,
                disk_full=True,
                retry_s=DISK_FULL_RETRY_S,
                folder=str(self.folder),
                final=final,
                # What a resume would start from: the newest checkpoint on the disk.
                saved_step=saved[-1][1] if saved else None,
            )
        self._disk_full_until = time.monotonic() + DISK_FULL_RETRY_S
        return True

    def _write(self, tree: dict) -> None:
        import torch

        started = time.perf_counter()
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.folder / protocol.checkpoint_name(self.generation, tree["step"])
        tmp = self.folder / f".{final.name}.tmp-{_HOST}-{os.getpid()}"
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
            self._land(tmp, final, tree["step"], started, tree["every"])
        finally:
            if tmp.exists():
                tmp.unlink()

    def _land(self, tmp: Path, final: Path, step: int, started: float, every: int) -> None:
        """Rename a written checkpoint into place (fenced), prune, and tell the notebook."""
        # Last look before the rename: a newer group may have started meanwhile.
        if self._check_fence():
            raise StaleGenerationError(self._stale_message())
        os.replace(tmp, final)
        _fsync_dir(self.folder)
        self._last_write = (started, time.perf_counter())
        size = _size(final)
        self._prune(final)
        self._unannounced += 1
        now = time.monotonic()
        recovered, self._disk_full_until = self._disk_full_until != 0.0, 0.0
        if (
            recovered
            or self._announced is None
            or self._announced[0] != self.generation
            or now - self._announced[1] >= CHECKPOINT_EVENT_EVERY_S
            or step == self.total
        ):
            blocked, trained = self._window
            self._window = [0.0, 0.0]
            emit(
                "checkpoint",
                step=step,
                generation=self.generation,
                bytes=size,
                ms=round((time.perf_counter() - started) * 1000, 2),
                commits=self._unannounced,
                # The share of the loop's time commit() blocked since the last such event, and
                # how often it saves (steps), chosen or given.
                blocked_pct=round(100 * blocked / (blocked + trained), 1) if blocked + trained > 0 else 0.0,
                every=every,
                chosen=self.checkpoint_every is None,
            )
            self._announced, self._unannounced = (self.generation, now), 0

    def _prune(self, newest_written: Path) -> None:
        """Keep the last ``keep`` checkpoints; never delete one that sorts above ours."""
        files = [path for _g, _s, path in list_checkpoints(self.folder)]
        if newest_written not in files:
            return
        candidates = files[: files.index(newest_written) + 1]
        for path in candidates[: -self.keep]:
            _remove(path)
        names = os.listdir(self.folder)
        claims = sorted(n for n in names if protocol.CLAIM_RE.match(n))
        doomed = [n for n in claims[: -self.keep] if int(protocol.CLAIM_RE.match(n).group(1)) < self.generation]
        doomed += dead_writers_files(self.folder, names)
        for name in doomed:
            _remove(self.folder / name)

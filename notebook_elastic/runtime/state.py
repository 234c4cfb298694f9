"""Training state that survives restarts: restore at start, atomic fenced commits.

``State`` restores the latest checkpoint when a worker group starts (mapped to this worker's
device), yields the remaining steps, and ``commit()`` saves from global rank 0: written to a
temporary file, fsynced, renamed, the folder fsynced, optionally in a background thread,
keeping the last ``keep`` files.

Fencing. Checkpoint names carry a *generation* and sort by (generation, step). The
generation is the rendezvous round the worker group was formed in (our agent wrapper
passes it down), or, under a plain ``torchrun``, a number claimed atomically in the
checkpoint folder. A new group announces its generation with a claim file as soon as it
starts; a group that finds a newer generation on disk refuses to write and stops
(``StaleGenerationError``). So a stale group (split brain, an orphaned worker) can neither
overwrite a newer checkpoint nor be restored in preference to one.

Sharded models (FSDP, DTensor) are saved by every rank into one folder through
torch.distributed.checkpoint (``sharded.py``) and resharded on load when the world size
changed; the folder is written under a temporary name and renamed by rank 0, fenced the same
way, and rank 0 tells the other ranks each commit whether to write, so they never disagree.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import protocol, sharded
from ._emit import emit
from .worker import StaleGenerationError, StateNotSaveable, WorkerInfo, device, on_finish, set_step_source

DEFAULT_CHECKPOINT_DIR = "checkpoints"
TMP_MAX_AGE_S = 600
#: A full checkpoint disk is a state, not a crash: training goes on, saving is tried again
#: this often, and the notebook is told once per episode.
DISK_FULL_RETRY_S = 30.0
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# A checkpoint event per commit is one event per step (600 for a 600-step job): the history
# keeps the first checkpoint of each generation, one every this many seconds, and the last step.
CHECKPOINT_EVENT_EVERY_S = 10.0
#: The share of the training loop's time that commit() may block, when State chooses how often
#: to save (no --checkpoint-every): a save waits until everything commit() blocked so far, plus
#: the last save's cost, is within this share of the loop's time; and until the writer has
#: rested as long as it last wrote. The last step is always saved.
BLOCKING_TARGET = 0.10


def checkpoint_every_from_env(explicit: int | None = None) -> int | None:
    """Save every N steps (``State(checkpoint_every=N)``, ``--checkpoint-every N``), or None:
    State chooses, keeping the time commit() blocks under ``BLOCKING_TARGET``."""
    if explicit is None:
        text = os.environ.get(protocol.ENV_CHECKPOINT_EVERY, "").strip()
        explicit = int(text) if text else None
    if explicit is not None and int(explicit) < 1:
        raise ValueError(
            f"checkpoint every {explicit} steps: give 1 or more steps, or leave it out to let State choose"
        )
    return None if explicit is None else int(explicit)


def checkpoint_dir_from_env(explicit: str | os.PathLike | None = None) -> Path:
    if explicit is not None:
        return Path(explicit)
    return Path(os.environ.get(protocol.ENV_CHECKPOINT_DIR, DEFAULT_CHECKPOINT_DIR))


def list_checkpoints(folder: Path) -> list[tuple[int, int, Path]]:
    """Finished checkpoint files as (generation, step, path), oldest first."""
    found = []
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    for name in names:
        m = protocol.CHECKPOINT_RE.match(name)
        if m:
            found.append((int(m.group(1)), int(m.group(2)), folder / name))
    found.sort()
    return found


_HOST = socket.gethostname().replace("-", "_")


def dead_writers_files(folder: Path, names: list[str] | None = None) -> list[str]:
    """Temporary files of writers killed mid-write: at once when the writer was a process of
    this host that is gone, after TMP_MAX_AGE_S otherwise (another host's pids mean nothing here)."""
    if names is None:
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return []
    cutoff = time.time() - TMP_MAX_AGE_S
    doomed = []
    for name in names:
        if not (name.startswith(".ckpt-") and ".tmp-" in name):
            continue
        host, _, pid = name.rsplit(".tmp-", 1)[1].rpartition("-")
        if host == _HOST and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            doomed.append(name)
            continue
        try:
            if (folder / name).stat().st_mtime < cutoff:
                doomed.append(name)
        except FileNotFoundError:
            pass
    return doomed


def _remove(path: Path) -> None:
    """Delete a checkpoint file, or a sharded checkpoint's folder."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")  # workers run on Linux (PR_SET_PDEATHSIG too)


def newest_generation(folder: Path) -> int:
    """The highest generation announced in ``folder`` by a claim or a checkpoint (-1: none)."""
    newest = -1
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return -1
    for name in names:
        m = protocol.CHECKPOINT_RE.match(name) or protocol.CLAIM_RE.match(name)
        if m:
            newest = max(newest, int(m.group(1)))
    return newest


def run_base(folder: Path, run: str) -> int:
    """The generation this run's numbering starts at: above every generation in ``folder`` when
    the run first writes there, fixed from then on (the first writer's answer is kept)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"run-{''.join(c if c.isalnum() or c in '-_' else '_' for c in run)}.base"
    for _attempt in range(50):
        try:
            return int(path.read_text())
        except (FileNotFoundError, ValueError):
            pass
        newest = newest_generation(folder)
        base = (newest // protocol.GENERATION_EPOCH_STRIDE + 1) * protocol.GENERATION_EPOCH_STRIDE if newest >= 0 else 0
        tmp = folder / f".{path.name}.{os.getpid()}.tmp"
        tmp.write_text(str(base))
        try:
            os.link(tmp, path)  # atomic, and only the first writer's base counts
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    raise RuntimeError(f"cannot agree on the generation base in {folder}")


def claim_generation(folder: Path, generation: int | None) -> int:
    """Announce this group's generation in ``folder``; claim the next free one if None."""
    folder.mkdir(parents=True, exist_ok=True)
    if generation is not None:
        (folder / protocol.claim_name(generation)).touch()
        return generation
    while True:
        candidate = newest_generation(folder) + 1
        try:
            fd = os.open(folder / protocol.claim_name(candidate), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.close(fd)
        return candidate


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


#: Prefixes a wrapper adds to its module's state-dict keys: ``torch.compile``'s
#: OptimizedModule (``_orig_mod.``) and DDP (``module.``), as a checkpoint saved from the
#: wrapper itself (``compiled.state_dict()``) has them.
_WRAPPER_PREFIXES = ("_orig_mod.", "module.")


def _state_dict_owner(obj: Any) -> Any:
    """The module a wrapper trains: DDP/DataParallel keep it in ``.module``, a
    ``torch.compile``d one in ``._orig_mod`` (in any nesting). Its state dict has the plain
    names, so a checkpoint of a compiled model loads into an uncompiled one and back."""
    while True:
        name = type(obj).__name__
        if name in {"DistributedDataParallel", "DataParallel"} and getattr(obj, "module", None) is not None:
            obj = obj.module
        elif name == "OptimizedModule" and getattr(obj, "_orig_mod", None) is not None:
            obj = obj._orig_mod
        else:
            return obj


def _load_into(obj: Any, saved: Any) -> None:
    """``load_state_dict`` on the unwrapped object, with what wrappers did to a saved state
    undone: keys saved from a compiled or DDP module lose their prefix, and a GradScaler's
    empty state (saved where it was disabled, e.g. a CPU run of ``GradScaler(enabled=cuda)``)
    leaves an enabled scaler at its initial scale instead of failing the restore."""
    owner = _state_dict_owner(obj)
    if isinstance(saved, dict) and saved and hasattr(owner, "named_parameters"):
        expected = set(owner.state_dict())
        plain = saved
        for prefix in _WRAPPER_PREFIXES:  # only when the keys do not fit as they are
            if set(plain) != expected and all(isinstance(k, str) and k.startswith(prefix) for k in plain):
                plain = type(plain)((k[len(prefix) :], v) for k, v in plain.items())
        if set(plain) == expected:
            saved = plain
    if isinstance(saved, dict) and not saved and type(owner).__name__ == "GradScaler":
        return
    owner.load_state_dict(saved)


class _Snapshotter:
    """Copies a state tree to CPU tensors, reusing the buffers of the previous copy."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, Any] = {}

    def copy(self, tree: Any, path: tuple = ()) -> Any:
        import torch

        if isinstance(tree, torch.Tensor):
            buf = self._buffers.get(path)
            if buf is None or buf.shape != tree.shape or buf.dtype != tree.dtype:
                buf = torch.empty(tree.shape, dtype=tree.dtype, device="cpu")
                self._buffers[path] = buf
            buf.copy_(tree.detach())
            return buf
        if isinstance(tree, dict):
            return {k: self.copy(v, path + (k,)) for k, v in tree.items()}
        if isinstance(tree, (list, tuple)):
            copied = [self.copy(v, path + (i,)) for i, v in enumerate(tree)]
            return copied if isinstance(tree, list) else tuple(copied)
        return tree


_sampling_state: Any = None  # the State whose batch sampler sets the samples per step


def samples_per_step() -> int:
    """Samples the whole job consumes per step, as the latest State's batch sampler says (0:
    no sampler, the user may report ``samples=`` or ``tokens=`` themselves)."""
    return _sampling_state._samples_per_step if _sampling_state is not None else 0


class State:
    """What a training loop needs to survive restarts and rescales.

    ``State(model=..., optimizer=..., scheduler=..., epoch=0)``: objects with
    ``state_dict``/``load_state_dict`` are restored in place; other keyword values are kept
    in ``state.extra`` and restored by value. Construct it in every worker, after the model
    and optimizer exist and before training; it restores the latest checkpoint (all ranks
    load the same file, chosen by rank 0).
    """

    def __init__(
        self,
        model: Any = None,
        optimizer: Any = None,
        *,
        checkpoint_dir: str | os.PathLike | None = None,
        keep: int = 3,
        async_commit: bool = True,
        map_location: Any = None,
        checkpoint_every: int | None = None,
        **extra: Any,
    ) -> None:
        if keep < 1:
            raise ValueError("State(keep=...) must be at least 1: the latest checkpoint is always kept")
        self.info = WorkerInfo.from_env()
        self.folder = checkpoint_dir_from_env(checkpoint_dir)
        self.keep = keep
        self.async_commit = async_commit
        self.checkpoint_every = checkpoint_every_from_env(checkpoint_every)
        # How much commit() blocks the loop: what the automatic interval is chosen from, and
        # what the checkpoint events tell the notebook (blocked_pct).
        self._commit_ended: float | None = None  # perf_counter when the last commit() returned
        self._trained = 0.0  # loop time outside commit() since this State started
        self._blocked = 0.0  # time inside commit(), saving or not, over the same span
        self._steps_since_save = 0
        self._save_cost: float | None = None  # how long the last saving commit() blocked
        self._last_write: tuple[float, float] | None = None  # perf_counter at its start and end
        self._window = [0.0, 0.0]  # [blocked, trained] seconds since the last checkpoint event
        self._objects: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}
        for name, value in (("model", model), ("optimizer", optimizer), *extra.items()):
            if value is None:
                continue
            if hasattr(value, "state_dict") and hasattr(value, "load_state_dict"):
                self._objects[name] = value
            else:
                self.extra[name] = value
        self.step = 0  # the next step to run
        self.samples_seen = 0
        self.total: int | None = None
        self.resumed_from: Path | None = None
        self._current: int | None = None
        self._restored_step = 0
        self._restored_samples = 0
        self._samples_per_step = 0
        self._snapshotter = _Snapshotter()
        self._writer: threading.Thread | None = None
        self._writer_error: BaseException | None = None
        self._stale = False
        self._disk_full_until = 0.0  # monotonic time before which commits skip the write
        self._announced: tuple[int, float] | None = None  # (generation, monotonic time) of the last event
        self._unannounced = 0  # commits written since the last checkpoint event
        self._check_saveable()
        if self.is_writer:  # what writers killed mid-commit left behind, before it adds up
            for name in dead_writers_files(self.folder):
                _remove(self.folder / name)
        # A sharded model is written by every rank into rank 0's temporary folder: its name.
        self._sharded = sharded.is_sharded(model)
        self._writer_tag = f"{_HOST}-{os.getpid()}"
        self._pending_save: Any = None  # a non-writer rank's unfinished async sharded save
        self._save_group: Any = None  # async sharded saves talk on a group of their own
        if self._sharded:
            self._writer_tag = self._broadcast(self._writer_tag)
            self._save_group = self._group_for_saves()
        self.generation = self._agree_on_generation()
        self._restore(map_location)
        on_finish(self.flush)
        set_step_source(lambda: self.current_step)  # the failure report's step

    # -- start ---------------------------------------------------------------------------

    @property
    def is_writer(self) -> bool:
        return self.info.rank == 0

    def _dist(self) -> Any:
        if self.info.world_size <= 1:
            return None
        try:
            import torch.distributed as dist
        except ImportError:
            return None
        return dist if dist.is_available() and dist.is_initialized() else None

    def _broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank. Not ``broadcast_object_list``: it needs numpy on
        the receiving side, which torch does not depend on (nor do we)."""
        dist = self._dist()
        if dist is None:
            return value
        import pickle

        import torch

        on = device() if dist.get_backend() == "nccl" else torch.device("cpu")
        data = pickle.dumps(value) if self.is_writer else b""
        size = torch.tensor([len(data)], dtype=torch.long, device=on)
        dist.broadcast(size, src=0)
        if self.is_writer:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(on)
        else:
            buf = torch.empty(int(size.item()), dtype=torch.uint8, device=on)
        dist.broadcast(buf, src=0)
        return pickle.loads(bytes(buf.cpu().tolist()))

    def _agree_on_generation(self) -> int:
        generation = self.info.generation
        if self.is_writer:
            run = os.environ.get(protocol.ENV_RUN)
            if run and generation is not None:
                generation += run_base(self.folder, run)
            generation = claim_generation(self.folder, generation)
        elif generation is None:
            generation = -1
        return self._broadcast(generation)

    def _restore(self, map_location: Any) -> None:
        import torch

        chosen: str | None = None
        # Rank 0 chooses and tells the others (a stale group could add a file between two
        # ranks' listings); without a process group each rank chooses for itself.
        if self.is_writer or self._dist() is None:
            for _gen, _step, path in reversed(list_checkpoints(self.folder)):
                try:
                    if sharded.is_sharded_checkpoint(path) and not sharded.complete(path):
                        raise FileNotFoundError(f"{sharded.DCP_METADATA} or {sharded.META_FILE} missing")
                    payload = torch.load(_meta_path(path), map_location="cpu", weights_only=False)
                except Exception as exc:  # a torn or foreign file: fall back to the previous one
                    emit("checkpoint_unreadable", path=str(path), error=f"{type(exc).__name__}: {exc}"[:300])
                    continue
                chosen = str(path)
                break
        chosen = self._broadcast(chosen)
        if chosen is None:
            return
        if map_location is None:
            map_location = device()
        payload = torch.load(_meta_path(Path(chosen)), map_location=map_location, weights_only=False)
        in_shards = payload.get("sharded", [])
        if in_shards:  # every rank reads its part of the shards, however many ranks wrote them
            sharded.load_into(self._objects.get("model"), self._objects.get("optimizer"), Path(chosen))
        elif self._sharded:
            raise RuntimeError(
                f"{chosen} holds an unsharded model's checkpoint; State cannot load it into a sharded "
                "(FSDP/DTensor) model: start the job with --fresh, or load it before sharding the model"
            )
        for name, obj in self._objects.items():
            if name in payload.get("objects", {}) and name not in in_shards:
                _load_into(obj, payload["objects"][name])
        self.extra.update(payload.get("extra", {}))
        self.step = self._restored_step = int(payload["step"])
        self.samples_seen = self._restored_samples = int(payload.get("samples_seen", 0))
        self.resumed_from = Path(chosen)
        if self.is_writer:
            emit(
                "resumed",
                step=self.step,
                generation=self.generation,
                from_generation=int(payload.get("generation", -1)),
                from_world_size=payload.get("world_size"),
                world_size=self.info.world_size,
                samples_seen=self.samples_seen,
                path=chosen,
            )

    # -- loop ----------------------------------------------------------------------------

    def steps(self, total: int) -> Iterator[int]:
        """Yield step indices from the restored step up to ``total - 1``."""
        self.total = int(total)
        if self.is_writer:
            emit("plan", total=self.total, start=self.step, generation=self.generation)
        for step in range(self.step, self.total):
            self._current = step
            yield step
        self._current = None
        if self._sharded:  # before the cell's own destroy_process_group() ends the save's group
            self._wait_for_writer()

    @property
    def current_step(self) -> int | None:
        return self._current

    def _cursor_at(self, next_step: int) -> int:
        return self._restored_samples + (next_step - self._restored_step) * self._samples_per_step

    def batch_sampler(
        self,
        dataset_or_len: Any,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        batches_per_step: int = 1,
    ) -> Any:
        """A batch sampler whose position is part of this state (see ``ElasticBatchSampler``)."""
        from .data import ElasticBatchSampler

        sampler = ElasticBatchSampler(
            self, dataset_or_len, batch_size, shuffle=shuffle, seed=seed, batches_per_step=batches_per_step
        )
        self._samples_per_step = sampler.global_batch_size * batches_per_step
        global _sampling_state
        _sampling_state = self
        return sampler

    # -- commit --------------------------------------------------------------------------

    def commit(self, step: int | None = None) -> None:
        """Record that ``step`` (default: the current one) is done, and save from rank 0.

        Non-writer ranks only advance their counters. Raises ``StaleGenerationError`` when a
        newer worker group exists: this group must stop.
        """
        if step is None:
            if self._current is None:
                raise RuntimeError("State.commit() outside state.steps(): pass the finished step explicitly")
            step = self._current
        self.step = step + 1
        self.samples_seen = self._cursor_at(self.step)
        started = time.perf_counter()
        if self._commit_ended is not None:
            trained = started - self._commit_ended
            self._trained += trained
            self._window[1] += trained
        self._steps_since_save += 1
        saved = False
        try:
            saved = self._commit_sharded() if self._sharded else self._commit_plain()
        finally:
            self._commit_ended = ended = time.perf_counter()
            self._window[0] += ended - started
            self._blocked += ended - started
            if saved:
                self._save_cost = ended - started
                self._steps_since_save = 0

    def _due(self) -> bool:
        """Whether this commit saves: every ``checkpoint_every`` steps, or (chosen) once the loop
        has trained long enough since the last save for its cost to stay under the target."""
        if self.total is not None and self.step >= self.total:
            return True  # the last step is always saved
        if self.checkpoint_every is not None:
            return self._steps_since_save >= self.checkpoint_every
        if self._save_cost is None:
            return True
        if self._writer is not None and self._writer.is_alive():
            return False  # the last save is still being written: saving now would wait for it
        if self._last_write is not None:
            # The writer is busy at most half the time: a background write still takes a core
            # and the disk from the loop, which on a few-core machine slows every step.
            began, ended = self._last_write
            if time.perf_counter() - ended < ended - began:
                return False
        # A budget over the whole run: everything commit() blocked (saves, and the cheap commits
        # that did not save) plus the next save's expected cost stays under the target share of
        # the loop's time. A save that cost more than expected is paid back by waiting longer.
        return self._blocked + self._save_cost <= BLOCKING_TARGET * self._trained

    def _checkpoint_header(self) -> dict[str, Any]:
        """What every checkpoint says about itself, beside the objects' states."""
        return {
            "format": 1,
            "step": self.step,
            "generation": self.generation,
            "world_size": self.info.world_size,
            "samples_seen": self.samples_seen,
            "time": time.time(),
            "every": self._steps_since_save,  # steps since the previous save
        }

    def _commit_plain(self) -> bool:
        if not self.is_writer:
            return False
        if not self._due():
            self._raise_pending()
            if self._check_fence():
                raise StaleGenerationError(self._stale_message())
            return False
        self._check_saveable()
        self._raise_pending()
        self._wait_for_writer()
        self._raise_pending()
        if self._check_fence():
            raise StaleGenerationError(self._stale_message())
        if time.monotonic() < self._disk_full_until:
            return False  # the checkpoint disk is full: train on, try again later (the notebook knows)
        tree = {
            **self._checkpoint_header(),
            "objects": {name: _state_dict_owner(obj).state_dict() for name, obj in self._objects.items()},
            "extra": dict(self.extra),
        }
        if self.async_commit:
            snapshot = self._snapshotter.copy(tree)
            self._writer = threading.Thread(target=self._write_in_background, args=(snapshot,), daemon=True)
            self._writer.start()
        else:
            try:
                self._write(tree)
            except OSError as exc:
                if not self._disk_is_full(exc, tree["step"]):
                    raise
        return True

    # Rank 0's word to all ranks before a sharded commit (every rank writes, so all must agree).
    _WRITE, _SKIP, _STALE, _FAILED = range(4)

    def _commit_sharded(self) -> bool:
        verdict, error = self._WRITE, None
        if self.is_writer:
            try:
                due = self._due()
                if due:
                    self._check_saveable()
                self._raise_pending()
                if due:
                    self._wait_for_writer()
                self._raise_pending()
                if self._check_fence():
                    verdict = self._STALE
                elif not due or time.monotonic() < self._disk_full_until:
                    verdict = self._SKIP
            except StaleGenerationError:
                verdict = self._STALE
            except BaseException as exc:
                verdict, error = self._FAILED, exc
        verdict = self._broadcast_int(verdict)
        if verdict == self._STALE:
            raise StaleGenerationError(self._stale_message())
        if verdict == self._FAILED:
            if error is not None:
                raise error
            raise RuntimeError("rank 0 could not save the checkpoint (its traceback says why); this rank stops with it")
        if verdict == self._SKIP:
            return False
        if not self.is_writer:
            self._wait_for_writer()  # this rank's previous async save
        final = self.folder / protocol.checkpoint_name(self.generation, self.step, sharded=True)
        tmp = self.folder / f".{final.name}.tmp-{self._writer_tag}"
        meta = {
            **self._checkpoint_header(),
            "sharded": [n for n in ("model", "optimizer") if n in self._objects],
            "objects": {
                name: _state_dict_owner(obj).state_dict()
                for name, obj in self._objects.items()
                if name not in ("model", "optimizer")
            },
            "extra": dict(self.extra),
        }
        started = time.perf_counter()
        future = None
        try:
            if self.is_writer:
                tmp.mkdir(parents=True, exist_ok=True)
                with open(tmp / sharded.META_FILE, "wb") as f:
                    torch_save(meta, f)
            tree = sharded.state_dicts(self._objects.get("model"), self._objects.get("optimizer"))
            if self._save_group is not None:  # copied to CPU memory now, written in the background
                future = sharded.async_save(tree, tmp, self._save_group)
            if future is None:
                # Collective; when it returns on rank 0, DCP has gathered every rank's write
                # result and written its metadata: the folder is complete.
                sharded.save(tree, tmp)
                if self.is_writer:
                    self._land(tmp, final, meta["step"], started, meta["every"])
        except StaleGenerationError:
            raise
        except Exception as exc:
            if not self._sharded_save_failed(exc, meta["step"]):
                raise
        finally:
            if future is None and self.is_writer and tmp.exists():
                _remove(tmp)
        if future is not None:
            if self.is_writer:
                args = (future, tmp, final, meta["step"], started, meta["every"])
                self._writer = threading.Thread(target=self._finish_sharded_save, args=args, daemon=True)
                self._writer.start()
            else:
                self._pending_save = (future, meta["step"])
        return True

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

    def _check_saveable(self) -> None:
        """Plain values kept in the state must pickle (cheap: they are small); a class defined
        inside the training cell does not, and would fail every commit."""
        import pickle

        for name, value in self.extra.items():
            try:
                pickle.dumps(value)
            except Exception as exc:
                kind = type(value)
                where = f"{kind.__module__}.{kind.__qualname__}"
                raise StateNotSaveable(
                    f"State cannot save {name!r} (a {where}): {exc}. Define the class in an earlier "
                    "notebook cell (it ships with the job), or keep plain data (numbers, dicts, "
                    "tensors) in State"
                ) from None

    def flush(self) -> None:
        """Wait for a background write to finish; raise its error, if any."""
        self._wait_for_writer()
        self._raise_pending()

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
        if self._disk_full_until == 0.0:  # once per episode
            emit(
                "checkpoint_failed",
                error=f"{type(exc).__name__}: {exc}"[:500],
                step=step,
                disk_full=True,
                retry_s=DISK_FULL_RETRY_S,
                folder=str(self.folder),
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


def _meta_path(checkpoint: Path) -> Path:
    """The file holding a checkpoint's step, cursor and unsharded state."""
    return checkpoint / sharded.META_FILE if sharded.is_sharded_checkpoint(checkpoint) else checkpoint


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir())
    return path.stat().st_size


def torch_save(obj: Any, f: Any) -> None:
    """``torch.save`` in the legacy format (see ``State._write``), durable once it returns."""
    import torch

    torch.save(obj, f, _use_new_zipfile_serialization=False)
    f.flush()
    os.fsync(f.fileno())

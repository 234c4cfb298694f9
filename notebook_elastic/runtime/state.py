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

Its parts: a ``Restore`` and its ``Collectives`` (``restore.py``, the start), a ``SaveInterval``
(``interval.py``), a ``CheckpointWriter`` (``writer.py``), ``checkpoints.py`` (the folder),
``state_dicts.py``, ``notice.py`` (a save on notice) and ``handoff.py`` (in place). A little
over 600 lines: ``commit()``, its plain and sharded paths and the in-place vote read as one
protocol.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import suppress
from functools import partial
from pathlib import Path
from typing import Any

from ..contract import protocol
from ..contract.event_types import Kind, Plan
from ..plumbing import log
from . import inplace, sharded
from ._emit import emit
from .checkpoints import (
    _HOST,
    DEFAULT_CHECKPOINT_DIR,
    TMP_MAX_AGE_S,
    _remove,
    checkpoint_dir_from_env,
    claim_generation,
    dead_writers_files,
    list_checkpoints,
    newest_generation,
    run_base,
    torch_save,
)
from .handoff import Handoff, Updates, rng_state, to_host
from .interval import BLOCKING_TARGET, SaveInterval, checkpoint_every_from_env, is_final
from .notice import notice_board
from .restore import Collectives, Restore
from .state_dicts import _state_dict_owner
from .worker import StaleGenerationError, StateNotSaveable, WorkerInfo, on_finish, set_step_source
from .writer import CHECKPOINT_EVENT_EVERY_S, DISK_FULL_RETRY_S, CheckpointWriter, checkpoint_header, save_handed_on

_log = log.get("state")

#: Why a group formed in place read a checkpoint (in place's fallback): no rank kept the live values.
NO_LIVE_VALUES = "no rank held the live values (every node had gone or restarted at once)"

# State, and the names that were defined here before its parts moved out (still imported from here).
__all__ = [
    "BLOCKING_TARGET",
    "CHECKPOINT_EVENT_EVERY_S",
    "DEFAULT_CHECKPOINT_DIR",
    "DISK_FULL_RETRY_S",
    "TMP_MAX_AGE_S",
    "State",
    "checkpoint_dir_from_env",
    "checkpoint_every_from_env",
    "claim_generation",
    "dead_writers_files",
    "list_checkpoints",
    "newest_generation",
    "run_base",
    "samples_per_step",
    "torch_save",
]

_sampling_state: Any = None  # the State whose batch sampler sets the samples per step
_saving_state: Any = None  # the latest State made in this process: what its commits blocked


def saving_seconds() -> tuple[float, float] | None:
    """(blocked, loop) seconds of the latest State's loop (``SaveInterval.seconds``), which
    rank 0's ``report()`` sends with each metric; None without a State."""
    return _saving_state._interval.seconds() if _saving_state is not None else None


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
        checkpoint_dir: str | os.PathLike[str] | None = None,
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
        self.async_commit = async_commit
        # How often it saves, from what commit() blocks (also the checkpoint events' blocked_pct).
        self._interval = SaveInterval(checkpoint_every_from_env(checkpoint_every))
        global _saving_state
        _saving_state = self
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
        self._step_began = 0.0  # monotonic: when the step in flight (``_current``) began
        self._restored_step = 0
        self._restored_samples = 0
        self._samples_per_step = 0
        # A notice that a node is to go (runtime/notice.py): rank 0 polls (one board a process).
        self._notice = notice_board()
        self._notice_now: dict[str, Any] | None = None  # the notice this commit answers
        self._holding: dict[str, Any] | None = None  # answered: steps() waits before the next step
        self._check_saveable()
        if self.is_writer:  # what writers killed mid-commit left behind, before it adds up
            for name in dead_writers_files(self.folder):
                _remove(self.folder / name)
        # Collectives, in the same order on every rank: the sharded model's temporary folder
        # name (every rank writes into rank 0's), its save group, then the generation.
        self._collectives = Collectives(self.info)
        self._sharded = sharded.is_sharded(model)
        # In place (runtime/inplace.py): the group may change under this process at a step
        # boundary; this State then hands its values to the next one, not to disk.
        self._inplace = inplace.machinery()
        self._updates = Updates(self._inplace.handoff)  # the optimizer's updates: which step, how many
        self._switch_due = False  # the vote said: every rank leaves this group after this step
        self._all_leave = False  # ... and every rank's node goes (a stop): save at the boundary
        self._voted_leaving = False  # this rank's own node was going when it voted
        self._saver: int | None = None  # the lowest rank that stayed at the last vote (see _vote)
        self._saving_alone = False  # the commit under way is that rank's save, rank 0 or not
        self._leaving_save = False  # the commit under way is that save
        self._voting = False  # an optimizer of this State votes before each step
        self._hooks: list[Any] = []  # the optimizer hooks' handles
        self._writer_tag = f"{_HOST}-{os.getpid()}"
        self._save_group: Any = None  # async sharded saves talk on a group of their own
        if self._sharded:
            self._writer_tag = self._collectives.broadcast(self._writer_tag)
            self._save_group = self._collectives.group_for_saves(async_commit)
        self._restore = Restore(self.info, self.folder, self._collectives)
        self.generation = self._restore.agree_on_generation()
        # Fenced by the generation, so made once it is agreed.
        self._writer = CheckpointWriter(
            self.folder, generation=self.generation, keep=keep, info=self.info, interval=self._interval, loop=self
        )
        resumed = None
        why = None
        if self._inplace.group.assignment is not None and not self._sharded:
            # Formed in place: the live values; why a checkpoint instead, said but in a run's first group
            resumed = self._restore.from_live(self._inplace, self._objects)
            first = self.info.restart_count == 0 and os.environ.get(protocol.ENV_ROUND, "0") == "0"
            why = None if first else NO_LIVE_VALUES
        if resumed is None:
            resumed = self._restore.latest(
                self._objects,
                sharded_model=self._sharded,
                generation=self.generation,
                map_location=map_location,
                why=why,
            )
        if resumed is not None:
            self.extra.update(resumed.extra)
            self.step = self._restored_step = resumed.step
            self.samples_seen = self._restored_samples = resumed.samples_seen
            self.resumed_from = resumed.path
            self._interval.expect_save_cost(resumed.save_s)
        on_finish(self.flush)
        set_step_source(lambda: self.current_step)  # the failure report's step
        if self.is_writer:
            self._notice.start(self)
        self._join_in_place()

    def _join_in_place(self) -> None:
        """Under an agent that keeps workers in place: this State is the one a change hands
        on from, its optimizers vote before each step, and the agent hears whether this worker
        can stay (a sharded model cannot: its shards would need resharding from disk)."""
        machinery = self._inplace
        if not machinery.active:
            return
        machinery.state = self
        why = machinery.incapable or sharded.why_not_in_place(self._sharded, self._objects.values())
        machinery.incapable = why or inplace.torch_lacks()
        self._check_own_groups()
        machinery.say(machinery.incapable is None, machinery.incapable or "")
        import torch

        for obj in self._objects.values():
            # (A torch without step hooks was said above: its workers restart at a change.)
            if isinstance(obj, torch.optim.Optimizer) and hasattr(obj, "register_step_pre_hook"):
                self._hooks.append(obj.register_step_pre_hook(self._vote))
                self._hooks.append(obj.register_step_post_hook(self._stepped))
                self._voting = True

    def _check_own_groups(self) -> None:
        """A cell that made process groups of its own cannot stay in place (they hold the old
        members): said to the agent once, as soon as it is seen."""
        machinery = self._inplace
        if machinery.incapable is None and self._collectives.dist() is not None:
            if inplace.own_groups(ours=1 if self._save_group is not None else 0):
                machinery.incapable = "the cell made process groups of its own (they hold the old members)"
                machinery.say(False, machinery.incapable)

    def _vote(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Before an optimizer step: is a change pending on any rank? Every rank learns it at
        the same step, and all leave the group at the boundary after it. A vote that fails (a
        peer gone mid-step) raises: this step is not applied here, and is redone."""
        self._voted_leaving = self._inplace.leaving
        pending, leaving = self._collectives.all_reduce(
            [self._inplace.vote_flag(), 1 if self._voted_leaving else 0], "sum"
        )
        if pending:
            self._switch_due = True
            self._all_leave = leaving >= self.info.world_size
            if not self._all_leave and not self._sharded:
                # Who saves if the ranks that stay are told to go too before their next group
                # forms (a gang eviction's SIGTERMs a moment apart): the lowest of them.
                world = self.info.world_size
                [self._saver] = self._collectives.all_reduce([world if self._voted_leaving else self.info.rank], "min")

    def _save_before_leaving(self, done: int | None = None) -> None:
        """Every rank leaves at this boundary and no node stays: the step just committed is
        saved (a collective for a sharded model: every rank is here), so a resume loses none.
        ``done``: the last step the values hold, where the optimizer updated one not committed."""
        self._leaving_save = True
        try:
            self.commit(self.step - 1 if done is None else done)
            self._writer.wait()
        finally:
            self._leaving_save = False

    def save_leaving_between_groups(self, broken: bool = False) -> None:
        """This State's group ended at a boundary where some nodes left and this rank's stayed,
        and its node was told to go before the next group formed: the lowest staying rank of the
        vote saves the step committed there, alone (no collective; a sharded state cannot, said);
        ``broken``: the group broke as all went (no vote to save at): its writer saves, if need be."""
        if (not self.is_writer if broken else self._saver != self.info.rank) or (
            broken and any(s == self.step for _g, s, _p in list_checkpoints(self.folder))  # the writer alone looks
        ):
            return
        if self._sharded:
            _log.warning("left between groups: a sharded state cannot be saved without its group")
            return
        applied, done = self._updates.step, None
        if broken and applied is not None and applied >= self.step:  # updated past its last commit
            if partly := self._updates.partly(applied):
                _log.warning("left between groups: %s; nothing saved", partly)
                return
            done = applied
        self._saving_alone = True
        try:
            self._save_before_leaving(done)
        except Exception:
            _log.warning("left between groups: the save at step %s failed", self.step, exc_info=True)
        finally:
            self._saving_alone = False

    def notice_needs_no_save(self, notice: dict[str, Any]) -> int | None:
        """The steps done, where a notice needs no save (rank 0's notice board asks); else None."""
        return self.step if self.is_writer and self._inplace.keeps_values_without(notice) else None

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._updates.applied(self._current)

    def handoff(self) -> Handoff:
        """What the next State in this process starts from when the group changes in place."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        next_step, applied = self.step, self._updates.step
        if applied is not None and applied + 1 > next_step:
            next_step = applied + 1  # updated by the optimizer, not yet committed
        reached = max(next_step, (self._current + 1) if self._current is not None else next_step)
        writes = not self._sharded and (self._saver == self.info.rank if self._saver is not None else self.is_writer)
        where: dict[str, Any] = {"folder": self.folder, "generation": self.generation, "keep": self._writer.keep}
        where.update(info=self.info, interval=self._interval, total=self.total)  # where and how it saved
        states = {name: to_host(_state_dict_owner(obj).state_dict()) for name, obj in self._objects.items()}
        with suppress(Exception):  # a background save of this group lands first (a failure said its own)
            self._writer.wait()
        return Handoff(
            states=states,
            extra=dict(self.extra),
            next_step=next_step,
            reached=reached,
            samples_seen=self._cursor_at(next_step),
            rng=rng_state(),
            save=None if self._sharded else partial(save_handed_on, **where),
            writes=writes,
            partly=None if self._current is None or self.step > self._current else self._updates.partly(self._current),
            updates_per_step=self._updates.per_step,
        )

    # -- start ---------------------------------------------------------------------------

    @property
    def is_writer(self) -> bool:
        return self.info.rank == 0

    @property
    def keep(self) -> int:
        """How many checkpoints the folder keeps (``State(keep=...)``)."""
        return self._writer.keep

    @keep.setter
    def keep(self, value: int) -> None:
        self._writer.keep = value

    @property
    def checkpoint_every(self) -> int | None:
        """Save every this many steps; None: State chooses (``State(checkpoint_every=...)``)."""
        return self._interval.checkpoint_every

    @checkpoint_every.setter
    def checkpoint_every(self, value: int | None) -> None:
        self._interval.checkpoint_every = value

    # -- loop ----------------------------------------------------------------------------

    def steps(self, total: int) -> Iterator[int]:
        """Yield step indices from the restored step up to ``total - 1``."""
        self.total = int(total)
        if self.is_writer:
            emit(Kind.PLAN, **Plan(total=self.total, start=self.step, generation=self.generation))
        self._interval.loop_started()
        watching = self._inplace.active
        for step in range(self.step, self.total):
            self._updates.step_ended(self._current)
            if watching:
                self._check_own_groups()
                if self._switch_due or (not self._voting and self._inplace.vote_flag()):
                    if self._all_leave:  # the whole job goes (a stop): nothing stays to keep the values
                        self._save_before_leaving()
                    elif self._inplace.leaving and not self._voted_leaving:
                        # Told its node goes after the vote (a gang eviction's SIGTERMs a moment
                        # apart): whether the rest stay is not known here.
                        self.save_leaving_between_groups()
                    raise inplace.MembershipChange(f"the job's members change before step {step}")
            if self._holding is not None:  # saved on notice: the step's report went out; wait here
                notice, self._holding = self._holding, None
                self._notice.hold(notice)
            self._current = step
            self._step_began = time.monotonic()
            yield step
        self._current = None
        if self._sharded:  # before the cell's own destroy_process_group() ends the save's group
            self._writer.wait()

    @property
    def current_step(self) -> int | None:
        return self._current

    def stood_since(self, now: float) -> float:
        """When training last moved here: the step in flight's start (it broke or hung), else ``now``."""
        in_flight = self._current is not None and self.step <= self._current
        return min(now, self._step_began) if in_flight and self._step_began else now

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
        started = self._interval.commit_started()
        saved = False
        self._notice_now = notice = self._notice.pending() if self.is_writer else None
        if notice is not None and self._inplace.keeps_values_without(notice):
            self._notice.kept_in_place(notice, self.step)  # the node leaves in place: nothing to save
            self._notice_now = notice = None
        try:
            saved = self._commit_sharded() if self._sharded else self._commit_plain()
            if notice is not None:  # the node may go once answered: the write must be done
                saved = self._notice.saved(notice, self.step, saved and self._writer.on_disk())
        finally:
            self._notice_now = None
            self._interval.commit_ended(started, saved)
        if notice is not None and saved and not self._inplace.active:
            # steps() holds before the next step: nothing after it is redone by the restart.
            # In place there is no restart to wait for: the node leaves at the boundary the
            # vote agrees on, and a hold here would stall the others mid-step until it gave up.
            self._holding = notice

    def _due(self) -> bool:
        """Whether this commit saves: the loop's last step and a notice always do (runtime/notice.py:
        save before the node goes); otherwise the interval says."""
        return self._must_save() or self._interval.due(self._writer)

    def _must_save(self) -> bool:
        """This commit saves even while a full disk pauses saving: the loop's last step, or a
        notice that the node is to go."""
        return self._final() or self._notice_now is not None or self._leaving_save

    def _final(self, step: int | None = None) -> bool:
        """Whether ``step`` (default: the step just committed) is the loop's last: its save is
        tried even while a full disk pauses saving (the README's promise: the last step is saved)."""
        return is_final(self.step if step is None else step, self.total)

    def _checkpoint_header(self) -> dict[str, Any]:
        """What every checkpoint says about itself, beside the objects' states (runtime/writer.py)."""
        at = {"step": self.step, "generation": self.generation, "world_size": self.info.world_size}
        return checkpoint_header(**at, samples_seen=self.samples_seen, interval=self._interval)

    def _commit_plain(self) -> bool:
        if not (self.is_writer or self._saving_alone):
            return False
        writer = self._writer
        if not self._due():
            writer.raise_pending()
            if writer.check_fence():
                raise StaleGenerationError(writer.stale_message())
            return False
        self._check_saveable()
        writer.raise_pending()
        writer.wait()
        writer.raise_pending()
        if writer.check_fence():
            raise StaleGenerationError(writer.stale_message())
        if writer.saving_paused() and not self._must_save():
            return False  # the checkpoint disk is full: train on, try again later (the notebook knows)
        tree = {
            **self._checkpoint_header(),
            "objects": {name: _state_dict_owner(obj).state_dict() for name, obj in self._objects.items()},
            "extra": dict(self.extra),
        }
        if self.async_commit:
            writer.write_in_background(tree)
        else:
            writer.write(tree)
        return True

    # Rank 0's word to all ranks before a sharded commit (every rank writes, so all must agree).
    _WRITE, _SKIP, _STALE, _FAILED, _UNSAVEABLE = range(5)

    def _commit_sharded(self) -> bool:
        writer = self._writer
        verdict = self._WRITE
        error: BaseException | None = None  # rank 0's, raised on rank 0 after every rank heard
        if self.is_writer:
            try:
                due = self._due()
                if due:
                    self._check_saveable()
                writer.raise_pending()
                if due:
                    writer.wait()
                writer.raise_pending()
                if writer.check_fence():
                    verdict = self._STALE
                elif not due or (writer.saving_paused() and not self._must_save()):
                    verdict = self._SKIP
            except StaleGenerationError:
                verdict = self._STALE
            except StateNotSaveable as exc:
                verdict, error = self._UNSAVEABLE, exc
            except BaseException as exc:
                verdict, error = self._FAILED, exc
        verdict = self._collectives.broadcast_int(verdict)
        if verdict == self._STALE:
            raise StaleGenerationError(writer.stale_message())
        if verdict == self._UNSAVEABLE:
            # Every rank stops the same way, so every node's agent stops instead of retrying.
            message = self._collectives.broadcast_text(str(error) if error is not None else "")
            raise error if error is not None else StateNotSaveable(message)
        if verdict == self._FAILED:
            if error is not None:
                raise error
            raise RuntimeError("rank 0 could not save the checkpoint (its traceback says why); this rank stops with it")
        if verdict == self._SKIP:
            return False
        if not self.is_writer:
            writer.wait()  # this rank's previous async save
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
                    writer.land(tmp, final, meta["step"], started, meta["every"])
        except StaleGenerationError:
            raise
        except Exception as exc:
            if not writer.sharded_save_failed(exc, meta["step"]):
                raise
        finally:
            if future is None and self.is_writer and tmp.exists():
                _remove(tmp)
        if future is not None:
            if self.is_writer:
                writer.finish_in_background(future, tmp, final, meta["step"], started, meta["every"])
            else:
                writer.pending(future, meta["step"])
        return True

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
        self._writer.wait()
        self._writer.raise_pending()

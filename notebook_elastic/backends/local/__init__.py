"""The local backend: elastic torchrun jobs on this machine, no cluster needed.

Each job gets a folder (``notebook_elastic.jobfolder``) and a detached supervisor process
(``notebook_elastic.supervisor``) with a guardian beside it (``guardian.py``); this class only
writes folders, starts supervisors and talks to them, so any kernel (including one started after
a crash) can list, follow (``jobfolder/follow.py``), scale and stop any job.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ... import defaults
from ...contract import protocol
from ...contract.event_types import FINAL_STATUSES
from ...contract.events import Event
from ...contract.plan import launch_plan, rdzv_id
from ...contract.protocol import ENV_POOL
from ...errors import BackendError, JobNotFound
from ...jobfolder import control
from ...jobfolder.folder import (
    FILE_MODE,
    JobFolder,
    jobs_root,
    make_private_dir,
    pool_log,
    prepare_jobs_root,
    write_json_atomic,
)
from ...jobfolder.follow import (
    FOLDER_GONE_WAIT_S,
    FOLLOW_POLL_S,
    LOST_FOLDER,
    SUPERVISOR_START_TIMEOUT_S,
    FollowedHistory,
)
from ...jobfolder.follow import follow as _follow_folder
from ...jobfolder.follow import history as _folder_history
from ...jobfolder.place import local_place, visible_gpus
from ...jobfolder.processes import kill_all, processes_of
from ...jobfolder.record import read_record, record_stopped, resuming
from ...pool import ensure_pool, through_pool
from ..base import Backend, DrillAnswer, DryRun, JobInfo, RangeAnswer, ScaleAnswer

if TYPE_CHECKING:
    from ...contract.spec import JobSpec
    from ...packaging import Bundle

#: How long a resume, or a launch over an earlier run's folder, waits for what is left of that
#: run to end once told to (a Slurm job's nodes end at Slurm's SIGTERM: their store went with
#: their supervisor).
LEFTOVERS_WAIT_S = 30.0
#: The job's processes the kernel starts, each detached: the supervisor (supervisor/run.py) and
#: the guardian that brings it back (guardian.py).
SUPERVISOR_MODULE = "notebook_elastic.supervisor.run"
GUARDIAN_MODULE = "notebook_elastic.backends.local.guardian"


@dataclass(frozen=True)
class FolderRequest:
    """What a job in a folder (local, Slurm) would be: its folder, the files written there (their
    sizes), the nodes started first, the launch plan as the dry-run shows it (``Plan.as_dict``:
    the secret environment values hidden), the workers' working directory; on Slurm, each
    node's ``srun``."""

    folder: str
    files: dict[str, int]
    nodes: int
    plan: dict[str, Any]
    working_directory: str
    srun: str | None = None


class LocalBackend(Backend):
    name = "local"

    def __init__(
        self, home: str | os.PathLike[str] | None = None, *, slurm_state: Callable[[str], str] | None = None
    ) -> None:
        # ``home`` (tests, tools) names the jobs folder itself; by default it is found under
        # $NOTEBOOK_ELASTIC_HOME, in a per-user subfolder when that is a shared one like /tmp.
        # ``slurm_state``: how a remote supervisor's allocation is looked up (JobFolder's).
        self.explicit_root = home is not None
        self.home = defaults.home() if home is None else Path(home).parent
        self.root = jobs_root(self.home) if home is None else Path(home)
        self.slurm_state = slurm_state

    def folder(self, name: str) -> JobFolder:
        return JobFolder(self.root / name, self._runs_elsewhere)

    def _runs_elsewhere(self, info: dict[str, Any]) -> bool | None:
        """Whether a supervisor on another machine runs: a Slurm job's, by its allocation."""
        from ..slurm.cluster import supervisor_runs  # the Slurm backend builds on this one

        return supervisor_runs(info, self.slurm_state)

    def history(self, name: str) -> Iterator[Event]:
        return _folder_history(self.folder(name))

    def follow(self, name: str, stop: threading.Event) -> FollowedHistory:
        return _follow_folder(self.folder(name), stop)

    # -- submit --------------------------------------------------------------------------

    def submit_dryrun(self, spec: JobSpec, bundle: Bundle) -> DryRun:
        folder = self.folder(spec.name)
        place = local_place(spec, folder, gpus=visible_gpus())
        plan = launch_plan(spec, place, rdzv_id=rdzv_id(spec.name, "<run>", 0))  # refuses a range the GPUs cannot hold
        request = FolderRequest(
            folder=str(folder.path),
            files={"script.py": len(bundle.script.encode()), "script.payload.pkl": len(bundle.payload)},
            nodes=spec.initial_nodes,
            plan=plan.as_dict(),
            working_directory=spec.backend_options.get("cwd") or os.getcwd(),
        )
        text = "\n".join(
            [
                f"local backend: job folder {folder.path}",
                f"  a supervisor hosts the rendezvous store and starts {spec.initial_nodes} agent(s):",
                plan.text(),
                f"  checkpoints: {plan.env[protocol.ENV_CHECKPOINT_DIR]}",
                f"  working directory of the workers: {request.working_directory} (the notebook's folder, on "
                "their path: relative paths and the notebook's own modules resolve as in the notebook)",
            ]
        )
        return DryRun("local", spec, bundle, request, text)

    def schedule(self, dryrun: DryRun) -> None:
        spec, bundle = dryrun.spec, dryrun.bundle
        # Refuses a home another user could write before anything is written or started.
        if self.explicit_root:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            make_private_dir(self.root)
        else:
            self.root = prepare_jobs_root(self.home)
        folder = self.folder(spec.name)
        if folder.path.exists():
            info = self.describe(spec.name)
            if info is not None and info.status not in (*FINAL_STATUSES, "lost", "damaged"):
                raise BackendError(
                    f"a job named {spec.name!r} is already {info.status}; stop it first "
                    f"(%elastic_stop {spec.name}) or choose another --name"
                )
            # The folder goes to the history: what its run still holds outside its folder (a
            # lost Slurm job's allocations) goes first, whichever backend the new job runs in;
            # then nothing of it may run here.
            try:
                earlier: dict[str, Any] | None = folder.spec()
            except (OSError, ValueError):
                earlier = None
            self._clear_leftovers(folder, earlier, wait_s=LEFTOVERS_WAIT_S)
            _nothing_of_it_runs(folder, spec.name, info)
            self._archive(folder)
        try:
            make_private_dir(folder.path)
            make_private_dir(folder.logs)
            script_path, payload_path = bundle.write(folder.script, private=True)
            # What was packaged, hashed from memory (not re-read from disk): the supervisor runs
            # these files and nothing else.
            files_sha256 = {str(script_path): hashlib.sha256(bundle.script.encode()).hexdigest()}
            if payload_path is not None:
                files_sha256[str(payload_path)] = hashlib.sha256(bundle.payload).hexdigest()
            # The --env values and the launched files' sha256 in one 0600 file the supervisor (and
            # a resumed one) reads; spec.json, which tools and the jobs routes read, names the
            # variables only.
            write_json_atomic(folder.secret_file, {"env": spec.env, "files_sha256": files_sha256})
            spec_json = spec.to_json()
            spec_json.setdefault("backend_options", {})["cwd"] = spec.backend_options.get("cwd") or os.getcwd()
            write_json_atomic(folder.spec_file, spec_json)
            write_json_atomic(folder.manifest_file, bundle.manifest.to_json())
            os.close(os.open(folder.events_file, os.O_WRONLY | os.O_CREAT, FILE_MODE))
        except OSError as exc:
            shutil.rmtree(folder.path, ignore_errors=True)  # no half-written job left behind
            raise BackendError(
                f"cannot write the job folder {folder.path} ({exc.strerror}); free space there, or set "
                "NOTEBOOK_ELASTIC_HOME to a folder on another disk"
            ) from None
        self._start_supervisor(folder, spec.name)

    def _start_supervisor(self, folder: JobFolder, name: str, *, resume: bool = False) -> None:
        env = dict(os.environ)
        warm_pool = ensure_pool(
            env, pool_log(self.root)
        )  # the job's processes are forked from it (started now if none runs)
        if warm_pool:
            env[ENV_POOL] = warm_pool
        env[protocol.ENV_JOB_DIR] = str(folder.path)
        _detach(folder, env, SUPERVISOR_MODULE, *(["--resume"] if resume else []))
        _detach(folder, env, GUARDIAN_MODULE)  # one per folder: where one runs, this one exits (guardian.py)
        waited = folder.wait_for_supervisor(SUPERVISOR_START_TIMEOUT_S, or_end=not resume)
        if waited == "ended":
            # Stopped while it started (the CLI, another kernel): its supervisor sees the end the
            # stop wrote and starts nothing (supervisor/run.py); its guardian, which waits for a
            # supervisor still starting, goes too.
            kill_all(folder.path)
            raise BackendError(f"job {name!r} was stopped before its supervisor started; nothing of it runs")
        if waited == "late":
            kill_all(folder.path)
            raise BackendError(f"the supervisor of job {name!r} did not start: {_tail(folder.supervisor_log)}")

    def resume(self, name: str, *, guarded: bool = False) -> None:
        """Continue a lost, failed or stopped job in its folder, from its latest checkpoint.

        The history stays (events, logs, checkpoints); a new supervisor takes over with the
        same spec, in a rendezvous epoch above every checkpoint's, and the restart budget
        starts again (said in the ``job_resumed`` event). In order: the folder's lock (one
        resume at a time), its record (may it resume?), what the earlier run holds outside its
        folder (this backend's part, handed in), the folder made ready (all four in
        jobfolder/record.py's ``resuming``), the new supervisor."""
        folder = self.folder(name)
        leftovers = functools.partial(self._clear_leftovers, folder, wait_s=LEFTOVERS_WAIT_S)
        with resuming(folder, name, leftovers, guarded=guarded):
            self._start_supervisor(folder, name, resume=True)

    def _clear_leftovers(self, folder: JobFolder, spec: Mapping[str, Any] | None, wait_s: float = 0.0) -> None:
        """End what the earlier run of the job in ``folder`` still holds outside its folder's
        processes, before a resume or before its folder is archived; wait up to ``wait_s`` for it
        to end. ``spec``: the folder's spec as the caller read it (None: it could not be read).
        A local job holds nothing more (``kill_all`` ends its processes); a folder a Slurm job
        ran in may hold allocations (a local launch of its name replaces it), by its mark."""
        if spec is not None and spec.get("backend") == "slurm":
            from ..slurm.mark import clear_leftovers

            clear_leftovers(folder, spec, wait_s)

    def _archive(self, folder: JobFolder) -> None:
        history = self.root / ".history"
        make_private_dir(history)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = history / f"{folder.name}-{stamp}"
        n = 1
        while target.exists():
            target = history / f"{folder.name}-{stamp}-{n}"
            n += 1
        shutil.move(str(folder.path), str(target))

    # -- query ---------------------------------------------------------------------------

    def describe(self, name: str) -> JobInfo | None:
        folder = self.folder(name)
        record = read_record(folder)
        if record is None:
            return None
        return JobInfo(
            name=name,
            backend=record.backend,
            status=record.status,
            summary=record.summary,
            notebook=record.notebook,
            created=record.created,
            location=str(folder.path),
            damaged=record.damaged,
        )

    def list(self) -> list[JobInfo]:
        if not self.root.is_dir():
            return []
        out = []
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            try:
                info = self.describe(entry.name)
            except Exception as exc:  # one damaged folder must not hide the others
                info = JobInfo(entry.name, "local", "damaged", location=str(entry), damaged=str(exc))
            if info is not None:
                out.append(info)
        return out

    def script(self, name: str) -> str | None:
        try:
            return self.folder(name).script.read_text()
        except FileNotFoundError:
            return None

    # -- control -------------------------------------------------------------------------

    def _request(self, name: str, command: str, **args: Any) -> dict[str, Any]:
        folder = self.folder(name)
        if not folder.exists():
            raise JobNotFound(f"no local job named {name!r} (see %elastic_jobs)")
        info = folder.supervisor()
        if info is None or info.get("exited") or not folder.supervisor_alive():
            raise BackendError(f"job {name!r} is not running, so it cannot {command.replace('_', ' ')}")
        reply = control.request(tuple(info["control"]), bytes.fromhex(info["authkey"]), command, **args)
        if not isinstance(reply, dict):
            raise BackendError(f"job {name!r}'s supervisor answered {command!r} with {reply!r}, not a record")
        return reply  # what the supervisor's command answered (commands.py: a dict each)

    def scale(self, name: str, nodes: int) -> ScaleAnswer:
        reply = self._request(name, "scale", nodes=nodes)
        return ScaleAnswer(target=int(reply["target"]))

    def set_range(self, name: str, min_nodes: int, max_nodes: int) -> RangeAnswer:
        reply = self._request(name, "set_range", min_nodes=min_nodes, max_nodes=max_nodes)
        return RangeAnswer(target=int(reply["target"]), reconfigured=bool(reply["reconfigured"]))

    def inject(
        self,
        name: str,
        fault: str,
        target: int | str | None = None,
        *,
        return_after_s: float | None = None,
        grace_s: float | None = None,
    ) -> DrillAnswer:
        if fault == "kill_worker":
            reply = self._request(name, "kill_worker", rank=target)
        elif fault == "preempt_node":
            reply = self._request(name, fault, node=target, return_after_s=return_after_s, grace_s=grace_s)
        elif fault == "lose_node":
            reply = self._request(name, fault, node=target)
        else:
            raise BackendError(f"unknown fault {fault!r}: use kill_worker, preempt_node or lose_node")
        return DrillAnswer(
            node=_optional(reply, "node", str),
            rank=_optional(reply, "rank", int),
            pid=_optional(reply, "pid", int),
            target=_optional(reply, "target", int),
            grace_s=_optional(reply, "grace_s", float),
        )

    def cancel(self, name: str, timeout_s: float = 30.0) -> None:
        folder = self.folder(name)
        if not folder.exists():
            # Its folder may have been deleted under it: its processes still carry its path.
            if kill_all(folder.path):
                return
            raise JobNotFound(f"no local job named {name!r} (see %elastic_jobs)")
        announced, done = folder.supervisor_alive(), folder.ended()
        if done and not announced:
            kill_all(folder.path)  # finished: only make sure nothing is left
            return
        # No supervisor announced: one may be starting (on Slurm, its allocation granted). Its
        # start and this stop take turns (JobFolder.hold_start): it has announced itself by the
        # time this holds the lock, or it sees the end written here and starts nothing.
        start_lock = None if announced else folder.hold_start(SUPERVISOR_START_TIMEOUT_S)
        try:
            if folder.supervisor_alive():
                answered = True
                try:
                    self._request(name, "stop")
                except control.NoAnswer:
                    answered = False  # frozen or wedged: it will not stop by itself, end it from here
                except BackendError:
                    pass
                deadline = time.monotonic() + timeout_s
                while answered and folder.supervisor_alive() and time.monotonic() < deadline:
                    time.sleep(0.05)
            if folder.supervisor_alive() or not folder.ended():
                # The supervisor is gone or stuck: clean up from here, and say so where it would have.
                kill_all(folder.path)
                record_stopped(folder, "stopped; its supervisor did not answer")
        finally:
            if start_lock is not None:
                os.close(start_lock)


def _nothing_of_it_runs(folder: JobFolder, name: str, info: JobInfo | None) -> None:
    """Before a job's folder is archived for a new job of its name: whatever of the old job
    still runs would go on writing into the new job's folder (its processes carry the same
    path; an old supervisor wrote the new job's outcome, #37). Its records may be damaged or
    say it is lost while it runs, so its processes are looked for, not its records: an ended
    job's stragglers are ended; a job not ended on record is refused, in one sentence."""
    live = processes_of(folder.path)
    if not live:
        return
    if folder.ended():
        kill_all(folder.path)
        return
    said = f"its folder is damaged ({info.damaged})" if info is not None and info.damaged else None
    said = said or f"it is listed as {info.status if info is not None else 'gone'}"
    raise BackendError(
        f"a job named {name!r} still has {len(live)} process(es) running, though {said}; stop it first "
        f"(%elastic_stop {name}, or notebook-elastic stop {name}) or choose another --name"
    )


def _detach(folder: JobFolder, env: dict[str, str], module: str, *options: str) -> None:
    """Start ``python -m MODULE --detach [options] FOLDER`` in a
    session of its own, logging to supervisor.log; returns once its short-lived parent exited."""
    log = os.open(folder.supervisor_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    base = [sys.executable, "-m", module]
    # The supervisor is forked by the warm pool when there is one; its launcher detaches instead.
    pooled = through_pool([*base, *options], env, detach=True) if module == SUPERVISOR_MODULE else None
    command = pooled or [*base, "--detach", *options]
    try:
        parent = subprocess.Popen(
            [*command, str(folder.path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(folder.path),
            start_new_session=True,
        )
    finally:
        os.close(log)
    try:
        parent.wait(SUPERVISOR_START_TIMEOUT_S)  # the detaching parent exits at once (a stopped one never)
    except subprocess.TimeoutExpired:
        parent.kill()
        parent.wait()
        raise BackendError(
            f"the {'supervisor' if module == SUPERVISOR_MODULE else 'guardian'} of job {folder.name!r} did not start within "
            f"{SUPERVISOR_START_TIMEOUT_S:.0f} s: {_tail(folder.supervisor_log)}"
        ) from None


_T = TypeVar("_T")


def _optional(reply: Mapping[str, Any], key: str, kind: Callable[[Any], _T]) -> _T | None:
    """``reply[key]`` as ``kind`` (a JSON reply's number may come as an int or a float), None when absent."""
    value = reply.get(key)
    return None if value is None else kind(value)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(empty log)"


# FOLDER_GONE_WAIT_S, FOLLOW_POLL_S, LOST_FOLDER: defined here before jobfolder/follow.py, still imported from here.
__all__ = ["FOLDER_GONE_WAIT_S", "FOLLOW_POLL_S", "LOST_FOLDER", "JobFolder", "LocalBackend"]

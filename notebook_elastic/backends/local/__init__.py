"""The local backend: elastic torchrun jobs on this machine, no cluster needed.

Each job gets a folder (``notebook_elastic.jobfolder``) and a detached supervisor process
(``notebook_elastic.supervisor``) with a guardian beside it (``guardian.py``); this class only
writes folders, starts supervisors and talks to them, so any kernel (including one started after
a crash) can list, follow (``jobfolder/follow.py``), scale and stop any job.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ... import defaults
from ...contract.events import FINAL_STATUSES, Event, Kind, status_phrase
from ...contract.plan import launch_plan, rdzv_id
from ...errors import BackendError, JobNotFound
from ...jobfolder import control
from ...jobfolder.folder import (
    FILE_MODE,
    JobFolder,
    jobs_root,
    kill_all,
    make_private_dir,
    pool_log,
    prepare_jobs_root,
    write_json_atomic,
)
from ...jobfolder.follow import (
    FOLDER_GONE_WAIT_S,
    FOLLOW_POLL_S,
    LOST_FOLDER,
    LOST_SUPERVISOR,
    SUPERVISOR_START_TIMEOUT_S,
    FollowedHistory,
    _append_event,
)
from ...jobfolder.follow import follow as _follow_folder
from ...jobfolder.follow import history as _folder_history
from ...jobfolder.place import local_place, visible_gpus
from ...pool import ENV_POOL, ensure_pool, through_pool
from ...runtime import protocol
from ..base import Backend, DryRun, JobInfo

RESUMABLE_STATUSES = ("lost", "failed", "stopped")
#: The job's processes the kernel starts, each detached: the supervisor (supervisor/run.py) and
#: the guardian that brings it back (guardian.py).
SUPERVISOR_MODULE = "notebook_elastic.supervisor.run"
GUARDIAN_MODULE = "notebook_elastic.backends.local.guardian"


class LocalBackend(Backend):
    name = "local"

    def __init__(self, home: str | os.PathLike[str] | None = None) -> None:
        # ``home`` (tests, tools) names the jobs folder itself; by default it is found under
        # $NOTEBOOK_ELASTIC_HOME, in a per-user subfolder when that is a shared one like /tmp.
        self.explicit_root = home is not None
        self.home = defaults.home() if home is None else Path(home).parent
        self.root = jobs_root(self.home) if home is None else Path(home)

    def folder(self, name: str) -> JobFolder:
        return JobFolder(self.root / name)

    def history(self, name: str) -> Iterator[Event]:
        return _folder_history(self.folder(name))

    def follow(self, name: str, stop: threading.Event) -> FollowedHistory:
        return _follow_folder(self.folder(name), stop)

    # -- submit --------------------------------------------------------------------------

    def submit_dryrun(self, spec: Any, bundle: Any) -> DryRun:
        folder = self.folder(spec.name)
        place = local_place(spec, folder, gpus=visible_gpus())
        plan = launch_plan(spec, place, rdzv_id=rdzv_id(spec.name, "<run>", 0))  # refuses a range the GPUs cannot hold
        request = {
            "folder": str(folder.path),
            "files": {"script.py": len(bundle.script.encode()), "script.payload.pkl": len(bundle.payload)},
            "nodes": spec.initial_nodes,
            "plan": plan.as_dict(),
            "working_directory": spec.backend_options.get("cwd") or os.getcwd(),
        }
        text = "\n".join(
            [
                f"local backend: job folder {folder.path}",
                f"  a supervisor hosts the rendezvous store and starts {spec.initial_nodes} agent(s):",
                plan.text(),
                f"  checkpoints: {plan.env[protocol.ENV_CHECKPOINT_DIR]}",
                f"  working directory of the workers: {request['working_directory']} (the notebook's folder, on "
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
        if not folder.guardian_alive():
            _detach(folder, env, GUARDIAN_MODULE)
        deadline = time.monotonic() + SUPERVISOR_START_TIMEOUT_S
        while folder.supervisor() is None:
            if time.monotonic() > deadline:
                kill_all(folder.path)
                raise BackendError(f"the supervisor of job {name!r} did not start: {_tail(folder.supervisor_log)}")
            time.sleep(0.01)

    def resume(self, name: str, *, guarded: bool = False) -> None:
        """Continue a lost, failed or stopped job in its folder, from its latest checkpoint.

        The history stays (events, logs, checkpoints); a new supervisor takes over with the
        same spec, in a rendezvous epoch above every checkpoint's, and the restart budget
        starts again (said in the ``job_resumed`` event)."""
        folder = self.folder(name)
        info = self.describe(name)
        if info is None:
            raise JobNotFound(f"no local job named {name!r} (see %elastic_jobs)")
        if info.status not in RESUMABLE_STATUSES and not (guarded and info.status == "recovering"):
            raise BackendError(
                f"job {name!r} {status_phrase(info.status)}; only a lost, failed or stopped job can be resumed"
                + (" (a succeeded job is done: run the cell again to train anew)" if info.status == "succeeded" else "")
            )
        kill_all(folder.path)  # stragglers of a lost supervisor must not meet the new group
        folder.supervisor_file.unlink(missing_ok=True)
        with open(folder.events_file, "rb+") as f:  # a supervisor killed mid-line left a torn one
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    f.write(b"\n")
        self._start_supervisor(folder, name, resume=True)

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
        if not folder.path.is_dir():
            return None
        try:
            spec = folder.spec()
        except FileNotFoundError:
            outcome = folder.outcome()
            if outcome is not None:  # deleted while it ran; its supervisor wrote down how it ended
                summary = {k: v for k, v in outcome.items() if v is not None}
                return JobInfo(name, "local", outcome["status"], summary=summary, location=str(folder.path))
            return JobInfo(
                name,
                "local",
                "damaged",
                location=str(folder.path),
                damaged="spec.json is missing (was the folder deleted while the job ran?)",
            )
        except ValueError as exc:
            return JobInfo(
                name, "local", "damaged", location=str(folder.path), damaged=f"spec.json is unreadable: {exc}"
            )
        status = folder.status() or {}
        state = status.get("status", "pending")
        outcome = folder.outcome() if state not in FINAL_STATUSES else None
        if outcome is not None:  # status.json could not be written at the end (a full disk)
            status, state = outcome, outcome["status"]
        elif state not in FINAL_STATUSES and not folder.supervisor_alive() and folder.guardian_alive():
            state = "recovering"  # its guardian is bringing it back
        elif state not in FINAL_STATUSES and not folder.supervisor_alive():
            started = (folder.supervisor() or {}).get("started")
            if started is not None or time.time() - folder.spec_file.stat().st_mtime > SUPERVISOR_START_TIMEOUT_S:
                state = "lost"
                status = {**status, "reason": LOST_SUPERVISOR["reason"]}
        return JobInfo(
            name=name,
            backend=spec.get("backend") or "local",  # a slurm job's folder is one of these too
            status=state,
            summary={
                # The launch spec's range until the job reports its own (set_range moves it).
                "min_nodes": spec["nnodes"][0],
                "max_nodes": spec["nnodes"][1],
                **{k: v for k, v in status.items() if v is not None},
                "nproc_per_node": spec.get("nproc_per_node"),
            },
            notebook=spec.get("notebook"),
            created=folder.spec_file.stat().st_mtime,
            location=str(folder.path),
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
        result: dict[str, Any] = control.request(
            tuple(info["control"]), bytes.fromhex(info["authkey"]), command, **args
        )
        return result  # what the supervisor's command answered (commands.py: a dict each)

    def scale(self, name: str, nodes: int) -> dict[str, Any]:
        return self._request(name, "scale", nodes=nodes)

    def set_range(self, name: str, min_nodes: int, max_nodes: int) -> dict[str, Any]:
        return self._request(name, "set_range", min_nodes=min_nodes, max_nodes=max_nodes)

    def inject(self, name: str, fault: str, target: Any = None, **options: Any) -> dict[str, Any]:
        if fault == "kill_worker":
            return self._request(name, "kill_worker", rank=target)
        if fault in ("preempt_node", "lose_node"):
            return self._request(name, fault, node=target, **options)
        raise BackendError(f"unknown fault {fault!r}: use kill_worker, preempt_node or lose_node")

    def cancel(self, name: str, timeout_s: float = 30.0) -> None:
        folder = self.folder(name)
        if not folder.exists():
            # Its folder may have been deleted under it: its processes still carry its path.
            if kill_all(folder.path):
                return
            raise JobNotFound(f"no local job named {name!r} (see %elastic_jobs)")
        if (folder.status() or {}).get("status") in FINAL_STATUSES and not folder.supervisor_alive():
            kill_all(folder.path)  # finished: only make sure nothing is left
            return
        if folder.supervisor_alive():
            try:
                self._request(name, "stop")
            except BackendError:
                pass
            deadline = time.monotonic() + timeout_s
            while folder.supervisor_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        if folder.supervisor_alive() or (folder.status() or {}).get("status") not in FINAL_STATUSES:
            # The supervisor is gone or stuck: clean up from here, and say so in the history.
            kill_all(folder.path)
            _append_event(
                folder,
                Event(
                    Kind.JOB_FINISHED,
                    time.time(),
                    None,
                    {"status": "stopped", "reason": "stopped; its supervisor did not answer"},
                ),
            )
            status = folder.status() or {}
            status.update(status="stopped", updated=time.time())
            write_json_atomic(folder.status_file, status)


def _detach(folder: JobFolder, env: dict[str, str], module: str, *options: str) -> None:
    """Start ``python -m MODULE --detach [options] FOLDER`` in a
    session of its own, logging to supervisor.log; returns once its short-lived parent exited."""
    log = os.open(folder.supervisor_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    base = [sys.executable, "-m", module]
    # The supervisor is forked by the warm pool when there is one; its launcher detaches instead.
    pooled = through_pool([*base, *options], env, detach=True) if module == SUPERVISOR_MODULE else None
    command = pooled or [*base, "--detach", *options]
    try:
        subprocess.Popen(
            [*command, str(folder.path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(folder.path),
            start_new_session=True,
        ).wait()  # the detaching parent exits at once
    finally:
        os.close(log)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(empty log)"


# FOLDER_GONE_WAIT_S, FOLLOW_POLL_S, LOST_FOLDER: defined here before jobfolder/follow.py, still imported from here.
__all__ = ["FOLDER_GONE_WAIT_S", "FOLLOW_POLL_S", "LOST_FOLDER", "JobFolder", "LocalBackend"]

"""A real Slurm cluster for the tests: Debian's munged, slurmctld and slurmd (22.05), run in
the foreground from a private folder with a one-node ``slurm.conf`` written for this machine:
two partitions, ``low`` (the default) and ``high``, which preempts it (``PreemptMode=CANCEL``,
``GraceTime``), as on a cluster where a higher-priority team takes nodes back. The node claims
``CPUS`` CPUs (``SlurmdParameters=config_overrides``) so that several one-task node allocations
fit on 2 cores; the partitions do not oversubscribe (with ``OverSubscribe=FORCE`` a
higher-priority job shares a core instead of preempting anyone); a third, ``ctl``, is never
preempted: the jobs' supervisors run there. Started for the
tests that need it and stopped after them, with every allocation cancelled and every daemon
reaped: no process outlives the tests. Skipped, with the reason, where the daemons cannot run
(not installed, not root)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
#: The CPUs the one node claims (each node allocation of a job takes one).
CPUS = 8
#: Slurm's SIGTERM to SIGKILL (KillWait) and a preempted job's extra time (GraceTime), seconds.
KILL_WAIT_S = 8
GRACE_TIME_S = 5
CLIENTS = ("srun", "sinfo", "squeue", "scancel")


def why_not() -> str | None:
    """Why a Slurm cluster cannot be started here, or None."""
    missing = [d for d in (*DAEMONS, *CLIENTS) if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing; scripts/test.sh installs Debian's slurmctld, slurmd, slurm-client, munge)"
    if os.geteuid() != 0:
        return "the Slurm daemons run as root here (SlurmUser=root); run the tests as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exe(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    """One node, this machine, on loopback. ``tests/slurm_hosts.py`` subclasses it for several
    hosts (its own controller address, nodes and slurmd command lines)."""

    #: Where slurmctld listens, and where every client and slurmd reaches it.
    ctl_addr = "127.0.0.1"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.conf = root / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}

    def node_lines(self) -> list[str]:
        """slurm.conf's nodes and partitions."""
        host = socket.gethostname()
        return [
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={CPUS} State=UNKNOWN",
            "PartitionName=low Nodes=ALL Default=YES MaxTime=60 State=UP OverSubscribe=NO PriorityTier=1 "
            f"PreemptMode=CANCEL GraceTime={GRACE_TIME_S}",
            "PartitionName=high Nodes=ALL MaxTime=60 State=UP OverSubscribe=NO PriorityTier=10 PreemptMode=OFF",
            # Where the jobs' supervisors run: never preempted.
            "PartitionName=ctl Nodes=ALL MaxTime=60 State=UP OverSubscribe=NO PriorityTier=1 PreemptMode=OFF",
        ]

    def slurmd_argvs(self) -> list[list[str]]:
        """The slurmd command line of each node."""
        return [[_exe("slurmd"), "-D", "-f", str(self.conf)]]

    def extra_conf(self) -> list[str]:
        """More slurm.conf lines (none for one node)."""
        return []

    def start(self) -> SlurmCluster:
        r = self.root
        for d in ("munge", "state", "spool", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        sock = r / "munge" / "munge.socket"
        host = socket.gethostname()
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=netest",
                    f"SlurmctldHost={host}({self.ctl_addr})",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={sock}",
                    "CredType=cred/munge",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={r / 'state'}",
                    # %n: each node's own (one slurmd per node, several on this machine).
                    f"SlurmdSpoolDir={r / 'spool' / '%n'}",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
                    f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'log' / 'slurmd-%n.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "SchedulerType=sched/backfill",
                    "SchedulerParameters=sched_interval=1",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "PreemptType=preempt/partition_prio",
                    "PreemptMode=CANCEL",
                    "InactiveLimit=0",
                    "MinJobAge=60",
                    f"KillWait={KILL_WAIT_S}",
                    "SlurmdParameters=config_overrides",
                    *self.extra_conf(),
                    *self.node_lines(),
                    "",
                ]
            )
        )
        logs = open(r / "log" / "daemons.log", "ab")
        self.procs.append(
            subprocess.Popen(
                [
                    _exe("munged"),
                    "--foreground",
                    "--force",
                    f"--key-file={key}",
                    f"--socket={sock}",
                    f"--pid-file={r / 'munge' / 'munged.pid'}",
                    f"--log-file={r / 'munge' / 'munged.log'}",
                    f"--seed-file={r / 'munge' / 'seed'}",
                ],
                stdout=logs,
                stderr=logs,
                start_new_session=True,
            )
        )
        self._until(sock.exists, "munged's socket")
        env = {**os.environ, **self.env}
        for argv in ([_exe("slurmctld"), "-D", "-f", str(self.conf)], *self.slurmd_argvs()):
            self.procs.append(subprocess.Popen(argv, env=env, stdout=logs, stderr=logs, start_new_session=True))
        self._until(self.idle, "every node to be idle")
        return self

    def node_states(self) -> dict[str, str]:
        """Each node's state, as sinfo says it (idle, mix, alloc, down*, idle*...)."""
        out = self.run("sinfo", "--Node", "--noheader", "--format=%N|%t").stdout
        return dict(line.strip().split("|", 1) for line in out.splitlines() if "|" in line)

    def idle(self) -> bool:
        states = self.node_states()
        return bool(states) and all(s == "idle" for s in states.values())

    def run(self, *argv: str, check: bool = False) -> subprocess.CompletedProcess:
        done = subprocess.run(list(argv), env={**os.environ, **self.env}, capture_output=True, text=True, timeout=30)
        if check:
            assert done.returncode == 0, (argv, done.stderr)
        return done

    def jobs(self) -> list[tuple[str, str, str]]:
        """(job id, name, state) of every allocation the cluster has now."""
        out = self.run("squeue", "--noheader", "--format=%i|%j|%T").stdout
        return [tuple(line.split("|")) for line in out.splitlines() if line.strip()]  # type: ignore[misc]

    def _until(self, predicate, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            dead = [p for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                log = (self.root / "log" / "daemons.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the Slurm cluster did not come up ({what}): {log}")
            time.sleep(0.2)

    def stop(self) -> None:
        if any(p.poll() is None for p in self.procs):
            self.run("scancel", "--full", "--user", "root")
            deadline = time.monotonic() + 20
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.2)
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)

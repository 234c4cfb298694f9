"""Real separate hosts on this machine, and a Slurm cluster across them.

Each host is a network namespace of its own (``ip netns``), wired to a bridge in the root
namespace by a veth pair, on a private /24 picked at random (10.213.N.0/24, one no interface
here uses yet); the root namespace, where the tests (the kernel side) and slurmctld run, is
``.1`` on the bridge. Each host runs one slurmd (``slurmd -N HOST``) entered with ``nsenter
--net`` (it keeps this machine's /sys, which slurmd reads; ``ip netns exec`` remounts it) and
``unshare --uts`` with the host's own name: every process Slurm starts there (a job's
supervisor, its agents, their workers) has that name and that network, and reaches another host
only over the bridge. The names resolve for everyone through ``/etc/hosts`` (shared by the
namespaces): our lines carry a marker with this run's random suffix and exactly they are removed
at the end. munged's socket is a file, reached from every namespace.

``partition(host)`` sets the host's end of the bridge down (it reaches nothing, nothing reaches
it), ``heal(host)`` sets it up again. ``stop()`` stops the cluster, then removes every
namespace, link and /etc/hosts line it added, whatever happened before. Traffic goes only to
addresses made here.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
from pathlib import Path

import psutil
from slurm_cluster import GRACE_TIME_S, SlurmCluster, _exe

HOSTS_FILE = Path("/etc/hosts")
#: Every namespace and link of these fixtures starts with it (the suite's leftover check looks).
PREFIX = "nesl"
#: The CPUs each host claims: a supervisor and one node fill host A, so a job's other node goes
#: to host B.
HOST_CPUS = 2
#: What the fixtures of this process made, to be removed: ("netns" | "link" | "hosts", name).
#: The suite's leftover check (conftest.py) reads it at the end; another run's are not ours.
MADE: list[tuple[str, str]] = []


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def why_not() -> str | None:
    """Why separate hosts cannot be made here (no ``ip``/``nsenter``, not allowed), or None."""
    from slurm_cluster import why_not as no_slurm

    reason = no_slurm()
    if reason:
        return reason
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed: the two-host cluster needs it (iproute2, util-linux)"
    probe = f"{PREFIX}p{secrets.token_hex(3)}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"network namespaces cannot be made here ({made.stderr.strip()})"
    _ip("netns", "delete", probe, check=False)
    if not os.access(HOSTS_FILE, os.W_OK):
        return f"{HOSTS_FILE} is not writable: the hosts' names cannot be made to resolve"
    return None


def free_subnet() -> ipaddress.IPv4Network:
    """A 10.213.N.0/24 no address here is in (another run's, another developer's)."""
    used = _ip("-o", "-4", "addr", "show").stdout + _ip("-4", "route", "show").stdout
    for _ in range(100):
        net = ipaddress.IPv4Network(f"10.213.{secrets.randbelow(254) + 1}.0/24")
        if f"10.213.{net.network_address.packed[2]}." not in used:
            return net
    raise RuntimeError("no free 10.213.N.0/24 subnet here")


#: One file per run of these fixtures (its suffix): the process that made it, and how many hosts.
RUNS = Path("/run/notebook-elastic-test-hosts")


def _started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _remove(suffix: str, hosts: int) -> list[str]:
    """Remove the namespaces (and what still runs in them), links and /etc/hosts lines of the
    run ``suffix``; what could not be."""
    problems = []
    try:
        _EtcHosts(_marker(suffix)).remove()
    except OSError as exc:
        problems.append(f"/etc/hosts: {exc}")
    for letter in "abcdefgh"[:hosts]:
        name = f"{PREFIX}{suffix}{letter}"
        for pid in _ip("netns", "pids", name, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        for args in (("link", "delete", f"{name}v"), ("netns", "delete", name)):
            done = _ip(*args, check=False)
            if done.returncode != 0 and "Cannot find" not in done.stderr and "No such" not in done.stderr:
                problems.append(f"ip {' '.join(args)}: {done.stderr.strip()}")
    done = _ip("link", "delete", f"{PREFIX}{suffix}br", check=False)
    if done.returncode != 0 and "Cannot find" not in done.stderr:
        problems.append(f"ip link delete {PREFIX}{suffix}br: {done.stderr.strip()}")
    return problems


def sweep() -> None:
    """Remove what runs whose process is gone (SIGKILLed before their teardown) left."""
    for record in RUNS.glob("*") if RUNS.is_dir() else []:
        try:
            run = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if run.get("started") is not None and _started(int(run["pid"])) == run["started"]:
            continue  # its process runs: its fixture removes them
        if not _remove(record.name, int(run.get("hosts", 2))):
            record.unlink(missing_ok=True)


def _marker(suffix: str) -> str:
    return f"notebook-elastic test hosts {suffix}"


class _EtcHosts:
    """Our lines in /etc/hosts, each with the marker; removed, exactly they, at the end. Other
    runs edit the file too: every change holds a lock on it and rewrites it in place (it may be
    a bind mount, which a rename would not reach)."""

    def __init__(self, marker: str) -> None:
        self.marker = f"# {marker}"

    def _edit(self, change) -> None:
        with open(HOSTS_FILE, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            lines = change(f.read().splitlines())
            f.seek(0)
            f.truncate()
            f.write("".join(f"{line}\n" for line in lines))

    def add(self, entries: dict[str, str]) -> None:
        MADE.append(("hosts", self.marker))
        self._edit(lambda lines: [*lines, *(f"{addr} {name} {self.marker}" for name, addr in entries.items())])

    def remove(self) -> None:
        self._edit(lambda lines: [line for line in lines if not line.endswith(self.marker)])


class SlurmHosts(SlurmCluster):
    """A Slurm cluster whose nodes are hosts of their own (``names``): slurmctld in the root
    namespace on the bridge, one slurmd in each host's namespace. Partitions ``low`` (default)
    and ``ctl`` (for supervisors: host A only), each host ``HOST_CPUS`` CPUs."""

    def __init__(self, root: Path, hosts: int = 2) -> None:
        super().__init__(root)
        self.suffix = secrets.token_hex(3)
        self.subnet = free_subnet()
        addrs = list(self.subnet.hosts())
        self.ctl_addr = str(addrs[0])
        self.bridge = f"{PREFIX}{self.suffix}br"
        #: host name -> (namespace, root side veth, address)
        self.hosts: dict[str, tuple[str, str, str]] = {}
        for i in range(hosts):
            letter = "abcdefgh"[i]
            name = f"{PREFIX}{self.suffix}{letter}"  # a host name, a namespace name and a link name at once
            self.hosts[name] = (name, f"{name}v", str(addrs[i + 1]))
        self._etc_hosts = _EtcHosts(_marker(self.suffix))

    @property
    def names(self) -> list[str]:
        return list(self.hosts)

    def address(self, host: str) -> str:
        return self.hosts[host][2]

    # --- the network ---------------------------------------------------------------------

    def _wire(self) -> None:
        sweep()
        # Who made these (a run SIGKILLed before its teardown leaves them: the next one removes them).
        RUNS.mkdir(exist_ok=True)
        (RUNS / self.suffix).write_text(
            json.dumps({"pid": os.getpid(), "started": _started(os.getpid()), "hosts": len(self.hosts)})
        )
        prefix = self.subnet.prefixlen
        MADE.append(("link", self.bridge))
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.ctl_addr}/{prefix}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for name, (ns, veth, addr) in self.hosts.items():
            MADE.extend([("netns", ns), ("link", veth)])
            _ip("netns", "add", ns)
            inside = f"{name}i"
            _ip("link", "add", veth, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            for args in (
                ("addr", "add", f"{addr}/{prefix}", "dev", inside),
                ("link", "set", inside, "up"),
                ("link", "set", "lo", "up"),
            ):
                _ip("-n", ns, *args)
        self._etc_hosts.add({name: addr for name, (_, _, addr) in self.hosts.items()})

    def _unwire(self) -> list[str]:
        """Remove every namespace, link and /etc/hosts line this made; what could not be."""
        problems = _remove(self.suffix, len(self.hosts))
        if not problems:
            (RUNS / self.suffix).unlink(missing_ok=True)
        return problems

    def partition(self, host: str) -> None:
        """Cut ``host`` off: its link to the bridge goes down (packets to and from it are lost,
        no connection is reset)."""
        _ip("link", "set", self.hosts[host][1], "down")

    def heal(self, host: str) -> None:
        _ip("link", "set", self.hosts[host][1], "up")

    # --- the cluster ---------------------------------------------------------------------

    def extra_conf(self) -> list[str]:
        # A host unreachable for less than this is not taken DOWN by Slurm (its jobs go on):
        # the default, said here since the partition test relies on it.
        return ["SlurmdTimeout=300"]

    def node_lines(self) -> list[str]:
        first = self.names[0]
        return [
            *(
                f"NodeName={name} NodeAddr={addr} CPUs={HOST_CPUS} State=UNKNOWN"
                for name, (_, _, addr) in self.hosts.items()
            ),
            "PartitionName=low Nodes=ALL Default=YES MaxTime=60 State=UP OverSubscribe=NO PriorityTier=1 "
            f"PreemptMode=CANCEL GraceTime={GRACE_TIME_S}",
            f"PartitionName=ctl Nodes={first} MaxTime=60 State=UP OverSubscribe=NO PriorityTier=1 PreemptMode=OFF",
        ]

    def slurmd_argvs(self) -> list[list[str]]:
        return [
            [
                _exe("nsenter"),
                f"--net=/run/netns/{ns}",
                _exe("unshare"),
                "--uts",
                # Its own process ids too, as on another machine: a pid read there means
                # nothing here (a /proc of its own, in a mount namespace of its own).
                "--pid",
                "--fork",
                "--mount-proc",
                "sh",
                "-c",
                f'hostname {name} && exec {_exe("slurmd")} -D -N {name} -f "$0"',
                str(self.conf),
            ]
            for name, (ns, _, _) in self.hosts.items()
        ]

    def start(self) -> SlurmHosts:
        try:
            self._wire()
            super().start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            for host in self.hosts:
                _ip(
                    "link", "set", self.hosts[host][1], "up", check=False
                )  # its allocations are cancelled through its slurmd
            super().stop()
        finally:
            problems = self._unwire()
        if problems:
            raise RuntimeError("the two-host fixture could not remove what it made: " + "; ".join(problems))


def leftovers() -> list[str]:
    """What the fixtures of this process made (``MADE``) and is still here: namespaces, links
    (a veth's root end, a bridge), /etc/hosts lines (by their marker)."""
    namespaces = {line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()}
    links = set()
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            links.add(parts[1].strip().split("@")[0])
    try:
        hosts_lines = HOSTS_FILE.read_text().splitlines()
    except OSError:
        hosts_lines = []
    found = []
    for kind, name in MADE:
        if (kind == "netns" and name in namespaces) or (kind == "link" and name in links):
            found.append(f"{kind} {name}")
        elif kind == "hosts":
            found.extend(f"/etc/hosts: {line}" for line in hosts_lines if line.endswith(name))
    return found

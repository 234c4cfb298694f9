"""``notebook-elastic``: the jobs from a terminal, a script or an SSH session, no notebook open.

    notebook-elastic jobs [--json]                  every job, including finished ones
    notebook-elastic status NAME [--json]           one job's state
    notebook-elastic logs NAME [-f] [--node N]      the agents' and workers' output (--tail N: the last
                      [--tail N] [--since WHEN]     N lines of each node; --since 10m or 14:05: the
                                                    workers' lines since, in time order; --protocol:
                                                    with the ranks' '@@elastic' event lines)
    notebook-elastic events NAME [-f] [--json]      the job's history, then live events
    notebook-elastic scale NAME N                   run on N nodes
    notebook-elastic stop NAME                      stop it and everything it started
    notebook-elastic resume NAME                    continue a lost, failed or stopped job
    notebook-elastic export NOTEBOOK --cell N -o train.py

A local or Slurm job is found by its folder, which says where it runs; ``--backend kubernetes``
(and ``--namespace``/``--context``) names a Kubernetes job. Exit status: 0 done, 1 the operation
failed (one sentence on stderr), 2 bad usage (the command's own usage, and what was probably
meant), 4 no such job (and the job probably meant). Like the magics, it only parses and delegates
to the Python API; what the API says in a notebook's words (``%elastic_jobs``) it says in a
terminal's (``notebook-elastic jobs``).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .contract.event_types import FINAL_STATUSES
from .contract.options import unknown_flags
from .errors import JobNotFound, NotebookElasticError

if TYPE_CHECKING:
    from .backends.base import Backend, JobInfo
    from .contract.events import Event

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 4
FOLLOW_POLL_S = 0.2


class _Parser(argparse.ArgumentParser):
    """argparse, with what was probably meant: ``stauts`` -> did you mean 'status'?"""

    def error(self, message: str) -> NoReturn:
        chosen = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if chosen:
            choices = re.findall(r"'([^']*)'", chosen.group(2))
            close = difflib.get_close_matches(chosen.group(1), choices, n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
        super().error(message)


def _unknown_flags(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """'unrecognized arguments: --tial 5; did you mean --tail?' for this subcommand's flags."""
    return unknown_flags(extras, [f for action in parser._actions for f in action.option_strings])  # no public list


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command's parser and each subcommand's (a bad flag prints its subcommand's usage)."""
    common = _Parser(add_help=False)
    common.add_argument(
        "--backend", default="local", choices=["local", "kubernetes", "slurm"], help="where the job runs"
    )
    common.add_argument("--namespace", default=None, help="kubernetes: the namespace (default: the context's)")
    common.add_argument("--context", default=None, help="kubernetes: the kubeconfig context (default: current)")
    parser = _Parser(
        prog="notebook-elastic", description="Elastic torchrun jobs launched from notebooks, from a terminal."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    p = sub.add_parser("jobs", parents=[common], help="list every job")
    p.add_argument("--json", action="store_true", help="one JSON object per job")
    p = sub.add_parser("status", parents=[common], help="one job's state")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("logs", parents=[common], help="a job's output (agents and workers)")
    p.add_argument("name")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the job ends")
    p.add_argument("--node", default=None, help="only this node (node-1, or 1)")
    p.add_argument("--tail", type=_count, default=None, metavar="N", help="only the last N lines of each node")
    p.add_argument(
        "--since",
        type=_since,
        default=None,
        metavar="WHEN",
        help="only what came since WHEN: how long ago (10m, 90s, 1h30m) or a clock time today (14:05); "
        "the workers' lines of every node in the order they came (the history keeps them; the agents' own "
        "lines are in the node logs, without --since)",
    )
    p.add_argument(
        "--protocol",
        action="store_true",
        help="also the '@@elastic {...}' lines the ranks send the supervisor (hidden: `events` tells them)",
    )
    p = sub.add_parser("events", parents=[common], help="a job's events")
    p.add_argument("name")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new events until the job ends")
    p.add_argument("--json", action="store_true", help="the events as JSON lines")
    p.add_argument("--all", action="store_true", help="metrics, checkpoints and log lines too")
    p = sub.add_parser("scale", parents=[common], help="run a job on N nodes")
    p.add_argument("name")
    p.add_argument("nodes", type=int)
    p = sub.add_parser("stop", parents=[common], help="stop a job and everything it started")
    p.add_argument("name")
    p = sub.add_parser("resume", parents=[common], help="continue a lost, failed or stopped job")
    p.add_argument("name")
    p = sub.add_parser("debug", help="a local job's bug-report file: logs, events, plan, versions; no secret")
    p.add_argument("name")
    p.add_argument("-o", "--output", default=None, help="the file to write (default: ./NAME-debug-TIME.tar.gz)")
    p = sub.add_parser("pool", help="the warm pool local jobs are forked from: whether it runs, or stop it")
    p.add_argument("action", nargs="?", choices=("status", "stop"), default="status")
    p = sub.add_parser("export", help="write a notebook's training cell as a standalone script")
    p.add_argument("notebook", help="the .ipynb file")
    p.add_argument("--cell", type=int, required=True, help="the training cell: its number, counting code cells from 1")
    p.add_argument("-o", "--output", required=True, help="the script to write, like train.py")
    return parser, dict(sub.choices)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of lines: give one like --tail 50")
    return int(text)


def _since(text: str, now: float | None = None) -> float:
    """The Unix time ``--since`` names: how long ago (``10m``, ``90s``, ``1h30m``) or a clock time
    of today (``14:05``, ``14:05:30``; yesterday's when that is still to come)."""
    now = time.time() if now is None else now
    ago = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    if ago and any(ago.groups()):
        hours, minutes, seconds = (int(g or 0) for g in ago.groups())
        return now - (3600 * hours + 60 * minutes + seconds)
    clock = re.fullmatch(r"(\d{1,2}):(\d{2})(?::(\d{2}))?", text)
    if clock and int(clock.group(1)) < 24 and int(clock.group(2)) < 60 and int(clock.group(3) or 0) < 60:
        today = time.localtime(now)
        stamp = time.mktime(
            (
                today.tm_year,
                today.tm_mon,
                today.tm_mday,
                int(clock.group(1)),
                int(clock.group(2)),
                int(clock.group(3) or 0),
                0,
                0,
                -1,
            )
        )
        return stamp - 86400 if stamp > now else stamp
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a time: give how long ago, like 10m, 90s or 1h30m, or a clock time today, like 14:05"
    )


def _backend(args: argparse.Namespace) -> Backend:
    """The backend that runs job ``args.name``: a local or Slurm job's own folder says which
    (``--backend`` is needed only for Kubernetes)."""
    from .backends import backend_of

    return backend_of(args.name, args.backend, namespace=args.namespace, context=args.context)


def _info(args: argparse.Namespace) -> JobInfo:
    info = _backend(args).describe(args.name)
    if info is None:
        raise JobNotFound(f"no {args.backend} job named {args.name!r}; `notebook-elastic jobs` lists them")
    return info


def _info_json(info: JobInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "backend": info.backend,
        "status": info.status,
        "damaged": info.damaged,
        "location": info.location,
        "notebook": info.notebook,
        **{k: v for k, v in info.summary.items() if k not in ("nodes", "transitions", "loss_tail")},
    }


def cmd_jobs(args: argparse.Namespace) -> int:
    from .kernel.launcher import jobs

    options = {"namespace": args.namespace, "context": args.context} if args.backend == "kubernetes" else {}
    listed = jobs(args.backend, **{k: v for k, v in options.items() if v})
    if args.json:
        for info in listed:
            print(json.dumps(_info_json(info), default=str))
    else:
        print(repr(listed))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from .kernel.launcher import JobList

    info = _info(args)
    if args.json:
        print(json.dumps(_info_json(info), default=str))
        return 0
    print(repr(JobList([info])))
    if info.summary.get("reason"):
        print(f"reason: {info.summary['reason']}")
    if info.summary.get("warning"):
        print(f"warning: {info.summary['warning']}")
    if info.summary.get("waiting") and info.status not in FINAL_STATUSES:
        print(f"waiting: {info.summary['waiting']}")
    if info.location:
        print(f"folder: {info.location}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from .backends.local import LocalBackend
    from .contract.protocol import EVENT_PREFIX

    backend = _backend(args)
    if args.backend == "kubernetes" or not isinstance(backend, LocalBackend):  # Slurm's is one too
        raise NotebookElasticError("logs are read from job folders; for a Kubernetes job use kubectl logs")
    folder = backend.folder(args.name)
    if not folder.exists():
        raise JobNotFound(f"no local job named {args.name!r}; `notebook-elastic jobs` lists them")
    node = args.node
    if node is not None and node.isdigit():
        node = f"node-{node}"
    paths = sorted(folder.logs.glob(f"{node}.log" if node else "node-*.log"))
    if node and not paths:
        known = ", ".join(p.stem for p in sorted(folder.logs.glob("node-*.log"))) or "none yet"
        raise NotebookElasticError(f"job {args.name!r} has no node {node!r} (nodes: {known})")
    if args.since is not None:
        if args.protocol:
            raise NotebookElasticError(
                "--since reads when each line came from the job's history, which keeps the output, not the "
                f"'@@elastic' lines: `notebook-elastic events {args.name} --all` tells those with their times"
            )
        return _logs_since(backend, args, node)
    offsets: dict[str, int] = {}
    prefix = len(paths) > 1 or not node

    def drain(tail: int | None = None) -> None:
        for path in sorted(folder.logs.glob(f"{node}.log" if node else "node-*.log")):
            with open(path, "rb") as f:
                f.seek(offsets.get(path.name, 0))
                data = f.read()
            whole = data[: data.rfind(b"\n") + 1]  # a line being written: next time
            offsets[path.name] = offsets.get(path.name, 0) + len(whole)
            lines = [
                line
                for line in whole.decode("utf-8", "replace").splitlines()
                # a metric, a checkpoint: `notebook-elastic events NAME --all` says them in words
                if args.protocol or EVENT_PREFIX not in line
            ]
            for line in lines[-tail:] if tail is not None else lines:
                print(f"[{path.stem}] {line}" if prefix else line, flush=True)

    drain(args.tail)
    while args.follow and _running(backend, args.name):
        time.sleep(FOLLOW_POLL_S)
        drain()
    drain()
    return 0


def _logs_since(backend: Backend, args: argparse.Namespace, node: str | None) -> int:
    """``logs --since``: the nodes' output since then, in the order the supervisor read it (the
    history's output events carry that time; the node logs carry none), the last ``--tail``."""
    from .contract.event_types import Kind, Log

    stop = threading.Event()
    if args.follow:  # the history, then what comes, until the job ends
        events: Iterable[Event] = backend.follow(args.name, stop)
    else:
        events = backend.history(args.name)
    shown: list[str] = []
    capped = False

    def line_of(event: Event) -> str:
        text = event.fields(Log).get("text")
        return f"[{event.node}] {text}" if not node else str(text)

    try:
        for event in events:
            if event.kind == Kind.OUTPUT_CAPPED:
                capped = True
            if event.kind != Kind.LOG or event.time < args.since or (node and event.node != node):
                continue
            if args.follow and args.tail is None:
                print(line_of(event), flush=True)
            else:
                shown.append(line_of(event))
    finally:
        stop.set()
    for line in shown[-args.tail :] if args.tail is not None else shown:
        print(line, flush=True)
    if capped:
        print(
            "notebook-elastic: the job's history keeps the first 8 MiB of its output with their times; "
            f"what came later is in the node logs only (`notebook-elastic logs {args.name}` without --since)",
            file=sys.stderr,
        )
    return 0


def cmd_debug(args: argparse.Namespace) -> int:
    from .backends import get_backend
    from .backends.local.debug import write

    folder = get_backend("local").folder(args.name)
    if not folder.exists():
        raise JobNotFound(f"no local job named {args.name!r}; `notebook-elastic jobs` lists them")
    out = Path(args.output or f"{args.name}-debug-{time.strftime('%Y%m%d-%H%M%S')}.tar.gz")
    names = write(folder, out)
    print(
        f"wrote {out} ({len(names)} files, {out.stat().st_size / 1024:.0f} KiB, readable by you only): attach it "
        "to your bug report. It holds the job's events and logs and the generated script (your cell's code); "
        "never --env values, the payload or checkpoints."
    )
    return 0


def _running(backend: Backend, name: str) -> bool:
    from .contract.event_types import FINAL_STATUSES

    info = backend.describe(name)
    return info is not None and info.status not in (*FINAL_STATUSES, "lost", "damaged")


def cmd_events(args: argparse.Namespace) -> int:
    from .contract.event_types import Kind

    backend = _backend(args)
    _info(args)
    quiet = {Kind.METRIC, Kind.LOG, Kind.CHECKPOINT}
    if args.follow or args.backend != "local":
        stop = threading.Event()
        idle = _IdleStop(stop, None if args.follow else 2.0)  # a cluster's history, then quiet
        events: Iterable[Event] = (idle.saw(e) for e in backend.follow(args.name, stop))
    else:  # the history as written now
        events = backend.history(args.name)
    for event in events:
        if not args.all and event.kind in quiet:
            continue
        if args.json:
            print(json.dumps(event.to_json(), default=str), flush=True)
        else:
            when = time.strftime("%H:%M:%S", time.localtime(event.time))
            print(f"{when} {event.kind:<16} {event.describe()}", flush=True)
    return 0


class _IdleStop:
    """Sets ``stop`` once no event came for ``idle_s`` seconds (never when None)."""

    def __init__(self, stop: threading.Event, idle_s: float | None) -> None:
        self.stop, self.idle_s, self.last = stop, idle_s, time.monotonic()
        if idle_s is not None:
            threading.Thread(target=self._watch, daemon=True).start()

    def saw(self, event: Event) -> Event:
        self.last = time.monotonic()
        return event

    def _watch(self) -> None:
        assert self.idle_s is not None  # started only with one
        while not self.stop.wait(0.2):
            if time.monotonic() - self.last > self.idle_s:
                self.stop.set()


def cmd_scale(args: argparse.Namespace) -> int:
    answer = _backend(args).scale(args.name, args.nodes)
    print(f"{args.name}: scaling to {answer.target} node(s)")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from .contract.events import status_phrase

    backend = _backend(args)
    before = backend.describe(args.name)
    backend.cancel(args.name)
    if before is not None and before.status in FINAL_STATUSES:
        print(f"job {args.name!r} {status_phrase(before.status)} already: nothing of it is left running")
        return 0
    info = backend.describe(args.name)
    if info is None:
        print(f"job {args.name!r} is gone, with every process it started")
    elif info.status == "stopped":
        print(
            f"job {args.name!r} was stopped, with every process it started; its checkpoints stay "
            f"(`notebook-elastic resume {args.name}` continues it)"
        )
    else:
        print(f"job {args.name!r} {status_phrase(info.status)}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    backend = _backend(args)
    backend.resume(args.name)
    print(f"{args.name}: resumed from its latest checkpoint (`notebook-elastic events {args.name} -f` follows it)")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .export import export_notebook_cell

    export_notebook_cell(args.notebook, args.cell, args.output)
    return 0


def cmd_pool(args: argparse.Namespace) -> int:
    """The warm pool of this user and environment (pool/__init__.py): its pid, or stop it."""
    import signal

    from . import pool
    from .contract.protocol import ENV_POOL

    name = os.environ.get(ENV_POOL) or pool.pool_name()
    pid = pool.ping(name)
    if pid is None:
        print(f"no warm pool runs for this environment ({name[1:]})")
        return 0
    if args.action == "stop":
        os.kill(pid, signal.SIGTERM)  # its children (running jobs) are not its: they go on
        print(f"stopped the warm pool (pid {pid}); running jobs go on")
        return 0
    print(f"warm pool: pid {pid}, {name[1:]}, exits after {pool.idle_seconds():g} s idle")
    return 0


COMMANDS = {
    "jobs": cmd_jobs,
    "status": cmd_status,
    "logs": cmd_logs,
    "debug": cmd_debug,
    "events": cmd_events,
    "scale": cmd_scale,
    "stop": cmd_stop,
    "resume": cmd_resume,
    "export": cmd_export,
    "pool": cmd_pool,
}


def _check_arguments(args: argparse.Namespace) -> None:
    """A job name is a name, never a path, as the server's routes take it (``status ..`` or
    ``stop ../jobs/NAME`` must not act on another folder); a node is ``node-N`` or ``N``."""
    from .contract.spec import validate_name
    from .errors import SpecError

    if getattr(args, "name", None) is not None:
        validate_name(args.name, what="the job name")
    node = getattr(args, "node", None)
    if node is not None and not re.fullmatch(r"(node-)?[0-9]{1,6}", node):
        raise SpecError(
            f"--node {node!r} is not a node of a job: give its number or name, like --node 1 or --node node-1"
        )


#: A notebook's words in what the Python API says, and a terminal's for them.
TERMINAL_WORDS = (
    (r"\(see %elastic_jobs\)", "(`notebook-elastic jobs` lists them)"),
    (r"\(see %elastic_jobs (\w+)\)", r"(`notebook-elastic jobs --backend \1` lists them)"),
    (r"%elastic_jobs (\w+) lists", r"`notebook-elastic jobs --backend \1` lists"),
    (r"%elastic_jobs", "`notebook-elastic jobs`"),
    (r"%elastic_stop ([\w.-]+)", r"`notebook-elastic stop \1`"),
    (r"%elastic_resume ([\w.-]+) \(or job\.resume\(\)\)", r"`notebook-elastic resume \1`"),
    (r"%elastic_resume ([\w.-]+)", r"`notebook-elastic resume \1`"),
    (r"widen it with set_range\((\d+), (\d+)\) first", r"widen it first from the notebook (job.set_range(\1, \2))"),
    (r"\(stop\(\) ends it\)", "(`notebook-elastic stop NAME` ends it)"),
)


def for_terminal(message: str) -> str:
    """What the API says, in a terminal's words: ``notebook-elastic jobs``, not ``%elastic_jobs``."""
    for pattern, words in TERMINAL_WORDS:
        message = re.sub(pattern, words, message)
    return message


def _meant(args: argparse.Namespace, message: str) -> str:
    """A missing job's sentence, with the job probably meant: did you mean 'quickstart'?"""
    name = getattr(args, "name", None)
    if not name or "did you mean" in message:
        return message
    try:
        from .kernel.launcher import jobs

        options = {"namespace": args.namespace, "context": args.context} if args.backend == "kubernetes" else {}
        known = [info.name for info in jobs(args.backend, **{k: v for k, v in options.items() if v})]
    except Exception:  # listing failed too: the sentence as it is
        return message
    close = difflib.get_close_matches(name, known, n=1)
    return f"{message}; did you mean {close[0]!r}?" if close else message


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = _parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # a flag of the subcommand mistyped: its own usage, not the command's
        commands[args.command].error(_unknown_flags(commands[args.command], extras))
    from .errors import SpecError

    try:
        _check_arguments(args)
    except SpecError as exc:
        print(f"notebook-elastic: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return COMMANDS[args.command](args)
    except JobNotFound as exc:
        print(f"notebook-elastic: {_meant(args, for_terminal(str(exc)))}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except NotebookElasticError as exc:
        print(f"notebook-elastic: {for_terminal(str(exc))}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `notebook-elastic logs x | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())

"""IPython magics: ``%%elastic_train``, ``%elastic_jobs``, ``%elastic_attach``, ``%elastic_stop``.

A magic parses its flags (torchrun's names) and delegates to the Python API
(``kernel/launcher.py``); it holds no logic the API does not also offer. Every error the API
raises on purpose is shown as one ``UsageError`` line, without a traceback.
"""

from __future__ import annotations

import argparse
import builtins
import keyword
import os
import re
import shlex
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from IPython.core import magic_arguments as ipython_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from ..backends import options
from ..contract.options import unknown_flags
from ..errors import NotebookElasticError
from ..packaging import NotebookContext
from .launcher import (
    JobList,
    announce,
    attach,
    backend_for,
    bundle_for,
    check_withheld,
    jobs,
    spec_from_options,
    start_or_resume,
)

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from ..backends.base import Backend
    from .job import ElasticJob

# IPython's magic_arguments is unannotated: its decorators and parser, typed here once.
_Decorator = Callable[[Any], Any]
argument: Callable[..., _Decorator] = ipython_arguments.argument
argument_group: Callable[[str], _Decorator] = ipython_arguments.argument_group
magic_arguments: Callable[[], _Decorator] = ipython_arguments.magic_arguments
parse_argstring: Callable[[Any, str], argparse.Namespace] = ipython_arguments.parse_argstring


def _option_flags(func: Any) -> Any:
    """The magic's flags, from the option table (options.OPTIONS), grouped as --help shows them."""
    groups = {
        "kubernetes": "Kubernetes (with --backend kubernetes)",
        "slurm": "Slurm (with --backend slurm)",
        "launch": "launching",
    }
    decorators: list[Any] = []
    group = None
    for option, flags, kwargs in options.argparse_arguments():
        if option.goes_to in groups and group != option.goes_to:
            group = option.goes_to
            decorators.append(argument_group(groups[group]))
        decorators.append(argument(*flags, **kwargs))
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def _parse_flags(magic: Any, line: str) -> argparse.Namespace:
    """The magic's flags as torchrun takes them: whole (``--nnode`` is no ``--nnodes``), and
    with underscores too (``--nproc_per_node``); an unknown one says the flag probably meant."""
    parser = magic.parser
    parser.allow_abbrev = False
    flags = [f for action in parser._actions for f in action.option_strings]  # argparse keeps no public list

    def dashed(match: re.Match[str]) -> str:
        flag = "--" + match.group(1).replace("_", "-")
        return flag if flag in flags else match.group(0)

    line = re.sub(r"(?<!\S)--(\w+)(?=[\s=]|$)", dashed, line)
    try:
        return parse_argstring(magic, line)
    except UsageError as exc:
        extras = re.search(r"unrecognized arguments: (.*)", str(exc))
        if extras is None:
            raise
        raise UsageError(unknown_flags(extras.group(1).split(), flags)) from None


def _errors_as_usage(func: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except NotebookElasticError as exc:
            raise UsageError(str(exc)) from None

    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    return wrapper


def job_variable(namespace: dict[str, Any], name: str) -> str | None:
    """The notebook variable that will hold job ``name``, checked before anything launches.

    A name bound to anything but a job handle is refused: the user's tensor ``inputs`` must never
    be replaced by a job called ``inputs``. Re-running the cell rebinds its own handle. ``None``
    when the name makes no identifier (``2024-run``): the job is then only in ``_``.
    """
    from .job import ElasticJob

    var = name.replace("-", "_")
    if not var.isidentifier() or keyword.iskeyword(var):
        return None
    current = namespace.get(var, _UNBOUND)
    if isinstance(current, ElasticJob):
        return var
    if current is _UNBOUND and not hasattr(builtins, var):
        return var
    what = (
        f"the notebook variable `{var}` (a {type(current).__name__})"
        if current is not _UNBOUND
        else (f"Python's built-in `{var}`")
    )
    raise UsageError(
        f"--name {name!r} would overwrite {what} with the job handle; pick another name, "
        f"like --name {name}-job" + (f", or `del {var}` first" if current is not _UNBOUND else "")
    )


_UNBOUND = object()
#: The editor's number of the body's first line: the %%elastic_train line is line 1 (#39 item 6).
CELL_FIRST_LINE = 2


def _names(line: str, magic: str) -> list[str]:
    """A line magic's ``NAME [BACKEND]``, or the usage sentence."""
    parts = shlex.split(line)
    if not parts:
        raise UsageError(f"usage: %{magic} NAME (see %elastic_jobs for names)")
    return parts


def _stop_quietly(runner: Backend, name: str) -> None:
    try:
        runner.cancel(name)
    except (NotebookElasticError, KeyboardInterrupt):
        pass


@magics_class
class ElasticMagics(Magics):
    @magic_arguments()
    @_option_flags
    @argument("-h", "--help", action="store_true", help="show this help; launch nothing.")
    @cell_magic
    @_errors_as_usage
    def elastic_train(self, line: str, cell: str) -> ElasticJob | None:
        """Run this cell as an elastic torchrun job; returns at once with the job handle."""
        args = _parse_flags(self.elastic_train, line)
        if args.help:
            print(self.elastic_train.parser.format_help())
            return None
        if args.dry_run and args.export:
            raise UsageError("--dry-run and --export both launch nothing; use one of them")
        if args.wait and (args.dry_run or args.export):
            raise UsageError("--wait waits for a launched job; it does not go with --dry-run or --export")
        ctx = NotebookContext.from_shell(self.shell)
        assert self.shell is not None  # from_shell has just read it
        values = options.given(vars(args))
        for how in ("help", "dry_run", "export", "wait", "fresh"):
            values.pop(how, None)
        spec = spec_from_options(values, ctx, surface="%%elastic_train")
        var = job_variable(self.shell.user_ns, spec.name) if not (args.export or args.dry_run) else None
        if args.export:
            path = os.path.abspath(os.path.expanduser(args.export))
            if not path.endswith(".py"):
                raise UsageError(f"--export {args.export!r} must name a .py file, like train.py")
            if not os.path.isdir(os.path.dirname(path)):
                raise UsageError(f"--export {args.export!r}: the folder {os.path.dirname(path)} does not exist")
            bundle = bundle_for(cell, spec, ctx, script_name=os.path.basename(path), first_line=CELL_FIRST_LINE)
            script, payload = bundle.write(path)
            print(bundle.manifest.format())
            print(f"\nwrote {script}" + (f" and {payload}" if payload else ""))
            print(f"run it with: torchrun --nproc-per-node {spec.nproc_per_node} {script}")
            return None
        from .job import ElasticJob

        try:
            bundle = bundle_for(cell, spec, ctx, first_line=CELL_FIRST_LINE)
            runner = backend_for(spec)
            dryrun = runner.submit_dryrun(spec, bundle)
        except KeyboardInterrupt:
            raise UsageError("interrupted while packaging the cell; nothing was launched") from None
        if args.dry_run:
            if spec.backend == "kubernetes":
                # One multi-document YAML (the script is in the ConfigMap), the manifest as comments.
                print("\n".join("# " + line for line in bundle.manifest.format().splitlines()))
                print(dryrun.text)
                return None
            print(bundle.manifest.format())
            print()
            print(dryrun.text)
            print()
            print(bundle.script)
            return None
        check_withheld(bundle, spec)
        announce(bundle)
        job = ElasticJob(spec.name, runner, spec, dryrun)
        try:
            said = start_or_resume(job, bundle, fresh=args.fresh)
        except KeyboardInterrupt:
            # The supervisor runs in its own session and may be up already: a job nobody holds a
            # handle to must not train on, so stop whatever started before saying so.
            _stop_quietly(runner, spec.name)
            raise UsageError(
                f"interrupted while launching job {spec.name!r}; it was stopped and nothing is left "
                "running (run the cell again to launch it)"
            ) from None
        if said:
            print(said)
        if var:
            self.shell.user_ns[var] = job
        if args.wait:
            from .views.text import TextView, outcome_lines

            view = TextView(job)
            try:
                job.wait()
            except KeyboardInterrupt:
                view.close()
                print(f"\nstopped waiting; job {spec.name!r} keeps running (%elastic_stop {spec.name} stops it)")
                return job
            view.close()
            if job.status != "succeeded":
                print("\n".join(outcome_lines(job)), file=sys.stderr)
        return job

    @line_magic
    @_errors_as_usage
    def elastic_jobs(self, line: str = "") -> JobList:
        """List elastic jobs, including those started before a kernel restart."""
        backend = line.strip() or None
        return jobs(backend)

    @line_magic
    @_errors_as_usage
    def elastic_attach(self, line: str) -> ElasticJob:
        """%elastic_attach NAME [BACKEND]: re-open a job's dashboard and replay its history."""
        parts = _names(line, "elastic_attach")
        assert self.shell is not None  # IPython runs a magic on the instance it registered, with itself
        var = job_variable(self.shell.user_ns, parts[0])
        job = attach(parts[0], *parts[1:2])
        if var:
            self.shell.user_ns[var] = job
        return job

    @line_magic
    @_errors_as_usage
    def elastic_resume(self, line: str) -> ElasticJob:
        """%elastic_resume NAME: continue a lost, failed or stopped job from its latest checkpoint."""
        parts = _names(line, "elastic_resume")
        assert self.shell is not None  # IPython runs a magic on the instance it registered, with itself
        var = job_variable(self.shell.user_ns, parts[0])
        job = attach(parts[0])
        job.resume()
        if var:
            self.shell.user_ns[var] = job
        return job

    @line_magic
    @_errors_as_usage
    def elastic_stop(self, line: str) -> None:
        """%elastic_stop NAME [BACKEND]: stop a job and every process or pod it started."""
        parts = _names(line, "elastic_stop")
        from ..backends import backend_of

        runner = backend_of(parts[0], parts[1] if len(parts) > 1 else None)
        runner.cancel(parts[0])
        info = runner.describe(parts[0])
        print(f"{parts[0]}: {info.status if info else 'gone'}")


def help_in_an_empty_cell(lines: list[str]) -> list[str]:
    """``%%elastic_train --help`` alone in a cell, as the README writes it (#39 item 7): IPython
    refuses a cell magic whose body is empty before the magic runs ("the cell body is empty"),
    so the cell gets a comment for a body; the magic prints its help and runs nothing."""
    if not lines or not any(line.strip() for line in lines[:1]) or any(line.strip() for line in lines[1:]):
        return lines
    first = lines[0].strip()
    if not first.startswith("%%elastic_train"):
        return lines
    try:
        flags = shlex.split(first[len("%%elastic_train") :])
    except ValueError:
        return lines
    if "--help" in flags or "-h" in flags:
        return [lines[0].rstrip("\n") + "\n", "# (the help is all this cell asks for)\n"]
    return lines


def load_ipython_extension(ipython: InteractiveShell) -> None:
    from ..plumbing import log
    from .views import register_display

    log.in_kernel()  # NOTEBOOK_ELASTIC_LOG=debug: the kernel's own lines on its stderr (the server's log)

    ipython.register_magics(ElasticMagics)
    if help_in_an_empty_cell not in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.append(help_in_an_empty_cell)
    register_display(ipython)
    import notebook_elastic.runtime as runtime

    # The cells use `elastic.report(...)`, `elastic.State(...)`, as workers will.
    ipython.user_ns.setdefault("elastic", runtime)
    # The warm pool imports torch now, in the background, so the first job's processes are
    # forks of it (pool/__init__.py); a job starts it too when none answers.
    from ..backends.local import LocalBackend
    from ..jobfolder.folder import pool_log
    from ..pool import ensure_pool

    # Its own messages go to the jobs folder when there is one (loading makes no folder).
    ensure_pool(log=pool_log(LocalBackend().root))


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    if help_in_an_empty_cell in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.remove(help_in_an_empty_cell)

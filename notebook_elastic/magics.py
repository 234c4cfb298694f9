"""IPython magics: ``%%elastic_train``, ``%elastic_jobs``, ``%elastic_attach``, ``%elastic_stop``.

A magic parses its flags (torchrun's names) and delegates to the Python API
(``launcher.py``); it holds no logic the API does not also offer. Every error the API
raises on purpose is shown as one ``UsageError`` line, without a traceback.
"""

from __future__ import annotations

import builtins
import keyword
import os
import shlex
import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from . import defaults
from .errors import NotebookElasticError
from .launcher import (
    announce,
    attach,
    backend_for,
    build_spec,
    bundle_for,
    check_withheld,
    jobs,
    kubernetes_options,
    start_or_resume,
)
from .packaging import NotebookContext


def _float(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise UsageError(f"expected a number of seconds, not {value!r}") from None


def _size(value: str) -> int:
    """``64MiB``, ``100MB``, ``1048576`` -> bytes."""
    text = value.strip().lower().replace(" ", "")
    units = {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "b": 1}
    for unit, factor in units.items():
        if text.endswith(unit):
            try:
                return int(float(text[: -len(unit)]) * factor)
            except ValueError:
                break
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--max-payload {value!r} must be a size like 64MiB or 100MB") from None


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


def _names(line: str, magic: str) -> list[str]:
    """A line magic's ``NAME [BACKEND]``, or the usage sentence."""
    parts = shlex.split(line)
    if not parts:
        raise UsageError(f"usage: %{magic} NAME (see %elastic_jobs for names)")
    return parts


def _stop_quietly(runner: Any, name: str) -> None:
    try:
        runner.cancel(name)
    except (NotebookElasticError, KeyboardInterrupt):
        pass


@magics_class
class ElasticMagics(Magics):
    @magic_arguments()
    @argument("--nnodes", default="1:1", help="nodes as N or MIN:MAX (elastic range), like torchrun. Default 1:1.")
    @argument("--nodes", type=int, default=None, help="nodes to start with (default: MIN).")
    @argument("--nproc-per-node", dest="nproc_per_node", default="1", help="worker processes per node. Default 1.")
    @argument(
        "--max-restarts",
        dest="max_restarts",
        default=str(defaults.MAX_RESTARTS),
        help="restart budget per agent, like torchrun.",
    )
    @argument(
        "--name", default=None, help="job name (lowercase letters, digits, '-'); also the variable holding the job."
    )
    @argument("--backend", default="local", help="where to run: local (default) or kubernetes.")
    @argument(
        "--checkpoint-dir",
        dest="checkpoint_dir",
        default=None,
        help="where State() keeps checkpoints (default: the job folder).",
    )
    @argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment variable for the workers (repeatable).",
    )
    @argument(
        "--ship",
        action="append",
        default=[],
        metavar="NAME",
        help="ship this notebook variable even if it looks like a credential.",
    )
    @argument(
        "--monitor-interval",
        dest="monitor_interval",
        default=str(defaults.MONITOR_INTERVAL_S),
        help="seconds between the agent's worker checks.",
    )
    @argument(
        "--rdzv-conf", dest="rdzv_conf", default=None, help="extra rendezvous settings, k=v,k=v (torchrun syntax)."
    )
    @argument(
        "--collective-timeout",
        dest="collective_timeout",
        default=str(defaults.COLLECTIVE_TIMEOUT_S),
        help="seconds before a collective op times out.",
    )
    @argument(
        "--stall-timeout",
        dest="stall_timeout",
        default=None,
        help="restart the worker group (one restart) when no step came for this many seconds; "
        "a stall is always told after 30 s.",
    )
    @argument(
        "--max-payload", dest="max_payload", default=None, help="refuse payloads above this size (default 64MiB)."
    )
    @argument("--namespace", default=None, help="kubernetes: the namespace (default: the context's).")
    @argument("--context", default=None, help="kubernetes: the kubeconfig context (default: the current one).")
    @argument(
        "--image", default=None, help="kubernetes: the container image (needs torch; default a PyTorch CUDA image)."
    )
    @argument(
        "--gpus", default=None, help="kubernetes: nvidia.com/gpu per pod (default: --nproc-per-node; 0 for CPU pods)."
    )
    @argument("--cpu", default=None, help="kubernetes: CPU request per pod, like 8 or 500m.")
    @argument("--memory", default=None, help="kubernetes: memory per pod, like 32Gi.")
    @argument(
        "--toleration",
        action="append",
        default=[],
        metavar="KEY=VALUE:EFFECT",
        help="kubernetes: worker toleration (repeatable).",
    )
    @argument(
        "--node-selector",
        dest="node_selector",
        action="append",
        default=[],
        metavar="LABEL=VALUE",
        help="kubernetes: worker node selector (repeatable).",
    )
    @argument(
        "--rdzv-toleration",
        dest="rdzv_toleration",
        action="append",
        default=[],
        metavar="KEY=VALUE:EFFECT",
        help="kubernetes: toleration of the rendezvous pod.",
    )
    @argument(
        "--rdzv-node-selector",
        dest="rdzv_node_selector",
        action="append",
        default=[],
        metavar="LABEL=VALUE",
        help="kubernetes: node selector of the rendezvous pod (e.g. on-demand nodes).",
    )
    @argument(
        "--priority-class", dest="priority_class", default=None, help="kubernetes: priorityClassName of the pods."
    )
    @argument(
        "--service-account", dest="service_account", default=None, help="kubernetes: serviceAccountName of the pods."
    )
    @argument(
        "--image-pull-secret",
        dest="image_pull_secret",
        action="append",
        default=[],
        metavar="NAME",
        help="kubernetes: image pull secret (repeatable).",
    )
    @argument(
        "--pvc", default=None, help="kubernetes: PersistentVolumeClaim for checkpoints (needed when MAX nodes > 1)."
    )
    @argument(
        "--shm-size", dest="shm_size", default="2Gi", help="kubernetes: size of /dev/shm in the workers (default 2Gi)."
    )
    @argument(
        "--workload",
        default="job",
        help="kubernetes: job (elastic Indexed Job, default), pods, or pytorchjob (Kubeflow).",
    )
    @argument(
        "--dry-run", dest="dry_run", action="store_true", help="print the manifest and the script; launch nothing."
    )
    @argument(
        "--export",
        default=None,
        metavar="PATH",
        help="write the script to PATH and its payload beside it; launch nothing.",
    )
    @argument("--wait", action="store_true", help="block until the job finishes.")
    @argument(
        "--fresh",
        action="store_true",
        help="start over even if a stopped, failed or lost job of this name could be resumed "
        "(its run moves to the history).",
    )
    @argument("-h", "--help", action="store_true", help="show this help; launch nothing.")
    @cell_magic
    @_errors_as_usage
    def elastic_train(self, line: str, cell: str) -> Any:
        """Run this cell as an elastic torchrun job; returns at once with the job handle."""
        args = parse_argstring(self.elastic_train, line)
        if args.help:
            print(self.elastic_train.parser.format_help())
            return None
        if args.dry_run and args.export:
            raise UsageError("--dry-run and --export both launch nothing; use one of them")
        if args.wait and (args.dry_run or args.export):
            raise UsageError("--wait waits for a launched job; it does not go with --dry-run or --export")
        try:
            nproc = int(args.nproc_per_node)
        except ValueError:
            raise UsageError(f"--nproc-per-node must be a whole number, not {args.nproc_per_node!r}") from None
        try:
            restarts = int(args.max_restarts)
        except ValueError:
            raise UsageError(f"--max-restarts must be a whole number, not {args.max_restarts!r}") from None
        ctx = NotebookContext.from_shell(self.shell)
        k8s = {
            "namespace": args.namespace,
            "context": args.context,
            "image": args.image,
            "gpus": args.gpus,
            "cpu": args.cpu,
            "memory": args.memory,
            "tolerations": args.toleration,
            "node_selector": args.node_selector,
            "rdzv_tolerations": args.rdzv_toleration,
            "rdzv_node_selector": args.rdzv_node_selector,
            "priority_class": args.priority_class,
            "service_account": args.service_account,
            "image_pull_secrets": args.image_pull_secret,
            "pvc": args.pvc,
            "shm_size": args.shm_size if args.shm_size != "2Gi" else None,
            "workload": args.workload if args.workload != "job" else None,
        }
        k8s = {k: v for k, v in k8s.items() if v not in (None, [], ())}
        extra = kubernetes_options(args.backend, k8s)
        spec = build_spec(
            nnodes=args.nnodes,
            nodes=args.nodes,
            nproc_per_node=nproc,
            max_restarts=restarts,
            backend=args.backend,
            name=args.name,
            checkpoint_dir=args.checkpoint_dir,
            env=args.env,
            ship=args.ship,
            monitor_interval_s=_float(args.monitor_interval),
            rdzv_conf=args.rdzv_conf,
            collective_timeout_s=_float(args.collective_timeout),
            stall_timeout_s=_float(args.stall_timeout) if args.stall_timeout is not None else None,
            max_payload_bytes=_size(args.max_payload) if args.max_payload else defaults.MAX_PAYLOAD_BYTES,
            backend_options={"cwd": ctx.cwd, **extra},
            notebook=ctx.notebook,
        )
        var = job_variable(self.shell.user_ns, spec.name) if not (args.export or args.dry_run) else None
        if args.export:
            path = os.path.abspath(os.path.expanduser(args.export))
            if not path.endswith(".py"):
                raise UsageError(f"--export {args.export!r} must name a .py file, like train.py")
            if not os.path.isdir(os.path.dirname(path)):
                raise UsageError(f"--export {args.export!r}: the folder {os.path.dirname(path)} does not exist")
            bundle = bundle_for(cell, spec, ctx, script_name=os.path.basename(path))
            script, payload = bundle.write(path)
            print(bundle.manifest.format())
            print(f"\nwrote {script}" + (f" and {payload}" if payload else ""))
            print(f"run it with: torchrun --nproc-per-node {spec.nproc_per_node} {script}")
            return None
        from .job import ElasticJob

        try:
            bundle = bundle_for(cell, spec, ctx)
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
    def elastic_jobs(self, line: str = "") -> Any:
        """List elastic jobs, including those started before a kernel restart."""
        backend = line.strip() or None
        return jobs(backend)

    @line_magic
    @_errors_as_usage
    def elastic_attach(self, line: str) -> Any:
        """%elastic_attach NAME [BACKEND]: re-open a job's dashboard and replay its history."""
        parts = _names(line, "elastic_attach")
        var = job_variable(self.shell.user_ns, parts[0])
        job = attach(parts[0], *(parts[1:2] or ["local"]))
        if var:
            self.shell.user_ns[var] = job
        return job

    @line_magic
    @_errors_as_usage
    def elastic_resume(self, line: str) -> Any:
        """%elastic_resume NAME: continue a lost, failed or stopped job from its latest checkpoint."""
        parts = _names(line, "elastic_resume")
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
        from .backends import get_backend

        runner = get_backend(parts[1] if len(parts) > 1 else "local")
        runner.cancel(parts[0])
        info = runner.describe(parts[0])
        print(f"{parts[0]}: {info.status if info else 'gone'}")


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(ElasticMagics)
    import notebook_elastic.runtime as runtime

    # The cells use `elastic.report(...)`, `elastic.State(...)`, as workers will.
    ipython.user_ns.setdefault("elastic", runtime)


def unload_ipython_extension(ipython: Any) -> None:
    pass

"""The Python API: ``launch``, ``jobs``, ``attach``. The magics are a thin layer over these."""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
from collections import ChainMap
from collections.abc import Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, cast

from ..backends import FOLDER_BACKENDS, backend_of, get_backend, options
from ..backends.base import Backend, JobInfo, attention_order
from ..contract.events import sig, steps_done
from ..contract.spec import SPEC_OPTIONS, JobSpec
from ..errors import BackendError, JobNotFound, PackagingError, SpecError
from ..packaging import Bundle, NotebookContext, package_cell, package_function
from ..packaging.render import same_training_code
from .job import ElasticJob

if TYPE_CHECKING:
    from ..backends.local import LocalBackend
    from .launch_options import LaunchOptions

    if sys.version_info >= (3, 11):
        from typing import Unpack
    else:
        from typing_extensions import Unpack


def build_spec(
    *,
    backend_options: Mapping[str, Any] | None = None,
    notebook: str | None = None,
    **values: Any,
) -> JobSpec:
    """A validated ``JobSpec`` from the spec's options (``JobSpec``'s declared fields), their
    declared defaults for the rest (``SpecError`` on the first bad one)."""
    spec_values, per_backend, launching = options.split(values, surface="build_spec()")
    apart = [k for part in per_backend.values() for k in part]
    if apart or launching:
        raise SpecError(f"build_spec() takes the job's own options, not {', '.join([*apart, *launching])}")
    return JobSpec(
        **options.spec_given(spec_values), backend_options=dict(backend_options or {}), notebook=notebook
    ).validated()


def spec_from_options(
    values: Mapping[str, Any], ctx: NotebookContext, *, surface: str, backend_options: Mapping[str, Any] | None = None
) -> JobSpec:
    """The spec of a launch from the options given to ``surface`` (the magic or ``launch()``):
    unknown options, Kubernetes options on the local backend and bad values are refused
    in one sentence, before anything is packaged."""
    spec_values, per_backend, launching = options.split(values, surface=surface)
    if launching:
        raise SpecError(f"{surface}: {', '.join(launching)} say how to launch, not what; pass them apart")
    backend = spec_values.get("backend", "local")
    return build_spec(
        **spec_values,
        notebook=ctx.notebook,
        backend_options={"cwd": ctx.cwd, **options.backend_options(backend, per_backend), **(backend_options or {})},
    )


def bundle_for(
    code_or_function: str | Callable[[], Any],
    spec: JobSpec,
    ctx: NotebookContext,
    script_name: str = "script.py",
    first_line: int = 1,
) -> Bundle:
    """``first_line``: the editor's number of the code's first line (2 under ``%%elastic_train``)."""
    options: dict[str, Any] = {
        "name": spec.name,
        "ship": spec.ship,
        "max_payload_bytes": spec.max_payload_bytes,
        "nproc_per_node": spec.nproc_per_node,
        # Locally, workers start in the notebook's folder with it on their path; pods get the
        # folder's modules the code imports shipped with the job.
        "extra_import_paths": [ctx.cwd],
        "script_name": script_name,
    }
    if spec.backend == "kubernetes":
        from ..backends.kubernetes.manifests import pod_workdir

        options["ship_local_modules"] = True
        options["pod_workdir"] = pod_workdir((spec.backend_options.get("kubernetes") or {}).get("image"))
    if isinstance(code_or_function, str):
        bundle = package_cell(code_or_function, ctx, first_line=first_line, **options)
    else:
        bundle = package_function(code_or_function, ctx, **options)
    if spec.backend == "kubernetes":
        from ..backends.kubernetes.options import KubernetesOptions, untested_torch_warning

        k8s = KubernetesOptions.from_json(spec.backend_options.get("kubernetes"))
        warning = untested_torch_warning(k8s.image, "--image")  # the store's image needs no torch
        if warning:
            bundle.launch_warnings.append(warning)
    return bundle


def announce(bundle: Bundle) -> None:
    """Say at launch what the user should know before the job runs (relative writes in pods)."""
    for warning in bundle.launch_warnings:
        print(f"warning: {warning}", file=sys.stderr)


RESUMABLE = ("lost", "failed", "stopped")


def start_or_resume(job: ElasticJob, bundle: Bundle, *, resume: bool | None = None, fresh: bool = False) -> str | None:
    """Start ``job``, or continue the earlier run of the same name: what a re-run cell means.

    An earlier run that was lost, failed or stopped is resumed from its latest checkpoint when
    the code is the same (``resume=None``, the default, or ``True``); with other code it is
    refused with the ways out, unless ``fresh=True`` starts over. An earlier run that
    succeeded is kept in the history and the job starts anew. Returns one sentence saying
    what happened to the earlier run (None when there was none)."""
    runner = job.backend
    # The earlier run, where a folder keeps it (local, Slurm), when it ran where this one runs.
    info = runner.describe(job.name) if runner.name in FOLDER_BACKENDS else None
    if info is not None and info.backend != runner.name:
        info = None  # another backend's job of that name: started anew, the earlier run kept in the history
    status = info.status if info is not None else None
    if resume and status not in RESUMABLE:
        raise BackendError(
            f"job {job.name!r} cannot be resumed: "
            + (f"it is {status}" if status else "there is no earlier run of that name")
            + "; only a lost, failed or stopped job can be"
        )
    if status in RESUMABLE and not fresh:
        old = runner.script(job.name) or ""
        step = info.summary.get("step") if info else None
        at = f" at step {step}" if step is not None else ""
        if not same_training_code(old, bundle.script):
            raise BackendError(
                f"job {job.name!r} was {status}{at} running other code than this cell's: "
                f"%elastic_resume {job.name} (or job.resume()) continues the code it ran; add --fresh "
                f"(fresh=True) to start this code over (the earlier run moves to the history), or pick another --name"
            )
        changed = _changed_options(runner, job)
        if changed:
            raise BackendError(
                f"job {job.name!r} was {status}{at} with other options than this cell's ({changed}): "
                f"%elastic_resume {job.name} (or job.resume()) continues as it ran (job.scale() and "
                f"job.set_range() change its nodes then); add --fresh (fresh=True) to start over with "
                f"these options, or pick another --name"
            )
        job.resume()
        return f"job {job.name!r} was {status}: resumed from its latest checkpoint (same code), restart budget reset"
    job.start()
    if info is not None:
        local = cast("LocalBackend", runner)  # info is only read from the local backend
        return f"the earlier run of {job.name!r} ({status}) is kept in {local.root / '.history'}"
    return None


def _changed_options(runner: Backend, job: ElasticJob) -> str:
    """The launch options this cell gives other than the earlier run of its name was started
    with (a resume continues with those: a re-run cell's new --nnodes was dropped unsaid)."""
    folder = getattr(runner, "folder", None)
    if folder is None or job.spec is None:
        return ""
    try:
        before = folder(job.name).spec()
    except (OSError, ValueError):
        return ""
    now = job.spec.to_json()

    def shown(value: Any) -> str:
        if value is None:
            return "unset"
        return ":".join(map(str, value)) if isinstance(value, list) and len(value) == 2 else str(value)

    differ = [
        f"{option.flag} {shown(now.get(option.keyword))}, it ran with {shown(before[option.keyword])}"
        for option in SPEC_OPTIONS
        if option.keyword not in ("name", "backend")
        and option.keyword in before
        and before[option.keyword] != now.get(option.keyword)
    ]
    return "; ".join(differ)


def check_withheld(bundle: Bundle, spec: JobSpec) -> None:
    missing = [name for name in bundle.withheld if name not in spec.env]
    if missing:
        name = missing[0]
        raise PackagingError(
            f"`{name}` looks like a credential, so it is not shipped; give it to the workers with "
            f"--env {name}=... (or a Kubernetes secret), or ship it explicitly with --ship {name}"
        )


def backend_for(spec: JobSpec) -> Backend:
    if spec.backend == "kubernetes":
        k8s = spec.backend_options.get("kubernetes") or {}
        return get_backend("kubernetes", namespace=k8s.get("namespace"), context=k8s.get("context"))
    return get_backend(spec.backend)


def with_elastic(ctx: NotebookContext) -> NotebookContext:
    """The namespace with the ``elastic`` name the magic's extension provides (the worker
    runtime), so that code written for ``%%elastic_train`` runs through ``launch()`` as is.
    A notebook's own ``elastic`` wins."""
    if "elastic" in ctx.namespace:
        return ctx
    import notebook_elastic.runtime as runtime

    notebook = cast("MutableMapping[str, Any]", ctx.namespace)  # a ChainMap writes only to its first map
    return dataclasses.replace(ctx, namespace=ChainMap({"elastic": runtime}, notebook))


def _caller_namespace() -> Mapping[str, Any]:
    frame = inspect.currentframe()
    try:
        caller = frame.f_back.f_back if frame and frame.f_back else None
        return caller.f_globals if caller else {}
    finally:
        del frame


def launch(
    code_or_function: str | Callable[[], Any],
    *,
    user_ns: Mapping[str, Any] | None = None,
    notebook_context: NotebookContext | None = None,
    backend_options: Mapping[str, Any] | None = None,
    **options_given: Unpack[LaunchOptions],
) -> ElasticJob:
    """Package the training code and run it as an elastic torchrun job.

    ``code_or_function``: a cell's code (names resolve in ``user_ns``, by default the
    caller's globals, i.e. the notebook) or a function taking no arguments. Returns at once
    with a live ``ElasticJob``; with ``dry_run=True`` nothing starts and ``job.start()``
    launches it later. Every error (bad option, unshippable value) is raised before
    anything starts. A job of the same name that was lost, failed or stopped is resumed
    from its checkpoint when the code is the same (``resume=True`` insists on it,
    ``fresh=True`` starts over); see ``start_or_resume``. ``options_given``: the option
    table's keywords (``LaunchOptions``, kernel/launch_options.py, for type checkers; the
    signature lists them with their defaults for help() and Shift-Tab).
    """
    ctx = with_elastic(
        notebook_context or NotebookContext.from_globals(user_ns if user_ns is not None else _caller_namespace())
    )
    resume = options_given.pop("resume", None)  # False is an answer here, not "not given"
    values = options.given(options_given)
    dry_run, fresh = bool(values.pop("dry_run", False)), bool(values.pop("fresh", False))
    spec = spec_from_options(values, ctx, surface="launch()", backend_options=backend_options)
    bundle = bundle_for(code_or_function, spec, ctx)
    if not dry_run:
        check_withheld(bundle, spec)
        announce(bundle)
    runner = backend_for(spec)
    dryrun = runner.submit_dryrun(spec, bundle)
    job = ElasticJob(spec.name, runner, spec, dryrun)
    if not dry_run:
        said = start_or_resume(job, bundle, resume=resume, fresh=fresh)
        if said:
            print(said)
    return job


launch.__signature__ = options.signature(launch)  # type: ignore[attr-defined]  # what Shift-Tab shows


def _backends(backend: str | None, **options: Any) -> list[Backend]:
    names = [backend] if backend else ["local"]
    return [get_backend(n, **options) if n == "kubernetes" else get_backend(n) for n in names]


class JobList(list[JobInfo]):
    """``jobs()``'s answer: a list of ``JobInfo`` that prints as a table."""

    def __repr__(self) -> str:
        if not self:
            return "no elastic jobs"
        rows = [("name", "backend", "status", "world", "nodes", "restarts", "step", "loss", "notebook")]
        for j in self:
            s = j.summary
            step = (
                ""
                if s.get("step") is None
                else f"{steps_done(s['step'])}" + (f"/{s['total_steps']}" if s.get("total_steps") else "")
            )
            loss = s.get("loss")
            rows.append(
                (
                    j.name,
                    j.backend,
                    j.status if not j.damaged else f"damaged: {j.damaged}",
                    str(s.get("world_size", "") or ""),
                    f"{s.get('nodes_running', 0)} ({s.get('min_nodes', '?')}:{s.get('max_nodes', '?')})",
                    f"{s.get('restarts', 0)}/{s.get('max_restarts', '?')}",
                    step,
                    "" if loss is None else sig(loss, 4),
                    os.path.basename(j.notebook or ""),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)

    _repr_pretty_ = lambda self, p, cycle: p.text(repr(self))  # noqa: E731


def jobs(backend: str | None = None, **options: Any) -> JobList:
    """Every job the backend knows, including those started by earlier kernels
    (``jobs("kubernetes", namespace=..., context=...)`` for a cluster)."""
    found: list[JobInfo] = []
    for runner in _backends(backend, **options):
        found.extend(runner.list())
    return JobList(attention_order(found))


def attach(name: str, backend: str | None = None, **options: Any) -> ElasticJob:
    """Re-open a job by name: replays its history, then follows it live. Returns once the
    history recorded so far is folded, so the handle shows the job as it is now. A local or
    Slurm job is found by its folder (``backend`` is needed only for Kubernetes)."""
    runner = backend_of(name, backend, **options)
    info: JobInfo | None = runner.describe(name)
    if info is None:
        raise JobNotFound(f"no {runner.name} job named {name!r}; %elastic_jobs lists the jobs there are")
    spec = None
    try:
        if runner.name in FOLDER_BACKENDS:
            spec = JobSpec.from_json(cast("LocalBackend", runner).folder(name).spec())
        else:
            summary = info.summary
            known = {k: summary[k] for k in ("max_restarts", "nproc_per_node") if summary.get(k) is not None}
            spec = JobSpec.from_json(
                {
                    "name": name,
                    "backend": runner.name,
                    "nnodes": [summary.get("min_nodes", 1), summary.get("max_nodes", 1)],
                    **known,
                }
            )
    except (OSError, ValueError, TypeError):
        spec = None
    job = ElasticJob(name, runner, spec)
    job._expect_resumes(info)
    job._follow()
    job._await_history()  # returns showing the job's present, not an early point of its replay
    return job

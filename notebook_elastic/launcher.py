"""The Python API: ``launch``, ``jobs``, ``attach``. The magics are a thin layer over these."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from . import defaults
from .backends import get_backend
from .backends.base import Backend, JobInfo
from .errors import BackendError, JobNotFound, PackagingError, SpecError
from .job import ElasticJob
from .packaging import Bundle, NotebookContext, package_cell, package_function
from .packaging.render import same_training_code
from .spec import JobSpec, new_name, parse_nnodes


def build_spec(
    *,
    nnodes: str | int | tuple[int, int] = "1:1",
    nproc_per_node: int = 1,
    max_restarts: int = defaults.MAX_RESTARTS,
    backend: str = "local",
    name: str | None = None,
    nodes: int | None = None,
    checkpoint_dir: str | None = None,
    env: Mapping[str, str] | Iterable[str] | None = None,
    ship: Iterable[str] = (),
    monitor_interval_s: float = defaults.MONITOR_INTERVAL_S,
    rdzv_conf: str | Mapping[str, str] | None = None,
    collective_timeout_s: float = defaults.COLLECTIVE_TIMEOUT_S,
    max_payload_bytes: int = defaults.MAX_PAYLOAD_BYTES,
    backend_options: Mapping[str, Any] | None = None,
    notebook: str | None = None,
) -> JobSpec:
    """A validated ``JobSpec`` from keyword options (``SpecError`` on the first bad one)."""
    return JobSpec(
        name=name or new_name(),
        nnodes=parse_nnodes(nnodes),
        nodes=nodes,
        nproc_per_node=nproc_per_node,
        max_restarts=max_restarts,
        backend=backend,
        checkpoint_dir=os.path.abspath(checkpoint_dir) if checkpoint_dir else None,
        env=env or {},  # type: ignore[arg-type]
        monitor_interval_s=monitor_interval_s,
        rdzv_conf=rdzv_conf or {},  # type: ignore[arg-type]
        collective_timeout_s=collective_timeout_s,
        max_payload_bytes=max_payload_bytes,
        ship=tuple(ship),
        backend_options=dict(backend_options or {}),
        notebook=notebook,
    ).validated()


def bundle_for(
    code_or_function: str | Callable[[], Any], spec: JobSpec, ctx: NotebookContext, script_name: str = "script.py"
) -> Bundle:
    options: dict[str, Any] = {
        "name": spec.name,
        "ship": spec.ship,
        "max_payload_bytes": spec.max_payload_bytes,
        "nproc_per_node": spec.nproc_per_node,
        # Locally, workers start in the notebook's folder with it on their path.
        "extra_import_paths": [ctx.cwd] if spec.backend == "local" else [],
        "script_name": script_name,
    }
    if isinstance(code_or_function, str):
        return package_cell(code_or_function, ctx, **options)
    return package_function(code_or_function, ctx, **options)


RESUMABLE = ("lost", "failed", "stopped")


def start_or_resume(job: ElasticJob, bundle: Bundle, *, resume: bool | None = None, fresh: bool = False) -> str | None:
    """Start ``job``, or continue the earlier run of the same name: what a re-run cell means.

    An earlier run that was lost, failed or stopped is resumed from its latest checkpoint when
    the code is the same (``resume=None``, the default, or ``True``); with other code it is
    refused with the ways out, unless ``fresh=True`` starts over. An earlier run that
    succeeded is kept in the history and the job starts anew. Returns one sentence saying
    what happened to the earlier run (None when there was none)."""
    runner = job.backend
    info = runner.describe(job.name) if runner.name == "local" else None  # the backend that resumes
    status = info.status if info is not None else None
    if resume and status not in RESUMABLE:
        raise BackendError(
            f"job {job.name!r} cannot be resumed: "
            + (f"it is {status}" if status else "there is no earlier run of that name")
            + "; only a lost, failed or stopped job can be"
        )
    if status in RESUMABLE and not fresh:
        old = runner.script(job.name) or ""
        if not same_training_code(old, bundle.script):
            step = info.summary.get("step") if info else None
            at = f" at step {step}" if step is not None else ""
            raise BackendError(
                f"job {job.name!r} was {status}{at} running other code than this cell's: "
                f"%elastic_resume {job.name} (or job.resume()) continues the code it ran; add --fresh "
                f"(fresh=True) to start this code over (the earlier run moves to the history), or pick another --name"
            )
        job.resume()
        return f"job {job.name!r} was {status}: resumed from its latest checkpoint (same code), restart budget reset"
    job.start()
    if info is not None:
        return f"the earlier run of {job.name!r} ({status}) is kept in {runner.root / '.history'}"  # type: ignore[attr-defined]
    return None


def check_withheld(bundle: Bundle, spec: JobSpec) -> None:
    missing = [name for name in bundle.withheld if name not in spec.env]
    if missing:
        name = missing[0]
        raise PackagingError(
            f"`{name}` looks like a credential, so it is not shipped; give it to the workers with "
            f"--env {name}=... (or a Kubernetes secret), or ship it explicitly with --ship {name}"
        )


KUBERNETES_KEYWORDS = (
    "namespace",
    "context",
    "image",
    "gpus",
    "cpu",
    "memory",
    "tolerations",
    "node_selector",
    "rdzv_tolerations",
    "rdzv_node_selector",
    "priority_class",
    "service_account",
    "image_pull_secrets",
    "pvc",
    "shm_size",
    "workload",
)


def backend_for(spec: JobSpec) -> Backend:
    if spec.backend == "kubernetes":
        k8s = spec.backend_options.get("kubernetes") or {}
        return get_backend("kubernetes", namespace=k8s.get("namespace"), context=k8s.get("context"))
    return get_backend(spec.backend)


def kubernetes_options(backend: str, given: dict[str, Any]) -> dict[str, Any]:
    """Split the Kubernetes keywords of launch() off, validated (SpecError on a bad one)."""
    picked = {k: given.pop(k) for k in list(given) if k in KUBERNETES_KEYWORDS and given[k] is not None}
    if not picked:
        return {} if backend != "kubernetes" else {"kubernetes": _k8s_parse({}).to_json()}
    if backend != "kubernetes":
        raise SpecError(f"{', '.join(sorted(picked))} only apply with backend='kubernetes'")
    return {"kubernetes": _k8s_parse(picked).to_json()}


def _k8s_parse(picked: dict[str, Any]) -> Any:
    from .backends.kubernetes.options import parse_options

    return parse_options(**picked)


def _caller_namespace() -> Mapping[str, Any]:
    frame = inspect.currentframe()
    try:
        caller = frame.f_back.f_back if frame and frame.f_back else None  # type: ignore[union-attr]
        return caller.f_globals if caller else {}
    finally:
        del frame


def launch(
    code_or_function: str | Callable[[], Any],
    *,
    nnodes: str | int | tuple[int, int] = "1:1",
    nproc_per_node: int = 1,
    max_restarts: int = defaults.MAX_RESTARTS,
    backend: str = "local",
    name: str | None = None,
    nodes: int | None = None,
    checkpoint_dir: str | None = None,
    env: Mapping[str, str] | Iterable[str] | None = None,
    dry_run: bool = False,
    resume: bool | None = None,
    fresh: bool = False,
    ship: Iterable[str] = (),
    user_ns: Mapping[str, Any] | None = None,
    notebook_context: NotebookContext | None = None,
    **options: Any,
) -> ElasticJob:
    """Package the training code and run it as an elastic torchrun job.

    ``code_or_function``: a cell's code (names resolve in ``user_ns``, by default the
    caller's globals, i.e. the notebook) or a function taking no arguments. Returns at once
    with a live ``ElasticJob``; with ``dry_run=True`` nothing starts and ``job.start()``
    launches it later. Every error (bad option, unshippable value) is raised before
    anything starts. A job of the same name that was lost, failed or stopped is resumed
    from its checkpoint when the code is the same (``resume=True`` insists on it,
    ``fresh=True`` starts over); see ``start_or_resume``.
    """
    ctx = notebook_context or NotebookContext.from_globals(user_ns if user_ns is not None else _caller_namespace())
    extra = kubernetes_options(backend, options)
    spec = build_spec(
        nnodes=nnodes,
        nproc_per_node=nproc_per_node,
        max_restarts=max_restarts,
        backend=backend,
        name=name,
        nodes=nodes,
        checkpoint_dir=checkpoint_dir,
        env=env,
        ship=ship,
        notebook=ctx.notebook,
        backend_options={"cwd": ctx.cwd, **extra, **options.pop("backend_options", {})},
        **options,
    )
    bundle = bundle_for(code_or_function, spec, ctx)
    if not dry_run:
        check_withheld(bundle, spec)
    runner = backend_for(spec)
    dryrun = runner.submit_dryrun(spec, bundle)
    job = ElasticJob(spec.name, runner, spec, dryrun)
    if not dry_run:
        said = start_or_resume(job, bundle, resume=resume, fresh=fresh)
        if said:
            print(said)
    return job


def _backends(backend: str | None, **options: Any) -> list[Backend]:
    names = [backend] if backend else ["local"]
    return [get_backend(n, **options) if n == "kubernetes" else get_backend(n) for n in names]


class JobList(list):
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
                else f"{s['step']}" + (f"/{s['total_steps']}" if s.get("total_steps") else "")
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
                    "" if loss is None else f"{loss:.4g}",
                    os.path.basename(j.notebook or ""),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)

    _repr_pretty_ = lambda self, p, cycle: p.text(repr(self))  # noqa: E731


def jobs(backend: str | None = None, **options: Any) -> JobList:
    """Every job the backend knows, including those started by earlier kernels
    (``jobs("kubernetes", namespace=..., context=...)`` for a cluster)."""
    out = JobList()
    for runner in _backends(backend, **options):
        out.extend(sorted(runner.list(), key=lambda j: j.created or 0))
    return out


def attach(name: str, backend: str = "local", **options: Any) -> ElasticJob:
    """Re-open a job by name: replays its history, then follows it live."""
    runner = _backends(backend, **options)[0]
    info: JobInfo | None = runner.describe(name)
    if info is None:
        raise JobNotFound(f"no {backend} job named {name!r}; %elastic_jobs lists the jobs there are")
    spec = None
    try:
        if backend == "local":
            spec = JobSpec.from_json(runner.folder(name).spec())  # type: ignore[attr-defined]
        else:
            summary = info.summary
            known = {k: summary[k] for k in ("max_restarts", "nproc_per_node") if summary.get(k) is not None}
            spec = JobSpec.from_json(
                {
                    "name": name,
                    "backend": backend,
                    "nnodes": [summary.get("min_nodes", 1), summary.get("max_nodes", 1)],
                    **known,
                }
            )
    except (OSError, ValueError, TypeError):
        spec = None
    job = ElasticJob(name, runner, spec)
    job._follow()
    return job

"""The import graph is the layering (every import, lazy ones included), folders by process:
runtime (with the shared vocabulary, contract/event_types.py and contract/protocol.py) <- agent/store/pool <- contract (spec, options <- plan <- events, job_state), packaging
<- jobfolder <- supervisor, backends <- kernel (waits <- job, launcher <- views/ui/magics) <-
server/cli. The contract sits below the backends and the supervisor because they speak it: each
reports Events and folds them with the one JobState. No cycles; worker-side code imports nothing
of ours outside the runtime but the shared vocabulary, which imports nothing of ours; the job never imports a view (IPython shows it through a formatter
the views register)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "notebook_elastic"

# A module may import only modules of its own layer or of a lower one.
LAYERS = [
    # The event vocabulary (Kind, Status, each kind's fields) and the names every process shares
    # (environment, store keys, exit statuses, file names) are defined once, in the contract, and
    # the workers speak them: they sit at the bottom, beside the runtime.
    {"_version", "errors", "defaults", "runtime", "plumbing", "contract.event_types", "contract.protocol"},
    # The job's processes beside its workers: the torchrun agent as we run it, the rendezvous
    # store, the warm pool. They run in pods and allocations too: nothing of the kernel's.
    {"agent", "store", "pool"},
    {"packaging", "contract.spec", "contract.options", "contract.commands"},
    {"contract.plan"},
    {"contract.events", "contract.words", "contract.job_state"},
    # The job folder: shared by the kernel's backend and the supervisor it starts.
    {"jobfolder"},
    # The supervisor is a process of the local and Slurm backends (started by module name).
    {"backends", "supervisor"},
    # The kernel's side: the job handle and what shows it.
    {"kernel.waits"},
    {"kernel.job", "kernel.launcher", "kernel.launch_options"},
    {"kernel", "kernel.views", "kernel.ui", "kernel.magics", "server", "cli", "export", "__init__"},
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def graph(typing_only: bool = True) -> dict[str, set[str]]:
    """Each module's imports of ours; ``typing_only=False`` leaves out those under ``if
    TYPE_CHECKING:``, which never run (a collaborator naming the type of the class holding it)."""
    out: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if "labextension" in path.parts:
            continue
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        tree = ast.parse(path.read_text())
        if not typing_only:
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.If)
                    and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
                ):
                    node.body = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not target.startswith("notebook_elastic"):
                    continue
                for alias in node.names:
                    candidate = f"{target}.{alias.name}"
                    as_path = PACKAGE.parent / candidate.replace(".", "/")
                    deps.add(candidate if as_path.with_suffix(".py").exists() or as_path.is_dir() else target)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("notebook_elastic")}
        out[name] = deps - {name}
    return out


def layer_of(module: str) -> int:
    """The layer of ``module``: that of the longest name in LAYERS it is (or is inside of),
    counted from below the package (``backends.slurm.cluster``, then ``backends``)."""
    parts = module.split(".")[1:] or ["__init__"]
    for depth in range(len(parts), 0, -1):
        name = ".".join(parts[:depth])
        for i, layer in enumerate(LAYERS):
            if name in layer:
                return i
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS")


def test_no_import_cycles():
    g = graph(typing_only=False)  # at run time; the layers below hold type-only imports too
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for dep in sorted(g.get(node, ())):
            if dep in path:
                cycles.append(" -> ".join([*path[path.index(dep) :], dep]))
            elif dep not in seen:
                seen.add(dep)
                visit(dep, [*path, dep])

    for start in sorted(g):
        seen = {start}
        visit(start, [start])
    assert not cycles, "\n".join(sorted(set(cycles)))


def test_every_import_goes_down_the_layers():
    against = [
        f"{module} imports {dep}"
        for module, deps in graph().items()
        for dep in deps
        if dep != "notebook_elastic" and layer_of(dep) > layer_of(module)
    ]
    assert not against, "\n".join(sorted(against))


#: What the worker side may import of ours outside its folders: the shared vocabulary alone (the
#: events, and the names every process shares).
VOCABULARY = ("notebook_elastic.contract.event_types", "notebook_elastic.contract.protocol")
#: And, beside the workers, the package's version (``_version.py``: it imports nothing; every pod
#: carries it), which names the warm pool.
VERSION = "notebook_elastic._version"


def test_the_runtime_and_the_job_import_nothing_above_them():
    g = graph()
    for name in VOCABULARY:
        assert not g[name], f"{name} is imported by workers, yet imports {g[name]}"
    # (and its package's __init__, which runs before it in every worker)
    assert not g["notebook_elastic.contract"], (
        f"contract/__init__.py runs in workers, yet imports {g['notebook_elastic.contract']}"
    )
    workers = ("notebook_elastic.runtime", "notebook_elastic.plumbing")  # the worker's API, the OS beneath it
    beside = ("notebook_elastic.agent", "notebook_elastic.store", "notebook_elastic.pool")
    for module, deps in g.items():
        if module.startswith(workers):
            outside = {d for d in deps if not d.startswith(workers) and d not in VOCABULARY}
            assert not outside, f"{module} runs in workers and pods, yet imports {outside}"
        if module.startswith("notebook_elastic.plumbing"):
            above = {d for d in deps if d.startswith("notebook_elastic.runtime")}
            assert not above, f"{module} is the plumbing beneath the runtime, yet imports {above}"
        if module.startswith(beside):
            outside = {d for d in deps if not d.startswith(workers + beside) and d not in (*VOCABULARY, VERSION)}
            assert not outside, f"{module} runs beside the workers, in pods too, yet imports {outside}"
    views = {
        d
        for d in g["notebook_elastic.kernel.job"]
        if d.startswith(("notebook_elastic.kernel.views", "notebook_elastic.kernel.ui"))
    }
    assert not views, f"the job draws itself: {views}"


def test_the_supervisor_process_loads_nothing_of_the_kernels():
    """Imported as its process starts it, the supervisor (and the job folder it writes) loads
    neither our kernel side nor IPython or the widgets: the import graph, checked at run time."""
    import subprocess
    import sys

    probe = (
        "import sys, notebook_elastic.supervisor.run, notebook_elastic.jobfolder.follow;"
        "print(sorted(m for m in sys.modules if m.startswith(('notebook_elastic.kernel', 'IPython', 'ipywidgets', 'ipykernel'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", f"the supervisor loads the kernel's side: {loaded}"


def test_a_pod_holds_every_module_of_ours_its_processes_import():
    """A cluster pod runs from the runtime zip (backends/kubernetes/code.py), not an installed
    package: every module of ours that its packages import at run time, and the packages
    around them, are in it (the event vocabulary lives in contract/, beside the pod's folders)."""
    import io
    import zipfile

    from notebook_elastic.backends.kubernetes.code import POD_PACKAGES, runtime_zip

    held = set(zipfile.ZipFile(io.BytesIO(runtime_zip())).namelist())
    g = graph(typing_only=False)
    todo = [m for m in g if m.split(".")[1:2] and m.split(".")[1] in POD_PACKAGES]
    needed: set[str] = set()
    while todo:
        module = todo.pop()
        if module in needed:
            continue
        needed.add(module)
        todo += [d for d in g.get(module, ()) if d != "notebook_elastic"]
        parts = module.split(".")
        needed |= {".".join(parts[:i]) for i in range(1, len(parts))}  # its packages' __init__
    missing = sorted(
        m
        for m in needed
        if m.replace(".", "/") + ".py" not in held and m.replace(".", "/") + "/__init__.py" not in held
    )
    assert not missing, f"a pod imports these, which its runtime zip lacks: {missing}"

"""The documentation names what is there (#38 item 9): after many renames the docs cited old
places (a schema's old path, ``warm_launch``, ``job_state.py``). Every span the docs put in
backticks (docs/**/*.md, README.md, tests/README.md) that cites a file, a module, a name of the
code, a flag, an environment variable, a magic, a CLI command or a test is checked against the
tree and the code; module docstrings' ``path.py`` and ``notebook_elastic.x`` references too.
What is not ours (torch's names, Kubernetes' and Slurm's, shell commands) is accepted from a
small explicit list, by owner, below; a span of plain words (a status, an event kind) must be a
name or a string of the code like any other."""

from __future__ import annotations

import ast
import fnmatch
import keyword
import re
import subprocess
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "notebook_elastic"
DOCS = [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md", REPO / "tests" / "README.md"]
CODE_DIRS = ("notebook_elastic", "tests", "scripts", "benchmarks", "docs")

#: Not ours, cited as they are: each owner's names, commands and flags.
FOREIGN = {
    # torch and torchelastic
    "torch": {
        "torchrun",
        "LocalElasticAgent",
        "SimpleElasticAgent",
        "_assign_worker_ranks",  # SimpleElasticAgent's, cited where the agent's store calls are bounded
        "RendezvousHandler",
        "TCPStore",
        "TCPStoreLibUvBackend",
        "PrefixStore",
        "DistributedDataParallel",
        "GradScaler",
        "init_process_group",
        "destroy_process_group",
        "fully_shard",
        "torch.compile",
        "torch._dynamo",
        "torch.distributed.checkpoint",
        "torch.cuda.max_memory_allocated",
        "dist.new_group",
        "_abort_process_group",
        "_orig_mod.",
        "read_timeout",
        "last_call_timeout",
        "join_timeout",
        "keep_alive_interval",
        "keep_alive_max_attempt",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
        "TORCH_LOGS",
        "LOGLEVEL",
        "CUDA_VISIBLE_DEVICES",
        "GLOO_SOCKET_IFNAME",
        "PR_SET_PDEATHSIG",
        "torch_contract",
        "worker_init_fn",
        "/tmp/torchelastic_*",
        "main",
        "rank",
        "world_size",
    },
    # Kubernetes, Kueue, Kubeflow
    "kubernetes": {
        "kubectl",
        "kubernetes-validate",
        "FailJob",
        "successPolicy",
        "runPolicy.backoffLimit",
        "runPolicy.suspend",
        "terminationGracePeriodSeconds",
        "ttlSecondsAfterFinished",
        "secretKeyRef",
        "DeletionByTaintManager",
        "ElasticJobsViaWorkloadSlices",
        "kueue.x-k8s.io/queue-name",
        "fieldValidation",
        "KUBECONFIG",
        "apply --dry-run=server",
        "describe",
        "delete",
        "get",
        "logs",
    },
    # Slurm
    "slurm": {
        "srun",
        "sbatch",
        "squeue",
        "scancel",
        "scontrol",
        "sinfo",
        "slurmctld",
        "slurmd",
        "munge",
        "slurm.conf",
        "OverSubscribe",
        "PreemptMode",
        "REQUEUE",
        "GraceTime",
        "KillWait",
        "SLURM_*",
        "ctl",
        "job_submit",
    },
    # trackers and their packages
    "trackers": {
        "mlflow",
        "mlflow-skinny",
        "wandb",
        "tensorboard",
        "MlflowClient",
        "EventAccumulator",
        "WANDB_MODE",
        "WANDB_PROJECT",
        "MLFLOW_TRACKING_URI",
        "mlruns/",
        "mlflow.db",
        "run-*.wandb",
        "wandb/",
    },
    # Python, IPython, Jupyter, the shell, the build tools
    "tools": {
        "python",
        "pip",
        "git",
        "bash",
        "chmod",
        "ps",
        "apt-get",
        "nvidia-smi",
        "mkdocs",
        "mypy",
        "mutmut",
        "mv",
        "runopts",  # TorchX's, the model of contract/options.py
        "pytest",
        "--durations=15",
        "/tmp/pytest-of-root/...",
        "read_csv",
        "ruff",
        "chromium",
        "jupyter",
        "%load_ext",
        "%matplotlib",
        "!pip",
        "ast.parse",
        "symtable",
        "functools.partial",
        "multiprocessing",
        "subprocess",
        "os.fork",
        "sys.executable",
        "time.sleep",
        "psutil",
        "pynvml",
        "setproctitle",
        "SO_PEERCRED",
        "/proc",
        "/tmp",
        "python:",
        ".venv",
        ".gitignore",
        "__init__",
        "@property",
        "decorator_list",
        "find_definition",
        "Out",
        "In",
        "display",
        "print",
        "open",
        "exit",
        "int()",
        "getattr(..., None)",
        "from m import *",
        "import torch",
        "import utils",
        "def",
        "await",
        "True",
        "False",
        "_",
        "..",
        "<",
        "<=",
        "[tool.mypy]",
        "pyproject.toml",
        "-m quick",
        "mutants/",
    },
}
FOREIGN_NAMES = set().union(*FOREIGN.values())
#: What the build makes, never in the tree: the wheel a user installs.
BUILT = {"notebook_elastic-*.whl"}
#: The first word of a shell command that is not ours (what follows it is theirs).
COMMANDS = {
    "kubectl",
    "pip",
    "git",
    "mlflow",
    "tensorboard",
    "wandb",
    "squeue",
    "sbatch",
    "srun",
    "scancel",
    "scontrol",
    "apt-get",
    "chmod",
    "ps",
    "nvidia-smi",
    "torchrun",
    "python",
    "mypy",
    "mkdocs",
    "mutmut",
}
#: Spans that show what a user writes in their own code or data (names of theirs, not ours).
USERS = {
    "ToyModel",
    "BATCH",
    "EPOCHS",
    "BATCH = 16",
    "EPOCHS = 100",
    "inputs",
    "toy",
    "quickstart",
    "key_dim",
    "db_password",
    "openai_key",
    "api_key",
    "password",
    "token",
    "token=",
    "HF_TOKEN",
    "OPENAI_API_KEY",
    "AKIA...",
    "ghp_...",
    "github_pat_...",
    "hf_...",
    "sk-...",
    "xox?-...",
    "Bearer ...",
    "user:password@",
    "ddp_setup()",
    'pad_token = "<pad>"',
    "max_tokens",
    "stauts",
    "config_overrides",
    "n - 1 < len(raw_lines)",
    "last_dropped[:301]",
    "num_workers > 0",
    'snapshot_path="snapshot.pt"',
    "nested=None",
    "recursive=None",
    "annotations=None",
    "filename",
    "targets",
    "changed_to",
    "train.payload.pkl",
    "main(rank, world_size, ...)",
    "pause(epoch, world_size)",
    "pause",
    "QUICKSTART OK",
    "NAME",
    "NAME-env",
    "JOB-debug-TIME.tar.gz",
}


def git_files() -> set[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    files = set(out.split())
    dirs = {str(Path(f).parents[i]) for f in files for i in range(len(Path(f).parents) - 1)}
    return files | {d + "/" for d in dirs} | dirs


@cache
def code() -> tuple[frozenset[str], frozenset[str]]:
    """(every identifier of our code: defined, used, imported; every string constant of it)."""
    names: set[str] = set()
    strings: set[str] = set()
    for top in CODE_DIRS:
        for path in (REPO / top).rglob("*.py"):
            if ".venv" in path.parts or "node_modules" in path.parts or path == Path(__file__).resolve():
                continue  # this file's own lists name what the docs cite: never evidence
            tree = ast.parse(path.read_text())
            # A docstring is prose like the docs: what it names is no evidence (``warm_launch``
            # lived on in one after the module had gone).
            docstrings = {
                id(n.body[0].value)
                for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and n.body
                and isinstance(n.body[0], ast.Expr)
                and isinstance(n.body[0].value, ast.Constant)
            }
            for node in ast.walk(tree):
                if id(node) in docstrings:
                    continue
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Name):
                    names.add(node.id)
                elif isinstance(node, ast.Attribute):
                    names.add(node.attr)
                elif isinstance(node, ast.arg):
                    names.add(node.arg)
                elif isinstance(node, ast.keyword) and node.arg:
                    names.add(node.arg)
                elif isinstance(node, ast.alias):
                    names.update(node.name.split("."))
                    if node.asname:
                        names.add(node.asname)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    strings.add(node.value)
                elif isinstance(node, ast.JoinedStr):  # f"dashboard-width-{w}.png" makes dashboard-width-*.png
                    strings.add(
                        "".join(v.value if isinstance(v, ast.Constant) else "*" for v in node.values)  # type: ignore[misc]
                    )
    for ts in (REPO / "labextension" / "src").rglob("*.ts*"):
        names |= set(re.findall(r"\b(?:interface|type|class|function|const|let|enum)\s+([A-Za-z_]\w*)", ts.read_text()))
    return frozenset(names), frozenset(strings)


@cache
def words_of_strings() -> frozenset[str]:
    """Each word of every string constant (an f-string's pieces too): kinds, statuses, file names, flags."""
    return frozenset(w for s in code()[1] for w in re.split(r"[\s,;:()'\"`{}\[\]]+", s) if w)


@cache
def flags() -> frozenset[str]:
    """Every flag we parse or write: the magic's, the CLI's, the scripts', and srun's we set ourselves."""
    from notebook_elastic.backends.options import OPTIONS
    from notebook_elastic.cli import _parser

    found = {o.flag for o in OPTIONS}
    parser, subs = _parser()
    for p in (parser, *subs.values()):
        found |= {f for action in p._actions for f in action.option_strings}
    found |= {w.split("=")[0] for w in words_of_strings() if w.startswith("-")}
    return frozenset(found)


@cache
def cli_commands() -> frozenset[str]:
    from notebook_elastic.cli import _parser

    return frozenset(_parser()[1])


@cache
def magics() -> frozenset[str]:
    from notebook_elastic.kernel.magics import ElasticMagics

    return frozenset(name for kind in ElasticMagics.magics.values() for name in kind)


@cache
def defined_tests() -> frozenset[str]:
    out = set()
    for path in (REPO / "tests").rglob("test_*.py"):
        tree = ast.parse(path.read_text())
        out |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return frozenset(out)


def defined_in(path: str) -> set[str]:
    """The names a module of the tree defines or assigns at any depth (``path`` as the docs cite it)."""
    for base in ("", "notebook_elastic/", "tests/"):
        if (REPO / base / path).is_file():
            tree = ast.parse((REPO / base / path).read_text())
            break
    else:
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
    return found


def spans(text: str) -> list[tuple[int, str]]:
    """(line, span) for each `span` outside fenced code blocks; a span may go on over a line
    break within its paragraph, as Markdown reads it."""
    lines = text.splitlines()
    fenced = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines[i] = ""
        elif fenced:
            lines[i] = ""
    kept = "\n".join(lines)
    return [
        (kept.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split()))
        for m in re.finditer(r"(?<!`)`((?:[^`\n]|\n(?!\s*\n))+)`(?!`)", kept)
    ]


PLACEHOLDER = re.compile(r"\b(?:[A-Z][A-Z_]*[A-Z]|N)\b|\.\.\.|<[^>]+>|\*")
FILE_EXT = re.compile(r"\.(py|md|json|jsonl|sh|ts|ipynb|toml|pkl|yaml|yml|css|png|log|txt|mjs|whl|tar\.gz|pt|csv)$")
#: Folders of the machine a path may start from (not ours to check).
MACHINE = ("/tmp", "/proc", "/dev", "~", "$NOTEBOOK_ELASTIC_HOME", "..")


def _tree_dirs() -> set[str]:
    """The first parts a path of the tree starts with (its folders, and the package's)."""
    files = git_files()
    return {f.split("/")[0] for f in files if "/" in f} | {
        f.split("/")[1] for f in files if f.startswith("notebook_elastic/") and f.count("/") > 1
    }


def _known_word(part: str) -> bool:
    """A path's part that is a name the code uses (a string of it, or a word of one), or the
    name of a file or folder of the tree; placeholders (NAME, PID, *) stand for any."""
    if not PLACEHOLDER.search(part):
        files = git_files()
        words = words_of_strings()
        return any(c in words or c in code()[1] for c in (part, part + "/", part.rstrip("/"))) or any(
            Path(f).name == part.rstrip("/") for f in files
        )
    pattern = re.compile(
        "^" + PLACEHOLDER.sub(".+", re.escape(part).replace(r"\*", "*").replace(r"\.\.\.", "...")) + "/?$"
    )
    return (
        any(pattern.match(w) for w in words_of_strings())
        or any(pattern.match(Path(f).name) for f in git_files())
        or any(fnmatch.fnmatchcase(part, made) for made in made_names())
    )


@cache
def made_names() -> frozenset[str]:
    """The names the code makes from an f-string, as globs (f"dashboard-{name}.png":
    dashboard-*.png, which a cited dashboard-width-*.png is one of); only those that start and
    end with their own letters, so that an f"{x}" accepts nothing."""
    return frozenset(
        w
        for w in words_of_strings()
        if "*" in w and "/" not in w and len(w) > 4 and w[0] not in "*." and w[-1] != "*" and "**" not in w
    )


def check_path(path: str) -> str | None:
    """None when ``path`` is a file or folder of the tree (from the repository's root, the
    package's, the tests' or the docs'), or, for a place the code makes (a job folder's
    ``logs/NODE.log``, ``~/.local/share/notebook-elastic``), when each part is a name the code
    writes; a path into the tree is held to the tree."""
    path = path.rstrip(",.;:")
    if path.startswith(("http://", "https://")):
        return None
    files = git_files()
    bare = path[2:] if path.startswith("./") else path
    for base in ("", "notebook_elastic/", "tests/", "docs/", "labextension/"):
        if (base + bare) in files or (base + bare.rstrip("/")) in files:
            return None
    parts = [p for p in bare.split("/") if p]
    if not parts:
        return None
    if parts[0] in _tree_dirs() and not path.startswith(MACHINE):
        if PLACEHOLDER.search(bare):
            pattern = re.compile("^" + PLACEHOLDER.sub(".+", re.escape(bare).replace(r"\*", "*")) + "$")
            if any(pattern.match(f) for f in files):
                return None
        return "no such file or folder in the tree"
    if not PLACEHOLDER.search(bare) and len(parts) > 1:
        # A file of the tree cited under a folder it is not in (``schema/events.schema.json``).
        homes = [f for f in files if Path(f).name == parts[-1] and "." in parts[-1]]
        if homes and not any(f.endswith("/" + bare) for f in homes):
            return f"the tree's {parts[-1]} is {' or '.join(homes)}"
    for root in MACHINE:
        if bare.startswith(root):
            parts = [p for p in bare[len(root) :].split("/") if p]
    missing = [p for p in parts if not _known_word(p)]
    return f"{', '.join(missing)}: no file of the tree, nor a name the code writes" if missing else None


def check_name(name: str) -> str | None:
    """None when ``name`` (an identifier, or a dotted one) is a name of our code (each part after
    the first; a first part may be the user's variable), or a string of it."""
    names, strings = code()
    if name in names or name in strings or name in words_of_strings() or name in FOREIGN_NAMES:
        return None
    parts = name.split(".")
    if parts[0] == "notebook_elastic":
        import importlib

        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for attr in parts[i:]:
                if not hasattr(obj, attr):
                    return f"notebook_elastic has no {name}"
                obj = getattr(obj, attr)
            return None
        return f"notebook_elastic has no {name}"
    unknown = [p for p in parts[1:] if p and p not in names and p not in FOREIGN_NAMES]
    if len(parts) == 1:
        unknown = parts
    return f"{', '.join(unknown)}: not a name of the code" if unknown else None


def _flag_problems(words: list[str]) -> list[str]:
    return [
        f"no flag {w.split('=')[0]}"
        for w in words
        if w.startswith("-") and len(w) > 1 and w.split("=")[0] not in flags() and w not in FOREIGN_NAMES
    ]


IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
ATTRIBUTE_OR_KEYWORD = re.compile(r"\.([A-Za-z_]\w*)|\b([A-Za-z_]\w*)\s*=(?!=)")
QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")


def check_span(span: str) -> list[str]:
    """What in ``span`` names nothing there (empty when all is)."""
    s = span.strip()
    names, strings = code()
    if not s or s in FOREIGN_NAMES or s in USERS or s in strings:
        return []
    words = s.split()
    first = words[0]
    if re.fullmatch(r"(?:test_\w+\.py|lb)?::\w+(?:\[[^\]]*\])?", s):
        test = re.search(r"::(\w+)", s).group(1)
        return [] if test in defined_tests() else [f"no test {test}"]
    if s.startswith("%"):
        magic = first.lstrip("%")
        problems = [] if magic in magics() or first in FOREIGN_NAMES else [f"no magic {first}"]
        return problems + _flag_problems(words[1:])
    if first == "notebook-elastic" and len(words) > 1:
        commands = [c for c in words[1].split("|") if not PLACEHOLDER.search(c)]
        return [f"no command notebook-elastic {c}" for c in commands if c not in cli_commands()] + _flag_problems(
            words[2:]
        )
    if first in cli_commands() and len(words) > 1:  # a CLI command as its help writes it
        return _flag_problems(words[1:])
    if (
        first in COMMANDS
        or first in ("bash", "python")
        or first.startswith(".venv/bin/")
        or "=" in first
        and first.isupper()
    ):
        # Theirs, but a script or file of ours they are given must be there.
        return [
            f"{w}: {p}"
            for w in words[1:]
            if ("/" in w or FILE_EXT.search(w)) and w not in BUILT and (p := check_path(w))
        ]
    if s.startswith("-"):
        return _flag_problems(words[:1])
    if len(words) == 2 and first.endswith(".py") and IDENTIFIER.fullmatch(words[1]):
        # A module and a name in it (`pool/warm.py start_zygote`): the name is defined there.
        problem = check_path(first)
        if problem:
            return [problem]
        return [] if words[1] in defined_in(first) else [f"{first} defines no {words[1]}"]
    var = s.lstrip("$").split("=")[0]
    if re.fullmatch(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9*]+)+", var):
        return [] if var in strings or var in words_of_strings() or var in FOREIGN_NAMES else [f"no variable {var}"]
    if (
        "(" not in s
        and (" " not in s or all("/" in w or FILE_EXT.search(w) or w.startswith("-") for w in words))
        and ("/" in first or FILE_EXT.search(first) or first.startswith("."))
    ):
        problem = check_path(first)
        return ([problem] if problem else []) + _flag_problems(words[1:])
    if re.fullmatch(r"[A-Za-z_][\w.]*(?:\(\))?", s):
        name = s.removesuffix("()").rstrip(".")
        if keyword.iskeyword(name):
            return []
        problem = check_name(name)
        return [problem] if problem else []
    # Code: every attribute it reads and every keyword it passes is a name of ours (or of torch...).
    problems = []
    for attr, kwarg in ATTRIBUTE_OR_KEYWORD.findall(QUOTED.sub('""', s)):
        n = attr or kwarg
        if n not in names and n not in FOREIGN_NAMES and not keyword.iskeyword(n):
            problems.append(f"{n}: not a name of the code")
    return problems + _keyword_problems(s)


@cache
def parameters() -> dict[str, frozenset[str] | None]:
    """Each function or method name of ours: the keywords its definitions take together (None
    where one takes ``**kwargs``: any keyword)."""
    found: dict[str, set[str] | None] = {}
    for top in ("notebook_elastic",):
        for path in (REPO / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = node.args
                    taken = found.setdefault(node.name, set())
                    if a.kwarg is not None or taken is None:
                        found[node.name] = None
                    else:
                        taken |= {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
    return {k: (frozenset(v) if v is not None else None) for k, v in found.items()}


def _keyword_problems(span: str) -> list[str]:
    """A call of one of our functions with a keyword none of its definitions takes
    (``job.scale(2, wait_s=1)``)."""
    try:
        tree = ast.parse(span)
    except SyntaxError:
        return []
    problems = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        taken = parameters().get(func or "")
        if func is None or taken is None or func in FOREIGN_NAMES:
            continue
        problems += [f"{func}() takes no {k.arg}" for k in node.keywords if k.arg and k.arg not in taken]
    return problems


def test_every_file_and_name_the_docs_cite_is_there():
    problems = []
    for doc in DOCS:
        for number, span in spans(doc.read_text()):
            for problem in check_span(span):
                problems.append(f"{doc.relative_to(REPO)}:{number}: `{span}`: {problem}")
    assert not problems, f"{len(problems)} citations name nothing there:\n" + "\n".join(problems)


DOCSTRING_PATH = re.compile(r"``([\w./-]+\.(?:py|json|ts|md|sh))``|\b((?:[a-z_]+/)+[a-z_]+\.py)\b")


def docstring_problems(path: Path, doc: str) -> list[str]:
    """What the docstring ``doc`` of the module at ``path`` cites that is not there."""
    problems = []
    files = git_files()
    for quoted, bare in DOCSTRING_PATH.findall(doc):
        cited = quoted or bare
        here = path.parent.relative_to(REPO)
        candidates = [cited, f"notebook_elastic/{cited}", f"{here}/{cited}", f"{here.parent}/{cited}"]
        if "/" not in cited:
            candidates += [f for f in files if f.endswith("/" + cited)]
        if not any(c in files for c in candidates) and cited not in words_of_strings():
            problems.append(f"{path.relative_to(REPO)}: {cited}")
    for name in re.findall(r"``([A-Za-z_]\w*)``", doc):  # a bare name (``warm_launch``)
        if not PLACEHOLDER.fullmatch(name) and (problem := check_name(name)):
            problems.append(f"{path.relative_to(REPO)}: {name}: {problem}")
    for dotted in re.findall(r"\bnotebook_elastic(?:\.\w+)+", doc):
        problem = check_name(dotted)
        if problem:
            problems.append(f"{path.relative_to(REPO)}: {dotted}: {problem}")
    return problems


def test_module_docstrings_name_modules_that_are_there():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        problems += docstring_problems(path, ast.get_docstring(ast.parse(path.read_text())) or "")
    assert not problems, "module docstrings cite what is not there:\n" + "\n".join(problems)


#: Names the docs once cited after they had moved or gone (#38 item 9), and slips of each kind
#: the check reads: each must be found.
PLANTED = [
    "warm_launch",
    "schema/events.schema.json",
    "runtime/events.schema.json",
    "notebook_elastic/contract/job_state.py",
    "notebook_elastic.kernel.job.ElasticJob.rescale",
    "pool/warm.py start_zygot",
    "--torchrun-restart",
    "%elastic_stpo",
    "notebook-elastic scael",
    "%%elastic_train --nodse 2",
    "test_job_state.py::test_no_such_claim",
    "NOTEBOOK_ELASTIC_JOB_FOLDER",
    "job.scale(2, wait_s=1)",
    "logs/NODE.lgo",
]
#: Their right spellings, which must pass.
TRUE = [
    "contract/events.schema.json",
    "notebook_elastic/contract/job_state/",
    "notebook_elastic.kernel.job.ElasticJob.scale",
    "pool/warm.py start_zygote",
    "--torchrun-restarts",
    "%elastic_stop",
    "notebook-elastic stop",
    "%%elastic_train --nodes 2",
    "test_job_state.py::test_every_view_counts_steps_done_alike",
    "NOTEBOOK_ELASTIC_JOB_DIR",
    "logs/NODE.log",
]


def test_the_check_finds_a_name_that_is_not_there():
    """The check can fail: each planted slip is found, each right spelling is not."""
    missed = [span for span in PLANTED if not check_span(span)]
    assert not missed, f"the check took these for names that are there: {missed}"
    wrong = {span: check_span(span) for span in TRUE if check_span(span)}
    assert not wrong, wrong
    event_types = PACKAGE / "contract" / "event_types.py"
    assert docstring_problems(event_types, "the document (``schema/events.schema.json``)")
    assert docstring_problems(event_types, "the document (``runtime/events.schema.json``)")
    assert not docstring_problems(event_types, "the document (``contract/events.schema.json``)")
    assert docstring_problems(event_types, "see notebook_elastic.runtime.no_such_module")
    assert docstring_problems(event_types, "The launcher lives in ``warm_launch``.")
    assert not docstring_problems(event_types, "The launcher lives in ``pool/launch.py``.")

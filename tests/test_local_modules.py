"""The notebook's own modules and relative paths, where workers never saw the notebook's folder.

Pure parts first (which imports, which writes, which files, the size refusal); then the
real thing: a job on the loopback Kubernetes API server (tests/k8s_apiserver.py) whose fake
kubelet runs each pod in an empty directory of its own, so `import utils` only works if the
module was shipped with the job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cells

from notebook_elastic.agent.run import unpack_workdir_files
from notebook_elastic.contract import protocol
from notebook_elastic.errors import PackagingError
from notebook_elastic.packaging import NotebookContext, package_cell
from notebook_elastic.packaging.analysis import imported_modules
from notebook_elastic.packaging.files import relative_reads, relative_writes
from notebook_elastic.packaging.modules import local_files, local_modules

TUTORIAL_TRAINER = """
class Trainer:
    def __init__(self, model, snapshot_path="snapshot.pt", lr=0.1, name="run.v1"):
        self.snapshot_path = snapshot_path

    def save(self, epoch):
        torch.save({"epoch": epoch}, self.snapshot_path)
        with open("train_log.csv", "a") as f:
            f.write(str(epoch))
        with open("/mnt/data/log.txt", "w") as f:
            pass
        open("config.yaml").read()
        torch.save(self.model, f"runs/{epoch}.pt")
"""


def test_relative_writes_are_found_with_their_line():
    found = relative_writes(TUTORIAL_TRAINER)
    assert found == [
        (3, "__init__(snapshot_path='snapshot.pt')"),
        (8, "open('train_log.csv', 'a')"),
        (13, "torch.save(..., 'runs/...')"),
    ]
    assert relative_writes("torch.save(model, '/checkpoints/m.pt')\nopen(p, 'w')\nopen('a.txt')") == []


def test_imported_modules_include_imports_inside_functions():
    source = "import utils\nfrom helpers.metrics import accuracy\ndef f():\n    import lazy_mod\nfrom . import rel"
    assert imported_modules(source) == {"utils", "helpers.metrics", "helpers.metrics.accuracy", "lazy_mod"}


@pytest.fixture(autouse=True)
def _fresh_local_modules(monkeypatch):
    """Each test's `utils` and `helpers` are its own folder's, not a cached earlier test's."""
    for name in [n for n in sys.modules if n.split(".")[0] in ("utils", "helpers")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [n for n in sys.modules if n.split(".")[0] in ("utils", "helpers")]:
        del sys.modules[name]


def test_relative_reads_are_the_literal_paths_the_code_opens():
    source = (
        "cfg = json.load(open('config.json'))\n"
        "w = torch.load('init.pt')\n"
        "df = pd.read_csv('data/train.csv')\n"
        "open('out.txt', 'w')\n"
        "open('/etc/hosts')\n"
        "open(path)\n"
        "open('notes.md', 'rb')\n"
    )
    assert relative_reads(source) == ["config.json", "data/train.csv", "init.pt", "notes.md"]


def test_local_files_are_those_inside_the_folder_not_ignored(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "secret.key").write_text("k")
    (tmp_path / ".gitignore").write_text("*.key\n")
    (tmp_path.parent / "outside.txt").write_text("x")
    files = local_files(["config.json", "secret.key", "missing.csv", "../outside.txt"], tmp_path)
    assert files == {"config.json": b"{}"}


def test_the_agent_unpacks_shipped_files_without_overwriting_the_images_own(tmp_path, monkeypatch):
    import zipfile

    archive = tmp_path / "files.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("config.json", "{}")
        zf.writestr("data/train.csv", "a,b")
        zf.writestr("existing.txt", "shipped")
        zf.writestr("../escape.txt", "no")
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "existing.txt").write_text("the image's")
    monkeypatch.setenv(protocol.ENV_WORKDIR_FILES, str(archive))
    assert sorted(unpack_workdir_files(str(workdir))) == ["config.json", "data/train.csv"]
    assert (workdir / "data" / "train.csv").read_text() == "a,b"
    assert (workdir / "existing.txt").read_text() == "the image's"
    assert not (tmp_path / "escape.txt").exists()


def _folder(tmp_path):
    (tmp_path / "utils.py").write_text("import helpers.metrics\nSCALE = 7\n")
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "__init__.py").write_text("")
    (tmp_path / "helpers" / "metrics.py").write_text("def accuracy(p, t):\n    return 1.0\n")
    (tmp_path / "helpers" / "generated.py").write_text("BLOB = 1\n")
    (tmp_path / "unused.py").write_text("X = 1\n")
    return tmp_path


def test_local_modules_follow_their_own_imports_and_respect_gitignore(tmp_path):
    folder = _folder(tmp_path)
    (folder / ".gitignore").write_text("generated.py\n")
    found = local_modules({"utils", "torch", "os.path"}, folder)
    assert sorted(found.files) == ["helpers/__init__.py", "helpers/metrics.py", "utils.py"]
    # In a git work tree, git itself decides.
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    (folder / ".gitignore").write_text("helpers/metrics.py\n")
    assert sorted(local_modules({"utils"}, folder).files) == [
        "helpers/__init__.py",
        "helpers/generated.py",
        "utils.py",
    ]


def test_local_modules_over_the_limit_are_refused_naming_the_biggest_files(tmp_path):
    folder = _folder(tmp_path)
    (folder / "helpers" / "weights.py").write_text("W = " + repr(list(range(40_000))) + "\n")
    with pytest.raises(PackagingError) as err:
        local_modules({"helpers"}, folder, limit_bytes=100_000)
    message = str(err.value)
    assert "the notebook's own modules the code imports (helpers) are" in message
    assert "the biggest files are helpers/weights.py (" in message
    assert "keep data out of .py files" in message and ".gitignore" in message


def test_a_kubernetes_bundle_ships_the_modules_the_code_imports(shell, tmp_path, monkeypatch):
    folder = _folder(tmp_path)
    monkeypatch.syspath_prepend(str(folder))  # a kernel has its folder on sys.path
    run_cells(shell, "import torch\nimport utils", "from helpers.metrics import accuracy", TUTORIAL_TRAINER.strip())
    ctx = NotebookContext.from_shell(shell)
    bundle = package_cell(
        "t = Trainer(None)\nprint(utils.SCALE, accuracy(1, 1))",
        ctx,
        extra_import_paths=[ctx.cwd],
        ship_local_modules=True,
        pod_workdir="/workspace",
    )
    assert sorted(bundle.modules) == ["helpers/__init__.py", "helpers/generated.py", "helpers/metrics.py", "utils.py"]
    shown = bundle.manifest.format()
    assert "utils" in shown and "module" in shown and "2 of the notebook's own modules" in shown
    assert len(bundle.launch_warnings) == 3
    assert bundle.launch_warnings[0].startswith(
        "class `Trainer` (cell [3]), line 2: __init__(snapshot_path='snapshot.pt') writes to a relative path, "
        "in the pod's working directory (/workspace), which vanishes with the pod"
    )
    # Locally nothing ships: the workers run in the folder itself.
    assert package_cell("print(utils.SCALE)", ctx, extra_import_paths=[ctx.cwd]).modules == {}


@pytest.mark.slow
def test_kubernetes_pods_import_the_notebooks_own_modules(shell, home, tmp_path, monkeypatch, capsys):
    from k8s_apiserver import FakeCluster

    import notebook_elastic as ne

    (tmp_path / "project").mkdir()
    folder = _folder(tmp_path / "project")
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    run_cells(shell, "import torch\nimport utils", "from helpers.metrics import accuracy")
    ctx = NotebookContext.from_shell(shell)
    assert ctx.cwd == str(folder)
    (folder / "config.json").write_text('{"lr": 0.25}')
    cell = (
        "import os, json\n"
        "elastic.report(step=0, scale=utils.SCALE, acc=accuracy(1, 1), here=int(os.path.exists('utils.py')),\n"
        "              lr=json.load(open('config.json'))['lr'])\n"
        "torch.save({'w': 1}, 'model.pt')\n"
    )
    fake = FakeCluster(gpu_slots=0)
    try:
        monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig(tmp_path / "kubeconfig")))
        options = dict(backend="kubernetes", nproc_per_node=2, gpus=0, notebook_context=ctx)
        dry = ne.launch(cell, name="own-modules", dry_run=True, **options)
        assert "# the notebook's own modules, shipped in the ConfigMap (modules.zip, on the workers' path): " in (
            dry.dryrun.text
        )
        assert "helpers/metrics.py, utils.py" in dry.dryrun.text
        assert "# working directory of the workers: /workspace, the working directory of the default image" in (
            dry.dryrun.text
        )
        assert "# files the code reads by a relative name, unpacked into that working directory (files.zip): " in (
            dry.dryrun.text
        )
        assert "# warning: the cell, line 4: torch.save(..., 'model.pt') writes to a relative path" in dry.dryrun.text
        capsys.readouterr()
        job = ne.launch(cell, name="own-modules", **options)
        launched = capsys.readouterr().err
        assert "warning: the cell, line 4: torch.save(..., 'model.pt') writes to a relative path" in launched
        try:
            assert job.wait(300) == "succeeded", f"{job.summary()}\n" + "\n".join(job.logs[-20:])
        finally:
            job.stop()
    finally:
        fake.close()
    assert job.metrics.last("scale") == 7 and job.metrics.last("acc") == 1.0 and job.metrics.last("lr") == 0.25
    assert job.metrics.last("here") == 0, "the pod ran where the user's files are: the test proves nothing"


def test_the_local_dry_run_says_the_workers_work_in_the_notebooks_folder(shell, home, tmp_path, capsys):
    shell.run_cell_magic("elastic_train", "--name where --dry-run", "print(open('data.csv').read())\n")
    text = capsys.readouterr().out
    assert f"working directory of the workers: {tmp_path} (the notebook's folder, on their path" in text


def test_our_own_package_never_ships_as_a_notebook_module():
    """A notebook inside a checkout of notebook-elastic imports it from its folder: it ships
    in the runtime zip, never again (over the size limit) as the notebook's own module."""
    from notebook_elastic.packaging.modules import local_modules

    repo = Path(__file__).resolve().parents[1]
    assert local_modules(["notebook_elastic.runtime", "notebook_elastic"], repo).modules == {}

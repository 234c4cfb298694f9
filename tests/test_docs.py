"""What the documentation shows against what ships (#39 item 11): the tutorial's cells are the
quickstart notebook's, the built site publishes pages and images, not the build's own code, and
the shipped notebooks are stored as a fresh clone should have them: no outputs, no counts."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import REPO


def _code_cells(name: str) -> list[str]:
    nb = json.loads((REPO / "notebooks" / name).read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _python_blocks(markdown: str) -> list[str]:
    return [m.group(1).rstrip("\n") for m in re.finditer(r"```python\n(.*?)```", markdown, re.S)]


def test_the_tutorials_training_cell_is_the_notebooks():
    """The tutorial's copy of the training cell dropped the pause that makes the story
    possible; it is the notebook's cell, and every line of its other cells is in the notebook."""
    tutorial = (REPO / "docs" / "tutorial.md").read_text()
    blocks = _python_blocks(tutorial)
    cells = _code_cells("quickstart.ipynb")
    training = next(c for c in cells if c.startswith("%%elastic_train"))
    assert training in blocks, "the tutorial's training cell is not the notebook's"
    notebook_lines = {line.strip() for cell in cells for line in cell.splitlines()}
    for block in blocks:
        for line in block.splitlines():
            assert line.strip() in notebook_lines, f"the tutorial shows a line the notebook has not: {line!r}"
    assert "resumes at epoch 35" not in tutorial and "at epoch 35**" not in "".join(cells)


@pytest.mark.parametrize("name", ["quickstart.ipynb", "over-quota.ipynb", "kubernetes.ipynb"])
def test_the_shipped_notebooks_are_stored_without_outputs(name):
    """What JupyterLab's autosave adds to a notebook a person ran (outputs, execution counts,
    widget state, the kernel's language_info) is never committed: a fresh clone's notebooks are
    clean, and scripts/strip_notebook.py (the git filter scripts/setup.sh installs) keeps them so."""
    nb = json.loads((REPO / "notebooks" / name).read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, cell["source"][:1]
        assert cell.get("metadata", {}) == {}, cell["source"][:1]
    assert set(nb["metadata"]) == {"kernelspec"}, nb["metadata"]
    stripped = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "strip_notebook.py")],
        input=(REPO / "notebooks" / name).read_text(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert stripped == (REPO / "notebooks" / name).read_text(), "the stored notebook is not in the filter's form"


@pytest.mark.slow
def test_the_built_site_publishes_no_build_code(tmp_path):
    """docs/hooks.py was published into the built site."""
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (site / "tutorial" / "index.html").exists()
    assert sorted(p.relative_to(site).as_posix() for p in site.rglob("*.py")) == []


def test_a_notebook_run_in_jupyterlab_leaves_nothing_to_commit(tmp_path):
    """#39 item 11: JupyterLab wrote into the tracked notebooks what a run adds (outputs, counts,
    widget state), and on merely opening one the kernel's language_info and display name. In a
    clone set up as the README says (scripts/setup.sh runs scripts/git_filters.sh), the notebook
    keeps them on disk, and git has no change to show or to commit."""
    import nbformat

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=120)
    (clone / ".venv").symlink_to(REPO / ".venv")  # what setup.sh makes there
    subprocess.run(["bash", "scripts/git_filters.sh"], cwd=clone, check=True, timeout=60)
    path = clone / "notebooks" / "quickstart.ipynb"
    nb = nbformat.read(path, as_version=4)
    for count, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.execution_count = count + 1
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"cell {count} ran\n")]
        cell.metadata["execution"] = {"iopub.status.busy": "2024-05-02T10:00:00Z"}
    # What JupyterLab 4 wrote on opening it (seen in Chromium): the kernel's language_info.
    nb.metadata["language_info"] = {"name": "python", "version": "3.11.7", "pygments_lexer": "ipython3"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nbformat.write(nb, path)

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=clone, capture_output=True, text=True, check=True).stdout

    assert git("diff", "--stat") == ""
    git("add", "--all", "notebooks")
    assert git("diff", "--cached", "--stat") == "" and git("status", "--porcelain", "--untracked-files=no") == ""
    assert "cell 0 ran" in path.read_text()  # the run's outputs stay the person's


@pytest.mark.slow
@pytest.mark.browser
def test_the_options_reference_never_breaks_a_flag_at_900_1280_and_1920_px(tmp_path):
    """#39 item 9: the options reference broke flags mid-word (`--nproc-` / `per-node`). The
    built site in Chromium: no flag, keyword or kind of a table spans two lines; screenshots in
    test-artifacts/docs-options-*.png."""
    from browser import chromium_page, require_chromium
    from conftest import ARTIFACTS

    require_chromium()
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    split = {}
    ARTIFACTS.mkdir(exist_ok=True)
    with chromium_page(tmp_path) as page:
        for width in (900, 1280, 1920):
            page.set_viewport_size({"width": width, "height": 1000})
            for name in ("options", "events"):
                page.goto((site / "reference" / name / "index.html").as_uri())
                page.wait_for_selector("td code")
                split[(name, width)] = page.evaluate(
                    """() => [...document.querySelectorAll('td code')].filter(e => {
                         const tops = [...e.getClientRects()].map(r => r.top);
                         return Math.max(...tops) - Math.min(...tops) > 2;
                       }).map(e => e.textContent)"""
                )
                page.screenshot(path=str(ARTIFACTS / f"docs-{name}-{width}.png"))
    assert all(v == [] for v in split.values()), {k: v for k, v in split.items() if v}

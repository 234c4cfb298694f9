"""``launch()`` from a plain Python script takes the README's code as the magic does: the
``elastic`` name included, without the user importing it."""

from __future__ import annotations

import json
import re

import pytest
from conftest import REPO, python

pytestmark = pytest.mark.slow


def readme_cell() -> str:
    """The README's %%elastic_train example, its body as written (fewer steps)."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"```python\n%%elastic_train [^\n]*\n(.*?)```", text, re.S)
    assert block, "the README has no %%elastic_train example"
    body = block.group(1)
    assert "state.steps(1000)" in body
    return body.replace("state.steps(1000)", "state.steps(6)")


# A user's own train.py: the README's notebook cells, then launch() instead of the magic.
USER_SCRIPT = """
import json
import torch, torch.nn as nn
import notebook_elastic

class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 1)

    def forward(self, x):
        return self.fc(x)

inputs = torch.randn(256, 10)

def train():
    import torch.distributed as dist
    elastic.report(step=0, world=dist.get_world_size())

CELL = {cell!r}

if __name__ == "__main__":
    assert "elastic" not in globals()
    out = {{}}
    for name, code in (("readme-code", CELL), ("readme-function", train)):
        job = notebook_elastic.launch(code, nproc_per_node=2, name=name)
        status = job.wait(300)
        job.stop()
        out[name] = {{"status": status, "reason": job.reason, "step": job.state.step,
                     "loss": job.metrics.last("loss"), "world": job.metrics.last("world"),
                     "imports_elastic": "import notebook_elastic.runtime as elastic" in job.script}}
    assert "elastic" not in globals()  # the user's namespace is left as it was
    print(json.dumps(out))
"""


def test_the_readme_examples_run_through_launch_from_a_plain_script(home, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT.format(cell=readme_cell()))
    done = python(str(script), cwd=tmp_path, env={"NOTEBOOK_ELASTIC_HOME": str(home)}, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    code, function = out["readme-code"], out["readme-function"]
    assert code["status"] == "succeeded", code
    assert code["imports_elastic"] and code["step"] == 5 and code["loss"] is not None
    assert function["status"] == "succeeded", function
    assert function["imports_elastic"] and function["world"] == 2

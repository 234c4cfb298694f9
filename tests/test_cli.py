"""The `notebook-elastic` command, run as users run it: the installed console script, in a
subprocess, against real job folders and a real notebook file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch
from conftest import torchrun

import notebook_elastic as ne
import notebook_elastic.runtime as runtime

CLI = Path(sys.executable).with_name("notebook-elastic")


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def test_the_console_script_is_installed_and_says_what_is_wrong(home):
    assert CLI.exists(), "pip install did not create the notebook-elastic command"
    listed = cli("jobs")
    assert listed.returncode == 0 and listed.stdout.strip() == "no elastic jobs"
    missing = cli("status", "nope")
    assert missing.returncode == 4
    assert missing.stderr.strip() == "notebook-elastic: no local job named 'nope'; `notebook-elastic jobs` lists them"
    assert cli("scale", "nope", "two").returncode == 2  # argparse: not a number
    assert cli("frobnicate").returncode == 2


@pytest.mark.parametrize(
    ("args", "usage", "said"),
    [
        (["stauts", "x"], "usage: notebook-elastic [-h] COMMAND", "did you mean 'status'?"),
        (
            ["logs", "x", "--tial", "5"],
            "usage: notebook-elastic logs ",
            "unrecognized arguments: --tial 5; did you mean --tail?",
        ),
        (["logs", "x", "--tail", "five"], "usage: notebook-elastic logs ", "'five' is not a number of lines"),
        (
            ["logs", "x", "--since", "5 minutes"],
            "usage: notebook-elastic logs ",
            "like 10m, 90s or 1h30m, or a clock time",
        ),
        (["scale", "x", "--nodes", "2"], "usage: notebook-elastic scale ", "unrecognized arguments"),
    ],
)
def test_a_typo_gets_what_was_probably_meant_and_a_bad_flag_its_own_commands_usage(home, args, usage, said):
    """#39 item 10: no "did you mean" on a typo, and a bad flag of a subcommand printed the
    top-level usage."""
    done = cli(*args)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.startswith(usage), done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_missing_job_is_said_in_a_terminals_words_not_a_notebooks(home):
    """#39 item 10: `stop` pointed a terminal user to %elastic_jobs, a notebook magic."""
    done = cli("stop", "nope")
    assert done.returncode == 4
    assert "%elastic" not in done.stderr and "`notebook-elastic jobs` lists them" in done.stderr, done.stderr


def test_since_reads_how_long_ago_or_a_clock_time_of_today():
    from notebook_elastic.cli import _since

    now = time.mktime((2024, 5, 2, 15, 0, 0, 0, 0, -1))
    assert _since("10m", now) == now - 600 and _since("1h30m", now) == now - 5400 and _since("90s", now) == now - 90
    assert _since("14:05", now) == now - 55 * 60
    assert _since("16:00", now) == now + 3600 - 86400  # still to come today: yesterday's


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["status", ".."], "the job name '..' is not a valid name"),
        (["stop", "../jobs/term"], "the job name '../jobs/term' is not a valid name"),
        (["events", "/etc"], "the job name '/etc' is not a valid name"),
        (["logs", "term", "--node", "../../../../x"], "--node '../../../../x' is not a node of a job"),
        (["status", "a" * 300], "the job name 'aaaa"),
        (["resume", "Bad_Name"], "(for example 'bad-name')"),
    ],
)
def test_a_name_that_is_a_path_or_too_long_is_refused_in_one_sentence_before_anything_is_read(home, args, said):
    """The CLI takes job names as the server's routes do: a name, never a path (``stop
    ../jobs/NAME`` acted on NAME, ``logs NAME --node ../../x`` printed a file outside the job,
    a 300-character name ended in ``OSError: File name too long``)."""
    (home / "jobs" / "term").mkdir(parents=True, exist_ok=True)
    done = cli(*args)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("notebook-elastic: ") and said in lines[0], done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


TRAIN = """
model = torch.nn.Linear(2, 1)
state = elastic.State(model=model)
print(f"hello from rank {elastic.rank()}", flush=True)
for step in state.steps(TOTAL):
    while step >= HOLD_AT and not os.path.exists(GATE):  # the test opens it: states, not seconds
        time.sleep(0.05)
    elastic.report(step=step, loss=1.0 / (step + 1))
    state.commit()
    time.sleep(0.05)
"""


@pytest.mark.slow
def test_a_job_driven_from_the_terminal_status_scale_logs_stop_resume_events(home, tmp_path):
    # Held before step 100 until resumed: a loaded machine's CLI calls once outlasted the job,
    # which had succeeded by the time the test stopped it.
    gate = tmp_path / "resumed"
    names = {"torch": torch, "elastic": runtime, "time": time, "os": os, "TOTAL": 150, "HOLD_AT": 100}
    job = ne.launch(TRAIN, nnodes="1:2", name="term", user_ns={**names, "GATE": str(gate)})
    deadline = time.monotonic() + 90
    while job.state.step is None or job.state.step < 3:
        assert time.monotonic() < deadline, job.summary()
        time.sleep(0.1)
    status = cli("status", "term", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["status"] == "running"
    scaled = cli("scale", "term", "2")
    assert scaled.returncode == 0 and scaled.stdout.strip() == "term: scaling to 2 node(s)"
    deadline = time.monotonic() + 90
    while job.world_size != 2:
        assert time.monotonic() < deadline, job.summary()
        time.sleep(0.1)
    logs = cli("logs", "term", "--node", "0")
    assert logs.returncode == 0 and "hello from rank 0" in logs.stdout
    # The ranks' protocol lines (one per metric) are the supervisor's, not the user's: shown on demand.
    assert "@@elastic" not in logs.stdout
    raw = cli("logs", "term", "--node", "0", "--protocol")
    assert raw.returncode == 0 and '@@elastic {"kind":"metric"' in raw.stdout and "hello from rank 0" in raw.stdout
    assert "no node 'node-7'" in cli("logs", "term", "--node", "7").stderr
    # #39 item 10: the last lines of each node, and what came since, in the order it came.
    tail = cli("logs", "term", "--tail", "2")
    assert tail.returncode == 0, tail.stderr
    by_node = {}
    for line in tail.stdout.splitlines():
        by_node.setdefault(line.split("]")[0] + "]", []).append(line)
    assert set(by_node) == {"[node-0]", "[node-1]"} and all(len(v) <= 2 for v in by_node.values()), tail.stdout
    since = cli("logs", "term", "--since", "1h")
    assert since.returncode == 0 and "[node-0] hello from rank 0" in since.stdout, since.stdout[-2000:]
    assert "@@elastic" not in since.stdout
    assert cli("logs", "term", "--since", "0s").stdout == ""  # nothing came since now
    meant = cli("status", "trem")
    assert meant.returncode == 4 and meant.stderr.strip().endswith("did you mean 'term'?"), meant.stderr
    stopped = cli("stop", "term")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == (
        "job 'term' was stopped, with every process it started; its checkpoints stay "
        "(`notebook-elastic resume term` continues it)"
    )
    resumed = cli("resume", "term")
    assert resumed.returncode == 0, resumed.stderr
    gate.touch()
    followed = cli("events", "term", "-f", timeout=240)  # returns when the job ends
    assert followed.returncode == 0
    lines = followed.stdout.splitlines()
    assert any("job_resumed" in line and "resumed after it was stopped" in line for line in lines)
    assert "job_finished" in lines[-1] and "job succeeded" in lines[-1]
    history = cli("events", "term", "--json", "--all")
    kinds = [json.loads(line)["kind"] for line in history.stdout.splitlines()]
    assert kinds.count("metric") >= 150 and kinds[-1] == "job_finished"
    assert json.loads(cli("jobs", "--json").stdout)["status"] == "succeeded"
    # #39 item 10: "job 'long' is succeeded"; a stop of a finished job is not "term: succeeded".
    again = cli("resume", "term")
    assert again.returncode == 1 and "job 'term' has succeeded; only a lost" in again.stderr, again.stderr
    done = cli("stop", "term")
    assert done.stdout.strip() == "job 'term' has succeeded already: nothing of it is left running"


@pytest.mark.slow
def test_export_runs_the_notebook_and_writes_a_script_plain_torchrun_runs(home, tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "helpers.py").write_text("def scale(x):\n    return 2 * x\n")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# A notebook as users write it"),
        nbformat.v4.new_code_cell(
            "!pip install something-we-never-install\n%matplotlib inline\nimport torch\nfrom helpers import scale"
        ),
        nbformat.v4.new_code_cell(
            "def log_line(path, text):\n    with open(path, 'a') as f:\n        print(text, file=f)\n"
            "weights = torch.arange(4.0)"
        ),
        nbformat.v4.new_code_cell("%%elastic_train --nnodes 1:2 --name never-launched\nprint('a cell we skip')"),
        nbformat.v4.new_code_cell(
            "%%elastic_train --nproc-per-node 2 --name exported\n"
            "log_line(f'log-{elastic.rank()}.csv', 'step,loss')\n"
            "print('rank', elastic.rank(), 'sum', scale(weights).sum().item())\n"
        ),
    ]
    nbformat.write(nb, folder / "train.ipynb")
    out = tmp_path / "out"
    out.mkdir()
    done = cli("export", str(folder / "train.ipynb"), "--cell", "4", "-o", str(out / "train.py"))
    assert done.returncode == 0, done.stderr
    assert f"wrote {out / 'train.py'}" in done.stdout
    assert not (home / "jobs").exists()  # exporting launched nothing
    ran = torchrun("--standalone", "--nproc-per-node", "2", "train.py", cwd=out, env={"PYTHONPATH": str(folder)})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert sorted(line for line in ran.stdout.splitlines() if line.startswith("rank")) == [
        "rank 0 sum 12.0",
        "rank 1 sum 12.0",
    ]
    assert (out / "log-1.csv").read_text() == "step,loss\n"
    bad = cli("export", str(folder / "train.ipynb"), "--cell", "9", "-o", str(out / "x.py"))
    assert bad.returncode == 1 and "train.ipynb has 4 code cells; pick one of 1..4" in bad.stderr

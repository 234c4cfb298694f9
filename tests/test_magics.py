"""The magics on a real IPython shell: bad input is one clear line and launches nothing."""

from __future__ import annotations

import time

import pytest
from conftest import job_processes, run_cells, torchrun
from IPython.core.error import UsageError

CELL = "print('training')\n"


@pytest.mark.parametrize(
    "line, cell, message",
    [
        ("--nnodes 3:1", CELL, r"--nnodes 3:1: MIN is larger than MAX; write it as 1:3"),
        ("--nnodes 0:2", CELL, r"--nnodes 0:2: the minimum number of nodes must be at least 1"),
        ("--nnodes a:b", CELL, r"--nnodes 'a:b': MIN must be a whole number, not 'a'"),
        ("--nnodes 1:2:3", CELL, r"--nnodes must be N or MIN:MAX \(for example 1:4\), not '1:2:3'"),
        ("--nnodes 1:", CELL, r"--nnodes must be N or MIN:MAX"),
        ("--nnodes 0", CELL, r"the minimum number of nodes must be at least 1"),
        ("--nnodes 1:5000", CELL, r"at most 1024 nodes"),
        ("--nproc-per-node 0", CELL, r"--nproc-per-node 0: each node needs at least 1 process"),
        ("--nproc-per-node two", CELL, r"--nproc-per-node must be a whole number, not 'two'"),
        ("--nproc-per-node -1", CELL, r"each node needs at least 1 process"),
        ("--max-restarts -1", CELL, r"--max-restarts -1 must be 0 or more"),
        ("--max-restarts lots", CELL, r"--max-restarts must be a whole number"),
        ("--backend lsf", CELL, r"--backend 'lsf' is unknown; choose one of: local, kubernetes, slurm"),
        (
            "--name My_Job",
            CELL,
            r"--name 'My_Job' is not a valid name: use lowercase letters, digits and '-'.*'my-job'",
        ),
        ("--name job-", CELL, r"--name 'job-' is not a valid name"),
        ("--name " + "a" * 60, CELL, r"is 60 characters; at most 52"),
        ("--nnodes 1:2 --nodes 3", CELL, r"--nodes 3 is outside --nnodes 1:2"),
        ("--nodes x", CELL, r"--nodes must be a whole number, not 'x'"),
        ("--env NOEQUALS", CELL, r"--env 'NOEQUALS' must be KEY=VALUE"),
        ("--env 1BAD=x", CELL, r"--env '1BAD': an environment variable name"),
        ("--monitor-interval 0", CELL, r"--monitor-interval 0.0 must be between 0 and 60 seconds"),
        ("--monitor-interval soon", CELL, r"--monitor-interval must be a number of seconds, not .soon."),
        ("--rdzv-conf last_call_timeout", CELL, r"--rdzv-conf 'last_call_timeout': each entry must be key=value"),
        ("--rdzv-conf keep_alive_max_attempt=0", CELL, r"keep_alive_max_attempt=0 must be at least 1"),
        ("--rdzv-conf is_host=true", CELL, r"is_host is chosen by the backend"),
        ("--collective-timeout 0", CELL, r"--collective-timeout 0.0 must be at least 1 second"),
        ("--max-payload lots", CELL, r"--max-payload 'lots' must be a size like 64MiB"),
        ("--dry-run --export x.py", CELL, r"--dry-run and --export both launch nothing"),
        ("--wait --dry-run", CELL, r"--wait waits for a launched job"),
        ("--export notes.txt", CELL, r"--export 'notes.txt' must name a .py file"),
        ("--export /no/such/dir/x.py", CELL, r"the folder /no/such/dir does not exist"),
        ("--ship 9lives", CELL, r"--ship '9lives' must name a notebook variable"),
        ("--nprocs 2", CELL, r"unrecognized arguments: --nprocs 2"),
        # A flag mistyped is named with the one probably meant; a prefix is no flag (torchrun's
        # own flags are whole words: --nnode launched on --nnodes before).
        ("--max-restars 3", CELL, r"unrecognized arguments: --max-restars 3; did you mean --max-restarts\?"),
        ("--nnode 1:2", CELL, r"unrecognized arguments: --nnode 1:2; did you mean --nnodes\?"),
        ("", "   \n", r"the cell is empty"),
        # Lines as the editor numbers them, the %%elastic_train line being line 1 (#39 item 6).
        ("", "undefined_thing()\n", r"name `undefined_thing` is used by the cell \(line 2\)"),
        ("", "x = 1\n%time y = 2\n", r"line 3 of the cell \('%time y = 2'\) is IPython syntax"),
        ("", "x = 1\ny = (\n", r"the cell does not parse: line 3"),
    ],
)
def test_bad_input_is_one_clear_error_and_launches_nothing(shell, home, line, cell, message):
    with pytest.raises(UsageError, match=message) as info:
        shell.run_cell_magic("elastic_train", line, cell)
    assert "\n" not in str(info.value)
    assert not (home / "jobs").exists()
    assert job_processes(home) == []


def test_usage_errors_print_one_line_without_a_traceback(shell, home, capsys):
    result = shell.run_cell("%%elastic_train --nnodes 3:1\nprint(1)\n", store_history=True)
    assert isinstance(result.error_in_exec, UsageError)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "UsageError: --nnodes 3:1: MIN is larger than MAX; write it as 1:3" in text
    assert "Traceback" not in text


def test_help_lists_torchrun_style_flags_and_launches_nothing(shell, home, capsys):
    assert shell.run_cell_magic("elastic_train", "--help", "\n") is None
    text = capsys.readouterr().out
    for flag in (
        "--nnodes",
        "--nproc-per-node",
        "--max-restarts",
        "--name",
        "--backend",
        "--checkpoint-dir",
        "--env",
        "--dry-run",
        "--export",
        "--wait",
        "--ship",
    ):
        assert flag in text
    assert not (home / "jobs").exists()


@pytest.mark.parametrize(
    "cell", ["%%elastic_train --help", "%%elastic_train --help\n\n", "%%elastic_train -h --nnodes 1:2\n"]
)
def test_help_in_a_cell_of_its_own_as_the_readme_writes_it(shell, home, capsys, cell):
    """#39 item 7: `%%elastic_train --help` in an empty cell failed ("the cell body is empty"),
    IPython's refusal of a cell magic without a body, before the magic ran."""
    result = shell.run_cell(cell, store_history=True)
    assert result.error_in_exec is None and result.error_before_exec is None, result
    text = capsys.readouterr().out
    assert "--nproc-per-node" in text and "--nnodes" in text
    assert not (home / "jobs").exists()


def test_an_empty_cell_without_help_is_still_refused(shell, home, capsys):
    result = shell.run_cell("%%elastic_train --nnodes 1:2\n", store_history=True)
    assert isinstance(result.error_in_exec, UsageError) and "cell body is empty" in str(result.error_in_exec)
    assert not (home / "jobs").exists()


def test_dry_run_prints_manifest_and_script(shell, home, capsys):
    run_cells(shell, "import math\nSCALE = 3", "def f(x):\n    return math.sqrt(x) * SCALE")
    assert (
        shell.run_cell_magic("elastic_train", "--nnodes 1:2 --nproc-per-node 2 --name demo --dry-run", "print(f(4))\n")
        is None
    )
    text = capsys.readouterr().out
    assert "Manifest of job 'demo'" in text and "SCALE" in text and "def f(x)" in text
    assert "--nnodes 1:2" in text and "--nproc-per-node 2" in text  # the agent command
    assert "def main():\n    print(f(4))" in text
    assert not (home / "jobs").exists()


def test_torchruns_underscore_spellings_are_the_flags_they_name(shell, home, capsys):
    """torchrun takes --nproc_per_node as --nproc-per-node; so does the magic ("flags follow
    torchrun"): a newcomer's --nproc_per_node 2 was refused."""
    line = "--nnodes 1:2 --nproc_per_node 2 --max_restarts 1 --name under --dry-run"
    assert shell.run_cell_magic("elastic_train", line, "print(1)\n") is None
    text = capsys.readouterr().out
    assert "--nproc-per-node 2" in text and "--max-restarts 1" in text, text
    assert not (home / "jobs").exists()


@pytest.mark.slow  # runs the export under a real torchrun
def test_export_writes_script_and_payload_that_torchrun_runs(shell, home, tmp_path, capsys):
    run_cells(shell, "import torch\nweights = torch.ones(3) * 2")
    target = tmp_path / "exported" / "train.py"
    target.parent.mkdir()
    shell.run_cell_magic("elastic_train", f"--export {target}", "print('sum', weights.sum().item())\n")
    assert target.exists() and (target.parent / "train.payload.pkl").exists()
    assert "torchrun --nproc-per-node 1" in capsys.readouterr().out
    assert not (home / "jobs").exists()
    # What it prints is what it does: torchrun runs the script, from another folder, with
    # nothing but the payload beside it.
    done = torchrun("--standalone", "--nproc-per-node", "1", str(target), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sum 6.0" in done.stdout.splitlines(), done.stdout[-2000:]


@pytest.mark.slow
def test_job_magics_launch_list_attach_and_stop(shell, home, capsys):
    import time

    run_cells(shell, "import time\nimport torch")
    cell = (
        "model = torch.nn.Linear(2, 1)\n"
        "state = elastic.State(model=model)\n"
        "for step in state.steps(100000):\n"
        "    elastic.report(step=step, loss=0.5)\n"
        "    state.commit()\n"
        "    time.sleep(0.05)\n"
    )
    job = shell.run_cell_magic("elastic_train", "--name magic-job --nnodes 1", cell)
    assert shell.user_ns["magic_job"] is job  # the job also lands in a variable named after it
    deadline = time.monotonic() + 90
    while job.state.step is None or job.state.step < 2:
        assert time.monotonic() < deadline, job.summary()
        time.sleep(0.1)
    # The listing reads status.json, the supervisor's digest, not the stream this job object
    # follows: it says "running" soon after, never at the same instant.
    listed = shell.run_line_magic("elastic_jobs", "")
    while "running" not in repr(listed):
        assert time.monotonic() < deadline and "magic-job" in repr(listed), repr(listed)
        time.sleep(0.1)
        listed = shell.run_line_magic("elastic_jobs", "")
    attached_at = job.state.step
    again = shell.run_line_magic("elastic_attach", "magic-job")
    assert again.name == "magic-job" and again is not job
    # It replays the history (from the submission on) and then follows the live job.
    deadline = time.monotonic() + 90
    while not (any(e.kind == "job_submitted" for e in again.events) and (again.state.step or 0) > attached_at):
        assert time.monotonic() < deadline, again.summary()
        time.sleep(0.1)
    shell.run_line_magic("elastic_stop", "magic-job")
    assert "magic-job: stopped" in capsys.readouterr().out
    assert job.wait(30) == "stopped"
    with pytest.raises(UsageError, match=r"no local job named 'nope'"):
        shell.run_line_magic("elastic_stop", "nope")


def test_a_job_name_never_overwrites_a_notebook_variable(shell, home):
    run_cells(shell, "import torch\ninputs = torch.randn(4, 3)")
    with pytest.raises(
        UsageError, match=r"--name 'inputs' would overwrite the notebook variable `inputs` \(a Tensor\)"
    ):
        shell.run_cell_magic("elastic_train", "--name inputs", CELL)
    assert shell.user_ns["inputs"].shape == (4, 3)
    assert not (home / "jobs" / "inputs").exists()  # refused before anything launched
    with pytest.raises(UsageError, match=r"--name 'list' would overwrite Python's built-in `list`"):
        shell.run_cell_magic("elastic_train", "--name list", CELL)
    with pytest.raises(UsageError, match=r"`inputs`"):
        shell.run_line_magic("elastic_attach", "inputs")
    # A dry run binds nothing, so it may use any name.
    assert shell.run_cell_magic("elastic_train", "--name inputs --dry-run", CELL) is None


@pytest.mark.slow
def test_interrupting_a_launch_stops_the_job_and_says_so_in_one_line(shell, home, monkeypatch):
    from notebook_elastic.backends.local import LocalBackend

    schedule = LocalBackend.schedule

    def interrupted(self, dryrun):
        schedule(self, dryrun)  # the supervisor is up, in its own session, when the user presses stop
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalBackend, "schedule", interrupted)
    run_cells(shell, "import time")
    with pytest.raises(UsageError, match=r"interrupted while launching job 'halted'; it was stopped") as info:
        shell.run_cell_magic("elastic_train", "--name halted", "time.sleep(600)\n")
    assert "\n" not in str(info.value)
    assert "halted" not in shell.user_ns
    assert LocalBackend().describe("halted").status == "stopped"
    assert job_processes(home) == []


@pytest.mark.slow
def test_elastic_resume_and_a_rerun_cell_continue_a_stopped_job(shell, home, capsys):
    run_cells(shell, "import time\nimport torch")
    cell = (
        "model = torch.nn.Linear(2, 1)\n"
        "state = elastic.State(model=model)\n"
        "for step in state.steps(TOTAL):\n"
        "    elastic.report(step=step, loss=0.5)\n"
        "    state.commit()\n"
        "    time.sleep(0.05)\n"
    )
    run_cells(shell, "TOTAL = 100000")
    job = shell.run_cell_magic("elastic_train", "--name comeback", cell)
    deadline = time.monotonic() + 90
    while job.state.step is None or job.state.step < 3:
        assert time.monotonic() < deadline, job.summary()
        time.sleep(0.1)
    shell.run_line_magic("elastic_stop", "comeback")
    assert job.wait(30) == "stopped"
    back = shell.run_line_magic("elastic_resume", "comeback")
    assert shell.user_ns["comeback"] is back
    deadline = time.monotonic() + 90
    while back.status != "running" or back.state.step is None or back.state.step <= job.state.step:
        assert time.monotonic() < deadline, back.summary()
        time.sleep(0.1)
    # Running by its events; its status file may still say pending a moment longer: either is refused.
    with pytest.raises(UsageError, match=r"job 'comeback' is (running|pending); only a lost, failed or stopped job"):
        shell.run_line_magic("elastic_resume", "comeback")
    shell.run_line_magic("elastic_stop", "comeback")
    # The same cell again: resumed, said in one line; a changed cell: refused with the ways out.
    run_cells(shell, "TOTAL = 100001")
    with pytest.raises(UsageError, match=r"running other code than this cell's: %elastic_resume comeback .* --fresh"):
        shell.run_cell_magic("elastic_train", "--name comeback", cell)
    fresh = shell.run_cell_magic("elastic_train", "--name comeback --fresh", cell)
    assert "is kept in" in capsys.readouterr().out
    fresh.stop()


def test_a_job_is_shown_by_the_views_the_extension_registers(shell, home, capsys):
    """The job knows no view: %load_ext registers the display, and a job shown without a
    kernel front end prints its summary (the text view)."""
    from notebook_elastic.kernel.launcher import launch

    job = launch("print(1)\n", dry_run=True, name="shown", user_ns={})
    assert not hasattr(job, "_ipython_display_")
    assert shell.display_formatter.ipython_display_formatter(job) is True
    assert "shown" in capsys.readouterr().out

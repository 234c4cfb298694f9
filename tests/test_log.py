"""Logging (#27 item 6): each of a job's processes writes ``notebook-elastic ROLE: message`` on
its stderr (the job folder's logs), at info by default; ``NOTEBOOK_ELASTIC_LOG=debug`` adds the
errors that were dealt with, each with its logger's name and traceback; the user's own logging
set-up in a worker is left alone. Each case runs in a fresh interpreter, as a process would."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROCESS = r"""
import logging, sys
logging.basicConfig(stream=sys.stdout, level=logging.DEBUG, format="USER %(name)s %(message)s")  # the user's own
from notebook_elastic.plumbing import log
agent = log.for_process("agent")
agent.info("stopped by signal 15; left the rendezvous")
try:
    raise ConnectionError("the store closed the connection")
except ConnectionError:
    log.get("agent.joiner").debug("the store does not answer now: tried again next time", exc_info=True)
log.for_process("worker")  # a second set-up keeps the first role
agent.warning("still the agent")
logging.getLogger("user").info("the user's own line")
"""


def run(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROCESS],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in {**os.environ, **env}.items() if v is not None},
    )


def test_a_process_says_its_lines_as_before_and_keeps_out_of_the_users_logging():
    done = run({"NOTEBOOK_ELASTIC_LOG": None})
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "notebook-elastic agent: stopped by signal 15; left the rendezvous",
        "notebook-elastic agent: still the agent",
    ]
    # Ours never reach the user's handlers, and theirs still work.
    assert done.stdout.splitlines() == ["USER user the user's own line"]


@pytest.mark.parametrize("level", ["debug", "DEBUG"])
def test_debug_shows_the_errors_that_were_dealt_with(level):
    done = run({"NOTEBOOK_ELASTIC_LOG": level})
    lines = done.stderr.splitlines()
    debug = "notebook-elastic agent [debug notebook_elastic.agent.joiner]: the store does not answer now: tried again next time"
    assert debug in lines, done.stderr
    assert "ConnectionError: the store closed the connection" in done.stderr  # its traceback below it
    assert "notebook-elastic agent: still the agent" in lines


def test_a_level_that_is_not_one_is_info():
    done = run({"NOTEBOOK_ELASTIC_LOG": "chatty"})
    assert done.stderr.splitlines()[0] == "notebook-elastic agent: stopped by signal 15; left the rendezvous"
    assert "debug" not in done.stderr

"""The dashboard in a real JupyterLab, in a real browser (Debian Chromium + Playwright).

A notebook runs a %%elastic_train cell on the local backend; the page must show the chart
gaining points, follow a move of the replica-range slider with a new world size, and stop
the job from its Stop button, with zero console errors. Screenshots go to
test-artifacts/; the report()-to-chart latency seen on the page goes to
test-artifacts/dashboard_browser.json (measured, not asserted; benchmarks/dashboard.py shows it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from browser import chromium_page, jupyter_lab, record_figures, require_chromium, training_cells, write_notebook
from conftest import ARTIFACTS, job_processes

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CELLS = training_cells("--nnodes 1:2 --nproc-per-node 1 --max-restarts 5 --name browser-job")

# Each time the chart on the page gains points, how old is its newest point?
LATENCY_PROBE = """() => {
  window.__neLatency = [];
  let lastTotal = 0;
  const observer = new MutationObserver(() => {
    const svg = document.querySelector('svg.ne-chart');
    if (!svg) return;
    const total = +svg.getAttribute('data-total-points');
    const t = parseFloat(svg.getAttribute('data-last-report-t'));
    if (total > lastTotal && t) window.__neLatency.push(Date.now() / 1000 - t);
    lastTotal = Math.max(lastTotal, total);
  });
  observer.observe(document.body, {subtree: true, childList: true, attributes: true});
}"""


def run_notebook(page, lab, notebook: str, *, collapse_left: bool = False, background: bool = False) -> None:
    """Open ``notebook`` in JupyterLab, wait for its kernel, and run all its cells (Run All's
    command; ``background``: return once the cells are sent, not once they have all run)."""
    page.goto(lab.page_url(f"lab/tree/{notebook}"))
    page.wait_for_selector(".jp-Notebook", timeout=60_000)
    page.wait_for_function(
        "() => window.jupyterapp && window.jupyterapp.shell.currentWidget && window.jupyterapp.shell.currentWidget.sessionContext && window.jupyterapp.shell.currentWidget.sessionContext.session && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel",
        timeout=60_000,
    )
    if collapse_left:
        page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.ready")
    if background:  # the command's promise resolves when every cell has run: not awaited
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    else:
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")


def chart_points(page) -> int:
    value = page.eval_on_selector("svg.ne-chart", "e => e.getAttribute('data-total-points')")
    return int(value or 0)


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)


def test_dashboard_in_jupyterlab(tmp_path):
    from browser import save_widget_state

    require_chromium()
    home = tmp_path / "ne-home"
    write_notebook(tmp_path / "train.ipynb", CELLS)
    save_widget_state(tmp_path)  # a reload then shows the kernel's live dashboard (#39 item 3)
    with jupyter_lab(tmp_path, {"NOTEBOOK_ELASTIC_HOME": str(home)}) as lab, chromium_page(tmp_path) as page:
        run_notebook(page, lab, "train.ipynb")

        page.wait_for_selector(".notebook-elastic-dashboard", timeout=60_000)
        page.evaluate(LATENCY_PROBE)
        page.wait_for_function(
            "() => { const s = document.querySelector('svg.ne-chart'); return s && +s.getAttribute('data-total-points') > 5; }",
            timeout=90_000,
        )
        first = chart_points(page)
        page.wait_for_function(
            f"() => +document.querySelector('svg.ne-chart').getAttribute('data-total-points') > {first + 20}",
            timeout=60_000,
        )
        assert page.inner_text(".ne-world-size") == "1"
        assert page.get_attribute(".ne-status", "data-status") == "running"
        shot(page, "1-running")

        # Move the replica range's lower handle from 1 to 2: range 2:2, so the job must grow.
        handle = page.locator(".notebook-elastic-dashboard .noUi-handle-lower").first
        handle.focus()
        handle.press("ArrowRight")
        page.wait_for_function("() => document.querySelector('.ne-world-size').textContent === '2'", timeout=120_000)
        page.wait_for_function(
            "() => document.querySelector('.ne-status').dataset.status === 'running'", timeout=60_000
        )
        assert "2:2" in page.inner_text(".ne-header")
        grown = chart_points(page)
        page.wait_for_function(
            f"() => +document.querySelector('svg.ne-chart').getAttribute('data-total-points') > {grown + 80}",
            timeout=60_000,
        )
        shot(page, "2-grown")

        # #39 item 8: the hint asks (amber, not the green of done) and goes with its confirmation.
        stop = page.get_by_role("button", name="Stop")
        stop.click()
        hint = page.locator(".notebook-elastic-dashboard .ne-message").first
        # The question comes back from the kernel: the range change's answer may still be shown
        # meanwhile (fresh-clone run 7 read it, not having waited for the question).
        page.wait_for_function(
            "() => (document.querySelector('.notebook-elastic-dashboard .ne-message') || {}).textContent"
            "?.includes('Confirm stop within 5 s')",
            timeout=10_000,
        )
        assert "Confirm stop within 5 s" in hint.inner_text()
        assert hint.evaluate("e => getComputedStyle(e).color") == "rgb(230, 81, 0)"  # MESSAGE_COLORS["ask"]
        shot(page, "3a-stop-asks")
        page.wait_for_function(
            "() => ![...document.querySelectorAll('.notebook-elastic-dashboard button')].some(b => b.textContent.includes('Confirm stop'))"
            " && !document.querySelector('.notebook-elastic-dashboard .ne-message')",
            timeout=15_000,
        )
        page.get_by_role("button", name="Stop").click()
        page.get_by_role("button", name="Confirm stop").click()
        page.wait_for_function(
            "() => document.querySelector('.ne-status').dataset.status === 'stopped'", timeout=60_000
        )
        shot(page, "3-stopped")
        latency = page.evaluate("() => window.__neLatency")  # (a reload below starts the page anew)

        # #39 item 3: resumed from a terminal, the job is followed by the dashboard (it kept
        # saying "stopped"), a page reload included; stopped from the terminal again, it says so.
        def cli(*args: str) -> subprocess.CompletedProcess:
            command = Path(sys.executable).with_name("notebook-elastic")
            env = dict(os.environ, NOTEBOOK_ELASTIC_HOME=str(home))
            return subprocess.run([str(command), *args], capture_output=True, text=True, timeout=120, env=env)

        assert cli("resume", "browser-job").returncode == 0
        page.wait_for_function(
            "() => document.querySelector('.ne-status').dataset.status === 'running'", timeout=120_000
        )
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
        page.reload()
        page.wait_for_selector(
            ".notebook-elastic-dashboard:not(.jupyter-widgets-disconnected) .ne-status[data-status='running']",
            timeout=90_000,
        )
        shot(page, "4-resumed-from-the-terminal-reloaded")
        assert cli("stop", "browser-job").returncode == 0
        page.wait_for_function(
            "() => document.querySelector('.notebook-elastic-dashboard .ne-status').dataset.status === 'stopped'",
            timeout=90_000,
        )
        errors = list(page.console_errors)

    assert job_processes(home) == []
    assert errors == [], errors
    lat = sorted(latency)
    if lat:
        record_figures(
            "dashboard_browser",
            {
                "what": "time from report() in the worker to the chart's SVG in the page (JupyterLab, Chromium)",
                "samples": len(lat),
                "p50_ms": round(lat[len(lat) // 2] * 1000, 1),
                "p95_ms": round(lat[int(0.95 * (len(lat) - 1))] * 1000, 1),
                "target_p95_ms": 500,
            },
        )


STATES_CELLS = [
    "%load_ext notebook_elastic",
    "import time\nimport torch",
    "%%elastic_train --nnodes 1:2 --nproc-per-node 1 --max-restarts 5 --name states\n"
    """model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
ddp = torch.nn.parallel.DistributedDataParallel(model)
for step in state.steps(STEPS):
    loss = ddp(torch.randn(8, 8)).pow(2).mean() + 10.0 / (step + 1)
    opt.zero_grad(); loss.backward(); opt.step()
    state.commit()
    elastic.report(step=step, loss=loss.item(), gen=state.generation)
    time.sleep(0.05)""",
    "%%elastic_train --nnodes 1:1 --nproc-per-node 1 --max-restarts 0 --name broken\n"
    """state = elastic.State()
for step in state.steps(100):
    elastic.report(step=step, loss=1.0 / (step + 1))
    if step == 5:
        raise ValueError(f"bad batch at step {step}")
    time.sleep(0.05)""",
]

STATUS = "(name) => {{ const d = [...document.querySelectorAll('.notebook-elastic-dashboard')].find(e => e.querySelector('.ne-header b').textContent === name); return d && d.querySelector('.ne-status').dataset.status; }}"


def dashboard(page, name: str):
    return page.locator(".notebook-elastic-dashboard", has=page.locator(".ne-header b", has_text=name)).first


def wait_status(page, name: str, statuses: tuple[str, ...], timeout: int = 120_000) -> None:
    page.wait_for_function(
        f"([name, want]) => want.includes(({STATUS.format()})(name))", arg=[name, list(statuses)], timeout=timeout
    )


def no_horizontal_overflow(page) -> list[str]:
    """Elements of the dashboards wider than their box (a horizontal scrollbar or a cut)."""
    return page.evaluate(
        """() => [...document.querySelectorAll('.notebook-elastic-dashboard, .notebook-elastic-dashboard *')]
          .filter(e => e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX !== 'visible')
          .map(e => (e.className && e.className.baseVal !== undefined ? e.className.baseVal : e.className) + ' ' + e.scrollWidth + '>' + e.clientWidth)"""
    )


def test_dashboard_states_kernel_restart_and_reload(tmp_path):
    """#11 items 7 and 8 in a real JupyterLab at 800 px of notebook: a screenshot of each
    state (pending, running, scaled, restarting, succeeded, failed with its traceback, dark
    theme); after a kernel restart the old dashboards keep their picture with the word and a
    button that follows the job again; after a reload the picture is still there."""
    from browser import save_widget_state, worktree_extension_env

    require_chromium()
    home = tmp_path / "ne-home"
    cells = list(STATES_CELLS)
    cells[1] += "\nSTEPS = 1500"
    # Its changes restart every worker as torchrun does: the restarting state lasts long enough
    # to be drawn (in place, a preemption is over in about 0.3 s; test_labextension's timeline
    # says "in place").
    cells[2] = cells[2].replace("--name states", "--name states --torchrun-restarts", 1)
    write_notebook(tmp_path / "states.ipynb", cells)
    save_widget_state(tmp_path)
    # Cold starts (no warm pool): a warm job is running in well under a second, before the
    # dashboard is first drawn, and "pending" would never be on the page to be seen.
    env = {"NOTEBOOK_ELASTIC_HOME": str(home), "NOTEBOOK_ELASTIC_WARM_POOL": "0", **worktree_extension_env(tmp_path)}
    shots = ARTIFACTS / "dashboard-states"
    shots.mkdir(parents=True, exist_ok=True)

    def snap(name: str, locator=None) -> None:
        for attempt in range(3):  # an ended job's output is re-published once: drawn anew
            try:
                if locator is not None:  # the new one, once it is on the page
                    locator.wait_for(state="visible", timeout=30_000)
                (locator or page).screenshot(path=str(shots / f"{name}.png"))
                return
            except Exception as e:
                # Caught between the old output's removal and the new one's drawing (CI saw
                # both words: "not attached", "not visible or not an HTMLElement").
                if not any(w in str(e) for w in ("not attached", "not visible")) or attempt == 2:
                    raise

    with jupyter_lab(tmp_path, env) as lab, chromium_page(tmp_path, width=1000) as page:
        run_notebook(page, lab, "states.ipynb", collapse_left=True)
        states = dashboard(page, "states")
        states.wait_for(timeout=60_000)
        wait_status(page, "states", ("pending",), timeout=60_000)
        snap("1-pending", states)
        wait_status(page, "states", ("running",))
        page.wait_for_function(
            "() => { const s = document.querySelector('svg.ne-chart'); return s && +s.getAttribute('data-total-points') > 20; }",
            timeout=90_000,
        )
        assert states.locator(".ne-loss").inner_text()
        assert states.get_by_role("button", name="Start").is_hidden()  # a running job needs no Start
        snap("2-running", states)

        # Scale to 2 from the nodes box.
        box = states.locator(".widget-text", has_text="nodes").locator("input")
        box.fill("2")
        box.press("Enter")
        states.get_by_role("button", name="Scale").click()
        page.wait_for_function(
            "() => [...document.querySelectorAll('.ne-world-size')].some(e => e.textContent === '2')", timeout=120_000
        )
        wait_status(page, "states", ("running",))
        states.locator(".widget-checkbox input").check()  # log scale
        page.wait_for_function("() => document.querySelector('svg.ne-chart').dataset.scale === 'log'", timeout=30_000)
        snap("3-scaled", states)
        overflow = no_horizontal_overflow(page)

        states.get_by_role("button", name="Preempt a node").click()
        wait_status(page, "states", ("restarting",))
        snap("4-restarting", states)
        wait_status(page, "states", ("running",))
        page.wait_for_function(
            "() => document.querySelector('.ne-timeline').textContent.includes('back at world size 1 after')",
            timeout=120_000,
        )

        broken = dashboard(page, "broken")
        wait_status(page, "broken", ("failed",))
        broken.locator(".ne-timeline summary").first.click()
        snap("5-failed-with-traceback", broken)
        assert "ValueError: bad batch at step 5" in broken.inner_text()
        # #39 item 9: the failed rank's time stood on a line of its own above its sentence.
        failed = broken.locator(".ne-event[data-kind='worker_failed'] summary").first
        when_top = failed.locator(".ne-when").evaluate("e => e.getBoundingClientRect().top")
        text_top = failed.evaluate(
            "e => { const r = document.createRange(); r.selectNodeContents(e); return r.getClientRects()[0].top; }"
        )
        assert abs(when_top - text_top) < 4, (when_top, text_top)

        wait_status(page, "states", ("succeeded",), timeout=300_000)
        snap("6-succeeded", states)
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
        page.wait_for_function(
            "() => document.body.dataset.jpThemeLight === 'false' && !document.querySelector('#jupyterlab-splash')",
            timeout=30_000,
        )
        snap("7-succeeded-dark", states)
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")

        # Kernel restart: the old dashboards keep their picture and say so.
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
        page.wait_for_selector(".notebook-elastic-dashboard.jupyter-widgets-disconnected .ne-offline", timeout=60_000)
        assert "%elastic_attach states" in states.locator(".ne-offline").inner_text()
        follow = states.locator("button.ne-attach")
        page.wait_for_function(
            "() => { const b = document.querySelector('.jupyter-widgets-disconnected button.ne-attach'); return b && !b.disabled; }",
            timeout=60_000,
        )
        snap("8-kernel-restarted", states)
        follow.click()
        page.wait_for_function(
            "() => document.querySelectorAll('.notebook-elastic-dashboard:not(.jupyter-widgets-disconnected)').length >= 1",
            timeout=120_000,
        )
        attached = page.locator(".notebook-elastic-dashboard:not(.jupyter-widgets-disconnected)").first
        page.wait_for_function(
            "() => { const d = document.querySelector('.notebook-elastic-dashboard:not(.jupyter-widgets-disconnected)'); return d && d.querySelector('.ne-status').dataset.status === 'succeeded'; }",
            timeout=60_000,
        )
        assert attached.locator(".ne-offline").is_hidden()
        snap("9-followed-again", attached)

        # Save and reload: every dashboard still shows a picture, none "model not found".
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
        page.reload()
        page.wait_for_selector(".jp-Notebook", timeout=60_000)
        page.wait_for_function(
            "() => document.querySelectorAll('.ne-header').length >= 3 && ![...document.querySelectorAll('.jp-OutputArea-output')].some(e => e.textContent === 'Error displaying widget: model not found')",
            timeout=90_000,
        )
        page.wait_for_selector(".ne-snapshot .ne-offline", timeout=30_000)
        snap("10-reloaded", None)
        # The picture a reloaded notebook keeps is the last one the kernel published, not the
        # one from when the cell ran ("pending").
        last = page.locator('.ne-snapshot[data-job="states"] .ne-status').first.get_attribute("data-status")
        assert last == "succeeded", last
        errors = [e for e in page.console_errors if "model not found" not in e]

    assert job_processes(home) == []
    assert overflow == [], overflow
    assert errors == [], errors


def test_a_kernel_that_dies_mid_run_leaves_its_last_picture(tmp_path, monkeypatch):
    """#11 item 3: the kernel goes while its job trains on. The notebook, saved afterwards and
    reloaded, shows the dashboard as it was when the kernel went (running, at a step), marked
    "not live" (its kernel gone), not the picture from when the cell ran (pending, no step)."""
    from browser import worktree_extension_env

    require_chromium()
    home = tmp_path / "ne-home"
    monkeypatch.setenv("NOTEBOOK_ELASTIC_HOME", str(home))
    cells = list(STATES_CELLS[:3])
    cells[1] += "\nSTEPS = 1_000_000"
    cells[2] = cells[2].replace("--name states", "--name midrun")
    write_notebook(tmp_path / "midrun.ipynb", cells)
    env = {"NOTEBOOK_ELASTIC_HOME": str(home), **worktree_extension_env(tmp_path)}
    twin = (
        "() => { const p = window.jupyterapp.shell.currentWidget; const c = p.content.widgets[2];"
        " const o = c.model.outputs; for (let i = 0; i < o.length; i++) { const h = o.get(i).data['text/html'];"
        " if (typeof h === 'string' && h.includes('ne-snapshot')) return h; } return ''; }"
    )
    try:
        with jupyter_lab(tmp_path, env) as lab, chromium_page(tmp_path, width=1000) as page:
            run_notebook(page, lab, "midrun.ipynb")
            wait_status(page, "midrun", ("running",), timeout=120_000)
            page.wait_for_function(
                "() => { const s = document.querySelector('svg.ne-chart'); return s && +s.getAttribute('data-total-points') > 20; }",
                timeout=90_000,
            )
            # The cell's first picture: from before the job trained (pending, or starting where the
            # launch's first events were in by then: fresh-clone run 52, under load).
            first = page.evaluate(twin)
            said = re.search(r'class="ne-status" data-status="(\w+)"', first)
            assert said and said.group(1) in ("pending", "starting"), first
            # The hidden picture the dashboard keeps current has caught up with the steps.
            page.wait_for_function(
                "() => { const t = document.querySelector('template.ne-twin-html'); return t && t.innerHTML.includes('ne-step'); }",
                timeout=30_000,
            )

            page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
            page.wait_for_selector(".notebook-elastic-dashboard.jupyter-widgets-disconnected", timeout=60_000)
            page.wait_for_function(f"() => ({twin})().includes('data-status=\"running\"')", timeout=30_000)
            page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
            page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
            page.reload()
            page.wait_for_selector('.ne-snapshot[data-job="midrun"] .ne-offline', timeout=90_000)
            status = page.locator('.ne-snapshot[data-job="midrun"] .ne-status').first.get_attribute("data-status")
            step = page.locator('.ne-snapshot[data-job="midrun"] .ne-step').first.inner_text()
            (ARTIFACTS / "dashboard-states").mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard-states" / "11-kernel-died-mid-run-reloaded.png"))
            errors = [e for e in page.console_errors if "model not found" not in e]
    finally:
        from notebook_elastic.backends.local import LocalBackend

        LocalBackend().cancel("midrun")  # the job outlives its kernel, as it should: stop it
    assert status == "running", status
    assert any(ch.isdigit() and ch != "0" for ch in step), step  # at a step, not before the first
    assert job_processes(home) == []
    assert errors == [], errors


# Values laid out over more than one line box (an inline value that wrapped inside itself), and
# the names of a path or a command (wrapped at their hyphens: "pytest-" / "78").
# (Chrome gives an inline element one rect per fragment, its children's too: lines are told
# apart by their tops.)
SPLIT_VALUES = """() => [...document.querySelectorAll('.ne-header .ne-cell, .ne-job .ne-cell, .ne-path-seg')]
  .filter(e => {
    const tops = [...e.getClientRects()].map(r => r.top);
    return tops.length && Math.max(...tops) - Math.min(...tops) > 0.8 * parseFloat(getComputedStyle(e).fontSize);
  })
  .map(e => e.textContent)"""


def _box(page, selector: str, timeout_s: float = 30.0) -> dict:
    """The element's box once it is shown: the panel redraws its rows on every poll, and an
    element between two draws has none (Playwright answers None)."""
    deadline = time.monotonic() + timeout_s
    while True:
        page.wait_for_selector(selector, state="visible", timeout=30_000)
        box = page.locator(selector).first.bounding_box()
        if box is not None or time.monotonic() > deadline:
            assert box is not None, f"{selector} stayed without a box for {timeout_s:g} s"
            return box
        page.wait_for_timeout(200)


def test_run_all_on_the_shipped_quickstart_keeps_the_dashboard_live_and_steerable(tmp_path):
    """#30 item 1: the shipped quickstart, run with the Run menu's Run All. While its later
    cells wait on the job (``job.wait_until``), the chart grows and the kernel still answers
    the dashboard: the log-scale box, a kernel-side control, takes effect while a cell waits.
    The notebook then runs to its end, its proof cell included."""
    import shutil as _shutil

    from conftest import REPO

    require_chromium()
    # The README's pictures show what a person sees: their job folder under their home
    # (~/.notebook-elastic/...), not this test's temporary path (#39 item 11).
    person = tmp_path / "home" / "reader"
    person.mkdir(parents=True)
    home = person / ".notebook-elastic"
    _shutil.copy(REPO / "notebooks" / "quickstart.ipynb", tmp_path / "quickstart.ipynb")
    busy = "() => [...document.querySelectorAll('.jp-InputArea-prompt')].some(p => p.textContent.includes('[*]'))"
    from browser import worktree_extension_env

    env = {"NOTEBOOK_ELASTIC_HOME": str(home), "HOME": str(person), **worktree_extension_env(tmp_path)}
    with jupyter_lab(tmp_path, env) as lab, chromium_page(tmp_path) as page:
        run_notebook(page, lab, "quickstart.ipynb", background=True)
        page.wait_for_selector(".notebook-elastic-dashboard svg.ne-chart", timeout=120_000)
        page.wait_for_function(
            "() => +document.querySelector('svg.ne-chart').getAttribute('data-total-points') > 3", timeout=120_000
        )
        first = chart_points(page)
        prompts = page.evaluate("() => [...document.querySelectorAll('.jp-InputArea-prompt')].map(p => p.textContent)")
        assert page.evaluate(busy), f"Run All: a later cell should be waiting on the job: {prompts}"
        page.wait_for_function(
            f"() => +document.querySelector('svg.ne-chart').getAttribute('data-total-points') > {first + 5}",
            timeout=120_000,
        )
        assert page.evaluate(busy), "the chart grew while a cell waited"
        page.locator(".notebook-elastic-dashboard").first.scroll_into_view_if_needed()
        shot(page, "run-all-live")
        # #30 item 4: at real widths, with the jobs panel open beside the notebook, no value of
        # the dashboard's header or the panel's row is split over two lines.
        page.locator(".jp-SideBar [data-id='notebook-elastic-panel']").click()
        page.wait_for_selector(".ne-job[data-name='quickstart'] .ne-stats .ne-cell", timeout=30_000)
        split, ticks = {}, {}
        for width in (900, 1280, 1920):
            page.set_viewport_size({"width": width, "height": 1000})
            page.wait_for_timeout(300)
            page.locator(".notebook-elastic-dashboard").first.scroll_into_view_if_needed()
            split[width] = page.evaluate(SPLIT_VALUES)
            # The chart's tick labels stay readable however narrow its box (screen pixels).
            ticks[width] = page.evaluate(
                "() => Math.min(...[...document.querySelectorAll('svg.ne-chart .ne-tick')]"
                ".map(t => t.getBoundingClientRect().height))"
            )
            shot(page, f"width-{width}")
        # The README's pictures (scripts/refresh_pictures.sh copies them to docs/images/): the
        # dashboard once the job has grown to 2 nodes, and the panel beside it.
        page.set_viewport_size({"width": 1280, "height": 1000})
        page.wait_for_function(
            "() => +document.querySelector('svg.ne-chart').getAttribute('data-total-points') > 45", timeout=180_000
        )
        page.locator(".notebook-elastic-dashboard").first.screenshot(path=str(ARTIFACTS / "readme-dashboard.png"))
        panel, card = _box(page, "#notebook-elastic-panel"), _box(page, ".ne-job[data-name='quickstart']")
        card_height = card["height"]  # #39 item 9: about 200 px a job (3-4 jobs at 1280x900)
        tracking = page.locator(".ne-job[data-name='quickstart'] .ne-tracking-command").first.text_content()
        height = card["y"] + card["height"] - panel["y"] + 8  # the panel's title and the job's row
        clip = {"x": panel["x"], "y": panel["y"], "width": panel["width"], "height": height}
        page.screenshot(path=str(ARTIFACTS / "readme-panel.png"), clip=clip)
        page.set_viewport_size({"width": 1400, "height": 1000})
        # A kernel-side control answered while the kernel runs a waiting cell.
        page.locator(".notebook-elastic-dashboard .widget-checkbox input").first.check()
        page.wait_for_function("() => document.querySelector('svg.ne-chart').dataset.scale === 'log'", timeout=30_000)
        still_busy = page.evaluate(busy)
        # The rest of the notebook ran after the waits: its last cell's proof is printed (or a
        # cell failed, and Run All stopped there: said at once, with what the cells printed).
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-OutputArea-output')]"
            ".some(e => e.textContent.includes('QUICKSTART OK') || e.textContent.includes('Traceback'))",
            timeout=400_000,
        )
        outputs = page.evaluate(
            "() => [...document.querySelectorAll('.jp-OutputArea-output')].map(e => e.textContent).join('\\n')"
        )
        shot(page, "run-all-done")
        assert "QUICKSTART OK" in outputs, outputs[-3000:]
        errors = list(page.console_errors)

    assert still_busy, "the log-scale box took effect only after the waiting cells were done"
    assert card_height <= 170, card_height  # 233 px before: five jobs fit a 1280x900 window now, not three
    # The folder as a person's home reads (~/...), no test's temporary path (the command itself is
    # wherever the environment is: under /tmp in a fresh clone's CI)
    logdir = tracking.split(" --logdir ", 1)[-1]
    assert logdir == "~/.notebook-elastic/jobs/quickstart", tracking
    assert split == {900: [], 1280: [], 1920: []}, split
    assert min(ticks.values()) >= 9, ticks  # was 5.6 px at a 900 px window
    assert "Traceback" not in outputs, outputs[-3000:]
    assert job_processes(home) == []
    assert errors == [], errors

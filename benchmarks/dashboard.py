"""Dashboard cost in a real kernel while a job reports ~2,000 metrics a second.

Targets (issue 4): kernel CPU spent on UI updates <= 5 % of one core; bytes sent to the
front end <= 100 KB/s. Starts an ipykernel with jupyter_client, runs the same streaming
job twice (without, then with the dashboard displayed) and measures the kernel's CPU time
(getrusage inside the kernel) and the size of the widget messages on the iopub channel.
The report()-to-page latency comes from the browser test (test-artifacts/dashboard_browser.json).
usage: python benchmarks/dashboard.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import browser_figures, report, row, stop_all_jobs  # noqa: E402

SETUP = """
%load_ext notebook_elastic
import time, resource
import notebook_elastic as ne
STREAM = '''
import time as _t
for step in range(TOTAL):
    elastic.report(step=step, loss=1.0 / (step + 1), lr=0.001)
    if step % 20 == 0:
        _t.sleep(0.01)
'''
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
"""

RUN = """
job = ne.launch(STREAM, nnodes="1", nproc_per_node=1, name="{name}", user_ns={{"TOTAL": {total}, "elastic": elastic}})
while not len(job.metrics):
    time.sleep(0.01)
{display}
c0, w0, n0 = cpu(), time.time(), len(job.metrics)
r0 = dash.renders if "dash" in globals() else 0
job.wait(300)
time.sleep(0.5)
print("RESULT", cpu() - c0, time.time() - w0, len(job.metrics) - n0, (dash.renders - r0) if "dash" in globals() else 0)
"""


def run_kernel(total: int) -> dict:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    results = {}
    try:
        kc.execute_interactive(SETUP, timeout=120)
        for label, display in (
            ("without dashboard", ""),
            (
                "with dashboard",
                "from notebook_elastic.kernel.ui import Dashboard\ndash = Dashboard(job)\ndisplay(dash)",
            ),
        ):
            seen = {"comm_bytes": 0, "printed": []}

            def on_output(msg, seen=seen):
                kind = msg["header"]["msg_type"]
                if kind in ("comm_msg", "comm_open"):
                    seen["comm_bytes"] += len(json.dumps(msg["content"])) + sum(len(b) for b in msg.get("buffers", []))
                elif kind == "stream":
                    seen["printed"].append(msg["content"]["text"])

            code = RUN.format(name=f"bench-dash-{len(results)}", total=total, display=display)
            started = time.time()
            kc.execute_interactive(code, timeout=600, output_hook=on_output)
            line = next(text for text in "".join(seen["printed"]).splitlines() if text.startswith("RESULT"))
            _, cpu_s, wall_s, metrics, renders = line.split()
            results[label] = {
                "cpu_s": float(cpu_s),
                "wall_s": float(wall_s),
                "metrics": int(metrics),
                "renders": int(renders),
                "comm_bytes": seen["comm_bytes"],
                "elapsed_s": time.time() - started,
            }
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return results


def main() -> None:
    os.environ["NOTEBOOK_ELASTIC_HOME"] = tempfile.mkdtemp(prefix="ne-bench-dash-")
    try:
        results = run_kernel(total=30000)
    finally:
        stop_all_jobs()
    base, dash = results["without dashboard"], results["with dashboard"]
    rate = dash["metrics"] / dash["wall_s"]
    base_cpu = base["cpu_s"] / base["wall_s"] * 100
    dash_cpu = dash["cpu_s"] / dash["wall_s"] * 100
    ui_cpu = dash_cpu - base_cpu
    kbps = dash["comm_bytes"] / dash["wall_s"] / 1000
    renders_per_s = dash["renders"] / dash["wall_s"]
    rows = [
        row("metrics reported (with dashboard)", rate, "metrics/s"),
        row("kernel CPU, job followed, no dashboard", base_cpu, "% of a core"),
        row("kernel CPU, job followed + dashboard", dash_cpu, "% of a core"),
        row("kernel CPU spent on UI updates", ui_cpu, "% of a core", "<= 5 %", ui_cpu <= 5),
        row("bytes sent to the front end", kbps, "KB/s", "<= 100 KB/s", kbps <= 100),
        row(
            "dashboard renders while streaming (throttled)",
            renders_per_s,
            "renders/s",
            "<= 4 /s",
            dash["renders"] <= 4 * dash["wall_s"] + 2,
        ),
    ]
    b = browser_figures("dashboard_browser")
    if b:
        rows.append(
            row(
                f"report() -> chart on the page, p95 of {b['samples']} (browser test, {b['when']})",
                b["p95_ms"],
                "ms",
                "<= 500 ms",
                b["p95_ms"] <= 500,
            )
        )
    report(
        "dashboard",
        rows,
        notes="real ipykernel via jupyter_client; widget traffic counted on iopub (comm_open + comm_msg)",
    )


if __name__ == "__main__":
    main()

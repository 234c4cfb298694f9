"""The dashboard's look and words: status and marker colours, JupyterLab's theme variables
(with light fallbacks for other front ends), what markers and departures are called, and
escaping. Shared by every renderer."""

from __future__ import annotations

import html

STATUS_COLORS = {
    "prepared": "#7e57c2",
    "pending": "#9e9e9e",
    "running": "#2e7d32",
    "restarting": "#ef6c00",
    "succeeded": "#1565c0",
    "failed": "#c62828",
    "stopped": "#546e7a",
    "lost": "#6d4c41",
}
MARKER_COLORS = {
    "world_size": "#1565c0",
    "restart": "#ef6c00",
    "failure": "#c62828",
    "node_joined": "#2e7d32",
    "node_left": "#8d6e63",
    "resumed": "#9e9e9e",
    "stall": "#c62828",
    "admitted": "#2e7d32",  # Kueue admitted the job (--queue)
    "preempted": "#8d6e63",  # Kueue preempted it: a departure, not a failure
}


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


# Colours come from JupyterLab's theme variables, with light fallbacks for other front ends
# (Notebook 7 and VS Code set their own or none): a dark theme gets a dark dashboard.
FG = "var(--jp-ui-font-color1, #222)"
FG_DIM = "var(--jp-ui-font-color2, #666)"
FG_FAINT = "var(--jp-ui-font-color3, #999)"
BG_PLOT = "var(--jp-layout-color1, #fff)"
GRID = "var(--jp-border-color2, #e0e0e0)"
LINE = "var(--jp-brand-color1, #1976d2)"
FONT = "var(--jp-ui-font-family, system-ui, sans-serif)"
MARKER_WORDS = {
    "world_size": "world size changed",
    "restart": "restart (budget)",
    "failure": "a rank failed",
    "node_joined": "node joined",
    "node_left": "node left",
    "resumed": "resumed",
    "stall": "stall",
    "admitted": "admitted by Kueue",
    "preempted": "preempted by Kueue",
}
# Why a node left, in the user's words (the supervisor's exit reasons are identifiers).
LEFT_WORDS = {
    "preempted": "preempted",
    "lost": "lost",
    "scaled_down": "released (scaled down)",
    "stopped": "stopped with the job",
    "finished": "finished",
    "files_changed": "stopped: its files changed",
    "evicted": "evicted",  # a node sent away (node_evicted says why) or a pod the cluster evicted
    "reconfigured": "restarted with the new range",
}


def left_words(reason: str | None) -> str:
    return LEFT_WORDS.get(reason or "", (reason or "left").replace("_", " "))

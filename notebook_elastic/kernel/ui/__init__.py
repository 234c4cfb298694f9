"""The widget dashboard (ipywidgets); renders in JupyterLab, Notebook 7 and VS Code."""

from __future__ import annotations

from .dashboard import Dashboard

__all__ = ["Dashboard"]

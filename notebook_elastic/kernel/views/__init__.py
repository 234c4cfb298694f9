"""Views of a job: the widget dashboard where widgets render, the text view elsewhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .text import TextView

if TYPE_CHECKING:
    from ..job import ElasticJob

__all__ = ["TextView", "display_job", "register_display", "widgets_available"]


def widgets_available() -> bool:
    """True inside a Jupyter kernel (a front end that can render widgets is attached)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def register_display(shell: Any = None) -> bool:
    """Have IPython show every ``ElasticJob`` with ``display_job`` (the job itself knows no
    view). Registered by name, so the job module need not be imported yet; idempotent.
    False outside IPython."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None:
        return False
    formatter = shell.display_formatter.ipython_display_formatter
    formatter.for_type_by_name("notebook_elastic.kernel.job", "ElasticJob", display_job)
    return True


def display_job(job: ElasticJob) -> None:
    """Show a job below the current cell: the live dashboard in a kernel, else a text view
    that prints its events as they come."""
    if widgets_available():
        from IPython import display as ipython_display

        from ..ui import Dashboard

        display: Callable[..., Any] = ipython_display.display  # IPython leaves it unannotated
        dashboard = Dashboard(job)
        dashboard.display_handle = display(dashboard, display_id=True)
        return
    print(job.summary())
    if not job.finished:
        TextView(job)

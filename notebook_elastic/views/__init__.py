"""Views of a job: the widget dashboard where widgets render, the text view elsewhere."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .text import TextView

if TYPE_CHECKING:
    from ..job import ElasticJob

__all__ = ["TextView", "display_job"]


def display_job(job: ElasticJob) -> None:
    """Show a job below the current cell: its summary now, its events as they come."""
    print(job.summary())
    if not job.finished:
        TextView(job)

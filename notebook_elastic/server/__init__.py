"""The Jupyter server extension: REST routes the "Elastic jobs" panel polls.

``GET  /notebook-elastic/api/jobs``                      every job (local; Kubernetes when a kubeconfig works)
``GET  /notebook-elastic/api/jobs/NAME/events?since=N``  a job's events after cursor N
``POST /notebook-elastic/api/jobs/NAME/stop``            stop a job and everything it started
Authenticated like every Jupyter route.
"""

from __future__ import annotations

from typing import Any


def _load_jupyter_server_extension(server_app: Any) -> None:
    from .routes import setup_handlers

    setup_handlers(server_app)
    server_app.log.info("notebook-elastic: routes at /notebook-elastic/api/")


load_jupyter_server_extension = _load_jupyter_server_extension

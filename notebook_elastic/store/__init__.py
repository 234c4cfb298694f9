"""A job's rendezvous store, served by a process of its own on a cluster (``run.py``:
``python -m notebook_elastic.store.run``; locally the supervisor hosts it): ``server.py`` (a
TCPStore server that stays bounded under any client) and ``wire.py`` (torch's TCPStore wire
protocol). It imports the runtime's vocabulary and the agent's torch adapter, nothing of the
kernel's (tests/test_layers.py)."""

"""The shared contracts, below every process that speaks them: what a job is (``spec.py``) and
how it may be asked for (``options.py``), how it is placed (``plan.py``: spec + place -> each
node's torchrun command), what happens to it (``events.py``: lines -> typed events) and what that
adds up to (``job_state/``: events -> status, ranks, restarts, metrics). The kernel, the
supervisor and every backend import them; they import only the runtime's names below. Beneath them all,
the shared vocabulary, each defined once: ``event_types.py`` (the events: kinds, statuses, each
kind's fields) and ``protocol.py`` (the names every process shares: environment, store keys, exit
statuses, file names). The workers and agents speak them too, so they import nothing of ours, and
this package's ``__init__`` (which runs first) imports nothing at all.
"""

"""The torchrun agent as a job runs it, one per node, beside the workers: ``run.py``
(``python -m notebook_elastic.agent.run [torchrun args]``: torchrun's agent, instrumented),
``torch_compat.py`` (every use of torch's private internals, in one place), ``departures.py``
(peers that left, told at once), ``joiner.py`` (a node joining a job that trains),
``notice_keeper.py`` (a cluster's SIGTERM turned into a notice: save first, then go) and
``deadline.py`` (store calls that cannot hang the agent). It imports the runtime's vocabulary
and the store and pool beside it, nothing of the kernel's (tests/test_layers.py)."""

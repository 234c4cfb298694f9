"""The torchrun agent as a job runs it, one per node, beside the workers: ``run.py``
(``python -m notebook_elastic.agent.run [torchrun args]``: torchrun's agent, instrumented),
``notebook_agent.py`` (our subclass of torchrun's agent), ``rounds.py`` (our rendezvous),
``store_link.py`` (its store, lost and regained), ``torch_adapter.py`` (torch's private names,
listed and checked), ``departures.py``
(peers that left, told at once), ``joiner.py`` (a node joining a job that trains),
``inplace.py`` (its workers kept through a change), ``fatal.py`` (a job that ends fatally),
``notice_keeper.py`` (a cluster's SIGTERM turned into a notice: save first, then go) and
``deadline.py`` (store calls that cannot hang the agent). It imports the runtime's vocabulary
and the store and pool beside it, nothing of the kernel's (tests/test_layers.py)."""

"""The operating system's plumbing every process of a job uses, kernel and workers alike: our
log lines (``log.py``), a process's facts read from ``/proc`` (``procfs.py``), whose process one
is, by the job folder named in it (``owned.py``), and the signal a process gets when its parent
dies (``parent.py``). Beneath the runtime (the workers' side, what the user's code imports) and
beside the shared vocabulary (``contract/protocol.py``, ``contract/event_types.py``): it imports
nothing of ours but that vocabulary, nothing heavy, so a launcher that starts a worker pays for
no more than it uses.
"""

"""The job folder: what a local or Slurm job is on disk, shared by the kernel that starts or
follows it and the supervisor that runs it (two processes, often of different kernels' lives).

``folder.py`` the layout and its records, ``history.py`` the bounded ``events.jsonl``,
``follow.py`` reading it as it grows, ``control.py`` the authenticated channel to the supervisor,
``place.py`` this machine as a launch plan sees it.
"""

"""The supervisor: one detached process per local or Slurm job (``python -m
notebook_elastic.supervisor.run JOB_DIR``), started by the kernel's backend and outliving it.

It hosts the job's rendezvous store, starts and stops its nodes (``nodes.py``, or Slurm
allocations through ``slurm_nodes.py``), carries out the kernel's commands (``commands.py``),
watches for stalls (``stall.py``), gives notice before it takes a node (``notices.py``), writes
the job's history (``sink.py``; TensorBoard and trackers beside it) and its outcome
(``outcome.py``). It speaks to kernels only through the job folder (``notebook_elastic.jobfolder``):
nothing here imports the kernel's side.
"""

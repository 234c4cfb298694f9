"""The kernel's side: what runs in the user's IPython kernel. ``launcher.py`` (``launch()``,
``jobs()``, ``attach()``), ``job.py`` (``ElasticJob``, the live handle a backend feeds),
``magics.py`` (``%%elastic_train`` and friends), ``waits.py`` (waits that keep the kernel
answering widgets), ``views/`` (the text view) and ``ui/`` (the ipywidgets dashboard). Nothing
below it imports it: the supervisor, the agents and the workers run without IPython.
"""

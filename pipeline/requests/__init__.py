"""The application: what a scientist may ask for (``request``), the tasks a request becomes
and the catalog searches of its plan (``search``), and what its finished products add to a
job's results (``application``, which registers it with the lifecycle)."""

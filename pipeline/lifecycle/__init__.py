"""The job and task lifecycle: a request expands to tasks (``request``, ``planner``), tasks move
through their states by one owner (``status``, ``transitions``) and reach workers (``dispatch``);
the monitor and the sweep repair what stalls (``monitor``, ``sweep``, ``health``); ``progress``
follows a task's end to its job's; the finished job is announced once (``completion``,
``notify``, ``results``)."""

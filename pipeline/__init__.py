"""bagpipe's domain: requests, jobs, tasks and their state machine, planning, stages,
completion and notification, on Azure Storage."""

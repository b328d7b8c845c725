"""bagpipe's command line and its embedded local stack (Azurite, API, planner/monitor
loop, workers, SMTP) — the same ``pipeline`` and ``worker`` code Azure runs."""

"""The Azure Functions triggers (Python v2 model), a Blueprint per kind: ``http`` (the API and
the portal), ``queues`` (the planner and completion), ``orchestration`` (the monitor's
eternal orchestration and its keeper); ``host`` holds what they share in one host process.
Each function parses its binding and calls ``pipeline``; ``function_app.py`` registers them.
"""

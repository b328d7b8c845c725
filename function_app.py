"""The Functions host's entry point, and the deployment's table of contents: the Python worker
imports ``function_app`` from the app's root and indexes the one function app it finds here,
built of the Blueprints in ``triggers/``.

- ``triggers.http``: the request API and the portal (the same FastAPI app as the local stack's);
- ``triggers.queues``: the planner (plan messages) and completion (done messages);
- ``triggers.orchestration``: the monitor, an eternal Durable Functions orchestration running
  ``pipeline.lifecycle.sweep``, its keeper (a timer) and an admin restart.
"""

import azure.durable_functions as df
import azure.functions as func

from triggers import http, orchestration, queues

app = df.DFApp(http_auth_level=func.AuthLevel.FUNCTION)
app.register_functions(http.bp)
app.register_functions(queues.bp)
app.register_functions(orchestration.bp)

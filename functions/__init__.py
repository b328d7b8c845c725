"""The Azure Functions app (Python v2 model): Blueprints registered on one app.

Thin by design: each function parses its binding and calls ``pipeline``. The host imports
the root ``function_app.py``, which exposes :data:`app`.
"""

import azure.durable_functions as df
import azure.functions as func

from functions.control import bp as control_bp
from functions.http import bp as http_bp
from functions.monitor import bp as monitor_bp

app = df.DFApp(http_auth_level=func.AuthLevel.FUNCTION)
app.register_functions(http_bp)
app.register_functions(control_bp)
app.register_functions(monitor_bp)

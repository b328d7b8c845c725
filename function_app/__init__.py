"""The Azure Functions app (Python v2 model): Blueprints registered on one app.

Thin by design: each function parses its binding and calls ``pipeline``. The host imports
this package as ``function_app`` and indexes the one ``FunctionApp`` it finds here.
"""

import azure.durable_functions as df
import azure.functions as func

from function_app.control import bp as control_bp
from function_app.http import bp as http_bp
from function_app.monitor import bp as monitor_bp

app = df.DFApp(http_auth_level=func.AuthLevel.FUNCTION)
app.register_functions(http_bp)
app.register_functions(control_bp)
app.register_functions(monitor_bp)

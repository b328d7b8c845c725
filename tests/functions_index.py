"""The Functions app as the Python worker indexes it: once per process, as the worker does
(an app's functions can be read only once)."""

from __future__ import annotations

import functools
import importlib
import json
from typing import Any

import azure.functions as func


@functools.cache
def index_app() -> tuple[list[Any], dict[str, dict[str, Any]]]:
    """What the worker's ``index_function_app`` does (once per process, as it does):
    import ``function_app``, find its one function app, read every function's metadata."""
    module = importlib.import_module("function_app")
    apps = [v for v in vars(module).values() if isinstance(v, func.FunctionRegister)]
    assert len(apps) == 1, "exactly one top-level function app"
    functions = apps[0].get_functions()
    return functions, {f.get_function_name(): json.loads(f.get_function_json()) for f in functions}


def user_function(functions: list[Any], name: str) -> Any:
    (found,) = [f for f in functions if f.get_function_name() == name]
    return found.get_user_function()

"""The Functions host's entry point: the Python worker imports ``function_app`` from the app's
root and indexes the one function app it finds there — the one ``functions/`` builds."""

from functions import app

__all__ = ["app"]

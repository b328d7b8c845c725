"""What the functions share in one host process: settings, clients, mailer, API app."""

from __future__ import annotations

from functools import cache

import azure.functions as func

from pipeline import telemetry
from pipeline.lifecycle.notify import Mailer, mailer_for
from pipeline.settings import Settings
from pipeline.storage.clients import Clients, clients_for
from pipeline.web.api import create_app


@cache
def settings() -> Settings:
    """The app's settings, read once; the first read also sets up its telemetry (Azure
    Monitor through OpenTelemetry, the attempt's fields on every record)."""
    found = Settings.from_env()
    telemetry.setup(found)
    return found


def clients() -> Clients:
    return clients_for(settings())


@cache
def mailer() -> Mailer:
    return mailer_for(settings())


@cache
def asgi() -> func.AsgiMiddleware:
    """The API app behind the Functions ASGI adapter: every request reaches it (the route
    is anonymous to the host) and it signs each in itself (a personal API token, or the
    Entra sign-in App Service Authentication forwards)."""
    return func.AsgiMiddleware(create_app(settings()))

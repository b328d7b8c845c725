"""HTTP: the request API, the same FastAPI app as on the local stack, and the portal's page
and static files. Both routes are anonymous to the Functions host: App Service
Authentication in front signs browsers in with Entra ID but lets every request through
(scripts come with personal API tokens), and the app itself refuses any API request that is
not signed in (``pipeline.web.auth``). A function key would add nothing a user could hold."""

import azure.functions as func

from triggers import host

bp = func.Blueprint()


@bp.route(
    route="{*route}",
    methods=["GET", "POST", "DELETE"],
    auth_level=func.AuthLevel.ANONYMOUS,
)
async def api(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    return await host.asgi().handle_async(req, context)


@bp.route(route="portal/{*path}", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
async def portal(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    return await host.asgi().handle_async(req, context)

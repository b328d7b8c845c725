"""HTTP: the request API, the same FastAPI app as on the local stack, behind the host's
function-key check; and the portal's page and static files, which hold no data, open to a
browser (the page asks for the key and sends it with every API call)."""

import azure.functions as func

from functions import runtime

bp = func.Blueprint()


@bp.route(
    route="{*route}",
    methods=["GET", "POST"],
    auth_level=func.AuthLevel.FUNCTION,
)
async def api(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    return await runtime.asgi().handle_async(req, context)


@bp.route(route="portal/{*path}", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
async def portal(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    return await runtime.asgi().handle_async(req, context)

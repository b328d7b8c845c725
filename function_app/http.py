"""HTTP: the request API, the same FastAPI app as on the local stack, behind the host's
function-key check."""

import azure.functions as func

from function_app import runtime

bp = func.Blueprint()


@bp.route(
    route="{*route}",
    methods=["GET", "POST"],
    auth_level=func.AuthLevel.FUNCTION,
)
async def api(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    return await runtime.asgi().handle_async(req, context)

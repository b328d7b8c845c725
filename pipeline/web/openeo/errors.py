"""openEO's errors: every refusal of an ``/openeo`` route is the specification's error object
(``{id, code, message, links}``, its HTTP status and its code from the API's ``errors.json``),
whatever raised it — a refusal of this package's, a request FastAPI found invalid, a job that
is not the caller's, storage that did not answer."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from azure.core.exceptions import ServiceRequestError, ServiceResponseError
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from pipeline.lifecycle import jobs
from pipeline.planning import RequestError

# the HTTP status of a generic refusal, by code (errors.json)
_STATUS = {401: "AuthenticationRequired", 403: "PermissionsInsufficient", 404: "NotFound", 405: "MethodNotAllowed",
           409: "Conflict", 413: "PayloadTooLarge", 429: "TooManyRequests", 503: "ServiceUnavailable"}


class ErrorObject(BaseModel):
    """openEO's error object, as every refusal of an ``/openeo`` route is documented."""

    id: str
    code: str
    message: str
    links: list[dict[str, Any]] = []


# what the app's OpenAPI document says an /openeo route answers when it refuses (the app's
# own routes answer {detail, field}: these override those codes for this router)
RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorObject, "description": f"openEO's error object ({why})"}
    for status, why in ((400, "a bad request"), (401, "not signed in"), (403, "not allowed"), (404, "not found"),
                        (405, "the wrong method"), (409, "not in a state that allows it"),
                        (413, "too large"), (422, "invalid"), (429, "too many requests a minute"),
                        (503, "storage unavailable"))}


class OpenEOError(Exception):
    """A refusal as openEO names it: ``code`` from the API's errors.json, ``status`` its HTTP
    status, ``message`` what a person reads (naming the field or the process)."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}

    def response(self) -> JSONResponse:
        body = {"id": uuid.uuid4().hex, "code": self.code, "message": self.message, "links": []}
        return JSONResponse(body, self.status, headers=self.headers)


def _field_of(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc if p not in ("body", "query", "path")) or "body"


def of(exc: Exception) -> OpenEOError | None:
    """The openEO error an exception of the app stands for; None if it is a fault (a 500)."""
    if isinstance(exc, OpenEOError):
        return exc
    if isinstance(exc, RequestValidationError):
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            return OpenEOError(400, "JSONInvalid", f"the body is not JSON: {first['msg']}")
        return OpenEOError(400, "ParameterInvalid", "; ".join(
            f"{_field_of(tuple(e['loc']))}: {e['msg']}" for e in exc.errors()))
    if isinstance(exc, jobs.JobNotFound):
        return OpenEOError(404, "JobNotFound", "no such batch job (or not yours)")
    if isinstance(exc, RequestError):
        return OpenEOError(exc.status if exc.status != 413 else 400, "ProcessGraphInvalid",
                           f"{exc.field}: {exc.message}")
    if isinstance(exc, (ServiceRequestError, ServiceResponseError)):
        return OpenEOError(503, "ServiceUnavailable", "storage is unavailable, retry shortly", {"Retry-After": "5"})
    if isinstance(exc, HTTPException):
        detail = exc.detail.get("detail") if isinstance(exc.detail, dict) else exc.detail
        return OpenEOError(exc.status_code, _STATUS.get(exc.status_code, "BadRequest"), str(detail),
                           dict(exc.headers or {}))
    return None


class OpenEORoute(APIRoute):
    """A route of the openEO API: whatever refuses a request answers openEO's error object."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                found = of(exc)
                if found is None:
                    raise
                return found.response()

        return handle

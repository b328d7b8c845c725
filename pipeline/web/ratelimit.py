"""How often one user may submit, estimate or ask for an address to be confirmed — and, through
the openEO API, create, change, validate, start or estimate a job (``pipeline.web.openeo``,
whose refusal is openEO's error object): a token bucket per user, kept in the users table so
that every API instance spends from the same one (Azure Functions runs the API on as many
instances as its load asks for, each with its own memory: a bucket in memory would let a user
through once per instance).

users table, partition ``rate``: RK = user name; ``Tokens`` (a float: what was left),
``At`` (when, by the writing instance's clock). A request reads the row, adds what
``BAGPIPE_REQUESTS_PER_MINUTE`` refills since ``At`` (up to as many: the burst), spends one
and writes the row back fenced on the ETag it read, or creates it; a write that loses to
another instance's reads again. With less than one token left it is refused (429) with the
seconds until one is back. Two storage calls per request, none when the limit is 0. An
instance's clock behind the row's time refills nothing (the skew between instances costs
the user at most that much)."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.data.tables import UpdateMode
from fastapi import Depends, HTTPException

from pipeline.lifecycle.tasks import is_conflict, now
from pipeline.storage.clients import Clients
from pipeline.web.identity import Caller

RATE = "rate"
TRIES = 8  # writes lost to other instances before a request is refused as too many at once


def spend(clients: Clients, user: str, at: datetime | None = None) -> float:
    """Spend one request of ``user``'s bucket: 0.0 if it was there, else the seconds until
    one is (nothing spent)."""
    per_minute = clients.settings.requests_per_minute
    if per_minute <= 0:
        return 0.0
    per_second = per_minute / 60
    for _ in range(TRIES):
        when = at or now()
        tokens: float = float(per_minute)
        etag: str | None = None
        try:
            row = clients.users.get_entity(RATE, user)
            elapsed = max(0.0, (when - row["At"]).total_seconds())
            tokens, etag = min(tokens, float(row["Tokens"]) + elapsed * per_second), str(row.metadata["etag"])
        except ResourceNotFoundError:
            pass  # a full bucket
        if tokens < 1:
            return (1 - tokens) / per_second
        entity = {"PartitionKey": RATE, "RowKey": user, "Tokens": tokens - 1, "At": when}
        try:
            if etag is None:
                clients.users.create_entity(entity)
            else:
                clients.users.update_entity(entity, mode=UpdateMode.REPLACE, etag=etag,
                                            match_condition=MatchConditions.IfNotModified)
            return 0.0
        except ResourceExistsError:
            continue  # another instance made the row first: read it
        except HttpResponseError as exc:
            if not is_conflict(exc):
                raise
    return 1 / per_second


def limited(signed_in: Callable[..., Caller], clients: Clients) -> Callable[..., Caller]:
    """A dependency that signs the caller in and spends one of their requests, or refuses
    with 429 and Retry-After (FastAPI solves it before it validates the body: a refused
    request costs no validation)."""

    def spent(caller: Caller = Depends(signed_in)) -> Caller:
        wait = spend(clients, caller.user.name)
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            most = clients.settings.requests_per_minute
            raise HTTPException(429, {"detail": f"too many submissions, estimates and addresses to confirm: at most "
                                                f"{most} a minute; retry in {seconds} s", "retry_after": seconds},
                                headers={"Retry-After": str(seconds)})
        return caller

    return spent

"""The audit trail: who did what, to what, when — one row per event in the ``audit``
table, partitioned by day (PK ``YYYY-MM-DD``) with row keys that sort newest first, so that
an admin reads a day's events as one key-range query.

Recorded: ``job.submit``, ``job.cancel``, ``reducer.push``, ``reducer.share``,
``reducer.delete``, ``user.add``, ``token.create``, ``token.revoke``, and, once a day per
token or Entra user, ``token.use`` and ``sign-in`` (a row per request would make the
trail as large as the traffic and say nothing more). Credentials never: a token is named
by its id, which signs nobody in.
"""

from __future__ import annotations

import json
import secrets
from datetime import UTC, date, datetime
from typing import Any

from pipeline.storage.clients import Clients

_FAR_FUTURE_MS = 10**13


def record(clients: Clients, who: str, what: str, target: str, detail: dict[str, Any] | None = None) -> None:
    at = datetime.now(UTC)
    inverted = _FAR_FUTURE_MS - int(at.timestamp() * 1000)
    clients.audit.create_entity({
        "PartitionKey": at.date().isoformat(), "RowKey": f"{inverted:013d}-{secrets.token_hex(4)}",
        "Who": who, "What": what, "Target": target, "Detail": json.dumps(detail or {}), "At": at,
    })


def read(clients: Clients, day: date, limit: int = 200, who: str = "") -> list[dict[str, Any]]:
    """A day's events, newest first (``who``: only that user's)."""
    found = []
    for row in clients.audit.query_entities("PartitionKey eq @pk", parameters={"pk": day.isoformat()},
                                            results_per_page=min(limit, 1000)):
        if who and row["Who"] != who:
            continue
        found.append({"at": row["At"].isoformat(), "who": row["Who"], "what": row["What"],
                      "target": row["Target"], "detail": json.loads(row.get("Detail") or "{}")})
        if len(found) >= limit:
            break
    return found

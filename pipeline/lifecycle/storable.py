"""What a job would store, measured before it is accepted.

A job writes its request into its row (``Request``: the application's JSON, every field of
it) and each of its tasks its parameters into the task's row (``Params``: JSON, in which an
application's own JSON, a reduction's arguments, is escaped a second time, so that a quote
or a character outside ASCII takes several). A row over what a table holds
(``pipeline.storage.limits``) is refused every time it is written: the job would stay
ACCEPTED while every plan failed. So the rows are built as submission and the planner build
them — the job's row; per stage the task row of the longest parameters, in the job's last
partition; and the largest transaction the planner could write, a hundred of the largest
rows — and measured as the service measures them. The application names the request's
field that makes a row too large (``field_of``: the stored property and, in a task's
parameters, the largest parameter).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pipeline.lifecycle import tasks
from pipeline.planning import RequestError, TaskPlan
from pipeline.storage import limits, names, transactions
from pipeline.storage.clients import Clients

FieldOf = Callable[[str, str], str]  # (stored property, largest parameter or "") → the request's field


def anywhere(stored: str, param: str) -> str:
    """The field of a job whose application names none: the request's body."""
    return "body"


def check(clients: Clients, job: dict[str, Any], parts: list[str], plan: list[TaskPlan],
          field_of: FieldOf = anywhere) -> None:
    """Refuse (RequestError 413, naming the field ``field_of`` gives) a job whose row (the
    entity ``job``), task rows (in its partitions ``parts``) or task rows' transactions would
    not fit in a table."""
    _fits(job, "the job's row", lambda name: field_of(name, ""))
    longest: dict[str, tuple[int, int, int]] = {}  # stage → (length, task of the longest parameters, tasks)
    for seq, task in enumerate(plan):
        size = sum(len(key) + len(value) for key, value in task.params.items())
        most, seq_then, count = longest.get(task.stage, (-1, seq, 0))
        longest[task.stage] = (size, seq, count + 1) if size >= most else (most, seq_then, count + 1)
    largest: list[tuple[int, dict[str, Any], int, str]] = []  # (wire bytes, row, how many, its largest parameter)
    for stage, (_, seq, count) in longest.items():
        entity = tasks.task_entity(parts[-1], seq, plan[seq], clients.settings.shards)
        param = _largest(plan[seq].stored_params())
        _fits(entity, f"a {stage} task's row", _naming(field_of, param))
        largest.append((transactions.body_bytes(clients.tasks, [("create", entity)]), entity, count, param))
    together: list[dict[str, Any]] = []  # the largest transaction: a hundred of the largest rows
    for _, entity, count, _ in sorted(largest, key=lambda found: -found[0]):
        together += [entity | {"RowKey": names.task_key(len(together) + k)}
                     for k in range(min(count, tasks.BATCH - len(together)))]
    body = transactions.body_bytes(clients.tasks, [("create", entity) for entity in together])
    if body > limits.TRANSACTION_BYTES:
        field = field_of("Params", max(largest, key=lambda found: found[0])[3])
        raise RequestError(413, field, f"{field} makes a table transaction of {len(together)} task rows, which the "
                           f"planner writes together, {body:,} bytes; one holds {limits.TRANSACTION_BYTES:,}: shorten "
                           f"{field}", size=body, limit=limits.TRANSACTION_BYTES)


def _fits(entity: dict[str, Any], what: str, field_of: Callable[[str], str]) -> None:
    for name, units in limits.oversized(entity).items():
        field = field_of(name)
        raise RequestError(413, field, f"{field} makes {what} too large to store: its {name} would be {units:,} "
                           f"characters (UTF-16), and a table property holds {limits.PROPERTY_UNITS:,}; shorten "
                           f"{field} (a quote, a backslash or a character outside ASCII takes up to 7)",
                           size=units, limit=limits.PROPERTY_UNITS)
    size = limits.entity_bytes(entity)
    if size > limits.ENTITY_BYTES:
        field = field_of(max((n for n in entity if isinstance(entity[n], str)), key=lambda n: len(entity[n])))
        raise RequestError(413, field, f"{field} makes {what} {size:,} bytes; a table row holds "
                           f"{limits.ENTITY_BYTES:,}", size=size, limit=limits.ENTITY_BYTES)


def _naming(field_of: FieldOf, param: str) -> Callable[[str], str]:
    """The field of a task row's stored property: its parameters' by the largest of them."""
    return lambda name: field_of(name, param if name == "Params" else "")


def _largest(params: dict[str, str]) -> str:
    """The parameter that takes the most room once stored."""
    return max(params, key=lambda key: len(json.dumps(params[key]))) if params else ""

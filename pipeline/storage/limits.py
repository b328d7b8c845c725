"""What one row of Azure Table storage can hold, measured as the service measures it.

A string property holds at most 32 K UTF-16 code units (64 KiB: a character outside the
Basic Multilingual Plane, an emoji, takes two); an entity at most 1 MiB, sized by the
service's formula (4 bytes, its keys' UTF-16 bytes, and per property 8 bytes, its name's
UTF-16 bytes and its value's size); an entity-group transaction's body at most 4 MiB (its
entities as the SDK serializes them, JSON with ``\\uXXXX`` escapes, in their multipart
envelope: :func:`pipeline.storage.transactions.body_bytes`). Azurite enforces the property
and transaction limits, not the entity's. A write over a limit fails every time it is made
again, so what a request would store is measured before it is accepted
(``pipeline.lifecycle.storable``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

PROPERTY_UNITS = 32 * 1024  # UTF-16 code units in one string property
ENTITY_BYTES = 1024 * 1024
TRANSACTION_BYTES = 4 * 1024 * 1024


def utf16_units(text: str) -> int:
    """Code units of ``text`` in UTF-16: two for each character past U+FFFF."""
    return len(text) + sum(1 for c in text if ord(c) > 0xFFFF)


def value_bytes(value: Any) -> int:
    """A property value's size in the service's formula."""
    if isinstance(value, str):
        return 4 + 2 * utf16_units(value)
    if isinstance(value, bytes):
        return 4 + len(value)
    if isinstance(value, bool):
        return 1
    if isinstance(value, UUID):
        return 16
    if isinstance(value, (int, float, datetime)):
        return 8
    return 4 + 2 * utf16_units(str(value))


def entity_bytes(entity: Mapping[str, Any]) -> int:
    """An entity's size as the service counts it toward its 1 MiB."""
    size = 4 + 2 * (utf16_units(str(entity["PartitionKey"])) + utf16_units(str(entity["RowKey"])))
    for name, value in entity.items():
        if name not in ("PartitionKey", "RowKey") and value is not None:
            size += 8 + 2 * utf16_units(name) + value_bytes(value)
    return size


def oversized(entity: Mapping[str, Any]) -> dict[str, int]:
    """The string properties of ``entity`` over :data:`PROPERTY_UNITS`, with their size."""
    return {name: units for name, value in entity.items()
            if isinstance(value, str) and (units := utf16_units(value)) > PROPERTY_UNITS}

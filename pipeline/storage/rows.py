"""Stored rows as typed dataclasses: each field a stored property, named in Python and stored
under its CamelCase name (``ended_at`` as ``EndedAt``) or the name its metadata gives
(``field(metadata=stored("PartitionKey"))``); enum fields are read back as their enum. A row keeps the ETag
it was read with, the condition of its next write.

The row types themselves live with the modules that own them (``JobRow`` in
``pipeline.lifecycle.jobs``, ``TaskRow`` in ``pipeline.lifecycle.tasks``, ``AttemptRow`` in
``pipeline.lifecycle.attempts``); no other module spells their stored names.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from enum import Enum
from typing import Any, ClassVar, Self


def stored(name: str) -> dict[str, str]:
    """The metadata of a field stored under ``name`` rather than its CamelCase name:
    ``field(metadata=stored("PartitionKey"))``."""
    return {"stored": name}


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


class Row:
    """What every row type shares: reading from an entity, writing to one. A subclass is a
    frozen, keyword-only dataclass with an ``etag`` field (never written)."""

    etag: str
    written: ClassVar[frozenset[str]] = frozenset()  # fields written even at their default

    @classmethod
    @functools.cache
    def stored_names(cls) -> dict[str, str]:
        """Field name → stored property name."""
        every = dataclasses.fields(typing.cast(Any, cls))  # every subclass is a dataclass
        return {f.name: f.metadata.get("stored", camel(f.name)) for f in every if f.name != "etag"}

    @classmethod
    @functools.cache
    def _enums(cls) -> dict[str, type[Enum]]:
        found: dict[str, type[Enum]] = {}
        for name, hint in typing.get_type_hints(cls).items():
            for option in typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,):
                if isinstance(option, type) and issubclass(option, Enum):
                    found[name] = option
        return found

    @classmethod
    def from_entity(cls, entity: Mapping[str, Any], etag: str | None = None) -> Self:
        """The row an entity holds; its ETag from ``etag`` or the entity's metadata."""
        if etag is None:
            metadata = getattr(entity, "metadata", None) or {}
            etag = str(metadata.get("etag") or "")
        found: dict[str, Any] = {"etag": etag}
        enums = cls._enums()
        for name, key in cls.stored_names().items():
            value = entity.get(key)
            if value is not None:
                found[name] = enums[name](value) if name in enums else value
        return cls(**cls.completed(found))

    @classmethod
    def completed(cls, found: dict[str, Any]) -> dict[str, Any]:
        """What a row written by an older version lacks, filled in (a subclass's hook)."""
        return found

    def keys(self) -> dict[str, Any]:
        """The row's PartitionKey and RowKey, as stored."""
        return {key: getattr(self, name) for name, key in self.stored_names().items()
                if key in ("PartitionKey", "RowKey")}

    def to_entity(self) -> dict[str, Any]:
        """The entity to write: every field that has a value, but not one still at its default
        unless the type always writes it (``written``): a row holds what was said of it."""
        defaults = self._defaults()
        return self.keys() | self.as_stored(**{
            name: value for name in self.stored_names() if (value := getattr(self, name)) is not None
            and (name in self.written or name not in defaults or value != defaults[name])})

    @classmethod
    @functools.cache
    def _defaults(cls) -> dict[str, Any]:
        return {f.name: f.default for f in dataclasses.fields(typing.cast(Any, cls))
                if f.default is not dataclasses.MISSING}

    @classmethod
    def as_stored(cls, **fields: Any) -> dict[str, Any]:
        """``fields`` (by field name) as stored properties: what a merge into such a row writes."""
        stored_names = cls.stored_names()
        return {stored_names[name]: value.value if isinstance(value, Enum) else value
                for name, value in fields.items()}

    def stored_changes(self, **changes: Any) -> dict[str, Any]:
        """``changes`` (by field name) as stored properties, with this row's keys: a merge."""
        return self.keys() | self.as_stored(**changes)

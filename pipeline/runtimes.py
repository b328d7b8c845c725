"""Runtime history per (stage, product[, reducer]) across all requests: count, mean and
M2 (Welford), updated with conditional writes so concurrent updates are never lost."""

from __future__ import annotations

import math
from dataclasses import dataclass

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableClient, UpdateMode


@dataclass(frozen=True)
class Runtime:
    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    @property
    def stdev(self) -> float:
        return math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 0.0

    def add(self, seconds: float) -> Runtime:
        """Welford's update: the statistics with one more sample."""
        count = self.count + 1
        delta = seconds - self.mean
        mean = self.mean + delta / count
        return Runtime(count, mean, self.m2 + delta * (seconds - mean))


def history_key(params: dict[str, str]) -> str:
    """What a runtime is kept per within a stage: the product (and reducer, if any)."""
    key = params.get("product", "")
    return f"{key}~{params['reducer']}" if params.get("reducer") else key


def read(table: TableClient, stage: str, key: str) -> Runtime:
    try:
        row = table.get_entity(stage, key)
    except ResourceNotFoundError:
        return Runtime()
    return Runtime(int(row["Count"]), float(row["Mean"]), float(row["M2"]))


def record(table: TableClient, stage: str, key: str, seconds: float, tries: int = 50) -> Runtime:
    """Add one sample, retrying on a concurrent update; returns the new statistics."""
    for _ in range(tries):
        try:
            row = table.get_entity(stage, key)
        except ResourceNotFoundError:
            new = Runtime().add(seconds)
            try:
                table.create_entity({"PartitionKey": stage, "RowKey": key, "Count": new.count,
                                     "Mean": new.mean, "M2": new.m2})
                return new
            except ResourceExistsError:
                continue
        new = Runtime(int(row["Count"]), float(row["Mean"]), float(row["M2"])).add(seconds)
        try:
            table.update_entity(
                {"PartitionKey": stage, "RowKey": key, "Count": new.count, "Mean": new.mean, "M2": new.m2},
                mode=UpdateMode.REPLACE, etag=row.metadata["etag"], match_condition=MatchConditions.IfNotModified,
            )
            return new
        except ResourceModifiedError:
            continue
    raise RuntimeError(f"runtime history of {stage}/{key} kept changing; sample dropped")

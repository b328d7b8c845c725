"""What a job costs at Azure's public prices: estimated before it is submitted (its tasks,
and their compute time from the runtime history), measured once it has finished (the
seconds its attempts ran, failed and killed ones included: what the workers were paid
for), and what keeping an intermediate costs against remaking it (the retention rule).

Compute is a worker slot's share of its Container Apps execution (``REPLICA_VCPU`` vCPU and
``REPLICA_GIB`` GiB running ``SLOTS`` slots, active while it lives). Storage transactions are
priced at ``STORAGE_CALLS_PER_TASK`` a task, a bound on what a tile task costs (the scale
model, ``bench/sim``, sets its own figure against it in docs/scale.md), which the compute
dwarfs. A tile already in the cache costs almost nothing, so an estimate is an upper bound.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from azure.data.tables import TableClient

from pipeline.lifecycle import runtimes
from pipeline.planning import TaskPlan
from pipeline.storage import names


@dataclass(frozen=True)
class Figure:
    """A figure and where it comes from (``confirmed``: read on a stored page, else derived
    or assumed, said how)."""

    what: str
    value: float
    unit: str
    source: str
    confirmed: bool = True


# The price list: Azure's pay-as-you-go retail prices (the Azure Retail Prices API, which the
# azure.microsoft.com pricing pages render), USD, East US, as of August 2026. Each rate was read
# in a dated public copy of that list, named with it.
PRICE_LIST = "Azure pay-as-you-go retail prices (Azure Retail Prices API), USD, East US, as of 2026-08"
RETAIL_API = "Azure Retail Prices API, East US, read 2026-08-04 (a public cost estimate quoting its meters)"
PRICES = {
    "table": Figure("Table Storage transactions (LRS, every operation type)", 0.00036, "USD per 10,000",
                    "Azure retail rate for reads, writes, lists, scans and deletes, checked 2026-07-21 (a public "
                    "repository's cost notes); the same East US LRS rate in several others"),
    "queue": Figure("Queue Storage operations (GPv2 LRS, class 1 and class 2)", 0.004, "USD per 10,000",
                    "derived, not read: Azure pricing-calculator exports in public repositories (East US: 1 GB, "
                    "1,000 × 10,000 class-1 and class-2 operations = $8.05 = $0.045/GB + 2,000 × $0.004)", False),
    "blob_write": Figure("Blob Storage write operations (hot, LRS)", 0.05, "USD per 10,000", RETAIL_API),
    "blob_read": Figure("Blob Storage read operations (hot, LRS)", 0.004, "USD per 10,000", RETAIL_API),
    "blob_gb_month": Figure("Blob Storage capacity (hot, LRS, first 50 TB)", 0.018, "USD per GB-month",
                            "azure.microsoft.com/pricing/details/storage/blobs (pay-as-you-go), as quoted in "
                            "public notes of the page's table", False),
    "vcpu": Figure("Container Apps consumption, active vCPU", 0.000024, "USD per vCPU-second",
                   "azure.microsoft.com/pricing/details/container-apps (pay-as-you-go, active usage), as quoted "
                   "in public cost notes of 2026"),
    "memory": Figure("Container Apps consumption, memory", 0.000003, "USD per GiB-second",
                     "azure.microsoft.com/pricing/details/container-apps, as quoted in public cost notes of 2026"),
    "flex_gbs": Figure("Functions Flex Consumption, on-demand execution time", 0.000026, "USD per GB-second",
                       "Modal, 'Azure Functions pricing: Consumption vs. Flex Consumption', 2025-05-22 (East US)"),
    "flex_exec": Figure("Functions Flex Consumption, on-demand executions", 0.40, "USD per million",
                        "the same guide, 2025-05-22"),
}
# The platform (infra/bicep): a worker execution has 2 vCPU, 4 GiB and 2 slots.
REPLICA_VCPU, REPLICA_GIB, SLOTS = 2.0, 4.0, 2
SLOT_USD_PER_S = (REPLICA_VCPU * PRICES["vcpu"].value + REPLICA_GIB * PRICES["memory"].value) / SLOTS
STORAGE_CALLS_PER_TASK = 220  # storage requests a task may cost on Azure (an upper bound: see above)
STORAGE_USD_PER_CALL = PRICES["table"].value / 1e4
DAYS_PER_MONTH = 30.44
# A typical cached blob of each cache container: (bytes, slot-seconds to make it again), as
# ``make bench NAME=scale`` measures them (docs/scale.md, "Retention"): the deployed rule's input.
CACHED = {names.SOURCES_CONTAINER: (1_100_995, 0.22), names.TILES_CONTAINER: (3_867, 0.27)}


def dollars(amount: float) -> str:
    """An amount as people read it: cents, or four decimals below a cent (a small job)."""
    return f"${amount:,.2f}" if amount >= 0.01 or amount == 0 else f"${amount:.4f}"


def usd(compute_s: float, tasks: int) -> float:
    """What ``compute_s`` slot-seconds and ``tasks`` tasks' storage calls cost."""
    return compute_s * SLOT_USD_PER_S + tasks * STORAGE_CALLS_PER_TASK * STORAGE_USD_PER_CALL


def estimate(history: TableClient, plan: Iterable[TaskPlan], min_samples: int) -> dict[str, Any]:
    """Before submitting: per stage its tasks and their compute time, from the history of
    each (stage, product[, reducer]) times each task's work; a stage with too short a history
    says so (its time unknown). One history read per stage and key."""
    groups: dict[tuple[str, str], list[float]] = {}
    for task in plan:
        groups.setdefault((task.stage, task.history), []).append(task.work)
    stages: dict[str, dict[str, Any]] = {}
    for (stage, key), works in sorted(groups.items()):
        found = runtimes.read(history, stage, key)
        entry = stages.setdefault(stage, {"tasks": 0, "compute_s": 0.0, "known": True})
        entry["tasks"] += len(works)
        if found.count >= min_samples:
            entry["compute_s"] += found.mean * sum(works)
        else:
            entry["known"] = False  # fewer runs than the monitor trusts: no figure yet
    tasks = sum(e["tasks"] for e in stages.values())
    compute_s = sum(e["compute_s"] for e in stages.values())
    return {"tasks": tasks, "stages": stages, "compute_s": round(compute_s, 1),
            "known": all(e["known"] for e in stages.values()), "usd": round(usd(compute_s, tasks), 4),
            "prices": PRICE_LIST}


def measured(runtimes_s: Iterable[float], tasks: int) -> dict[str, Any]:
    """After: the seconds the job's attempts ran (every attempt: failed and killed ones were
    paid for too), and their cost."""
    seconds = list(runtimes_s)
    compute_s = sum(seconds)
    return {"attempts": len(seconds), "compute_s": round(compute_s, 1), "usd": round(usd(compute_s, tasks), 4),
            "prices": PRICE_LIST}


# --- retention: keep an intermediate while its reuse saves more than it costs to store --------
def keep_days(size_bytes: float, remake_s: float) -> float:
    """How many days after its last use an intermediate of ``size_bytes`` that takes
    ``remake_s`` slot-seconds to make again is worth keeping: until storing it has cost
    what one remake would (the ModisAzure paper weighs 1 GB-month against a small VM's
    hour). Whatever the future asks, this rule spends at most twice what knowing it would
    have (rent or buy: keep while renting is cheaper than one purchase)."""
    storage_per_day = size_bytes / 1e9 * PRICES["blob_gb_month"].value / DAYS_PER_MONTH
    return remake_s * SLOT_USD_PER_S / storage_per_day if storage_per_day > 0 else float("inf")

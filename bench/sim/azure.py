"""Azure as the scale model sees it: the documented scalability targets, the platform's
scale-out, the latency assumed for a storage call, the public prices, each with where it
comes from (and whether a stored page confirmed it), and the ModisAzure workload.
"""

from __future__ import annotations

import math

from bench.sim.core import Cost, Limits, LogNormal, Result, ScaleOut, TaskKind
from pipeline.lifecycle.costs import PRICES, REPLICA_GIB, REPLICA_VCPU, SLOTS, Figure

TABLE_TARGETS = ("'Scalability and performance targets for Table storage', "
                 "https://learn.microsoft.com/en-us/azure/storage/tables/scalability-targets")
QUEUE_TARGETS = ("'Scalability and performance targets for Queue Storage', "
                 "https://learn.microsoft.com/azure/storage/queues/scalability-targets")
ACCOUNT_TARGETS = ("'Scalability and performance targets for standard storage accounts', "
                   "https://learn.microsoft.com/en-us/azure/storage/common/scalability-targets-standard-account")
TARGETS = (
    Figure("table partition", 2_000, "entities/s (1 KiB entities)", TABLE_TARGETS),
    Figure("queue", 2_000, "messages/s (1 KiB messages)", QUEUE_TARGETS),
    Figure("storage account", 20_000, "requests/s (tables and queues pages: 1 KiB entities or messages; "
           "the standard-account page lists 40,000 for GPv2 in the largest regions, East US among them)",
           f"{TABLE_TARGETS}; {QUEUE_TARGETS}; {ACCOUNT_TARGETS}"),
)
LIMITS = Limits(partition=2_000, queue=2_000, account=20_000)

# The platform (infra/bicep): a worker execution (pipeline.lifecycle.costs: its vCPU, GiB and slots); KEDA
# polls the shards every 10 s with a queue length of one execution's slots. Start-up is assumed.
FUNCTION_GB = 2.0  # Flex Consumption's default instance memory (2,048 MB)
SCALE_OUT = ScaleOut(polling_s=10.0, queue_length=SLOTS, max_executions=1_000, start=LogNormal(30.0, 0.3),
                     idle_s=60.0)

# No latency figure is documented for a table or queue call; assumed: a few milliseconds in
# the region, a long tail (lognormal, sigma 0.5), 20 µs more per entity a query returns.
AZURE_WAIT = {"get": 0.005, "update": 0.006, "txn": 0.008, "query": 0.006, "send": 0.006, "receive": 0.006,
              "delete": 0.005, "renew": 0.006, "blob": 0.0}
ASSUMED = (
    Figure("storage call latency (point read)", 5, "ms median, lognormal sigma 0.5", "assumed", False),
    Figure("storage call latency (transaction)", 8, "ms median", "assumed", False),
    Figure("worker execution start-up", 30, "s median (image pulled, Python started)", "assumed", False),
)


def azure_costs(local: dict[str, Cost]) -> dict[str, Cost]:
    """The local costs' client CPU (the same SDK code runs in a replica), no server CPU
    (Azure's limits are its targets), Azure's assumed waits."""
    return {kind: Cost(c.client_s, 0.0, LogNormal(AZURE_WAIT.get(kind, 0.006), 0.5) if AZURE_WAIT.get(kind, 1) else
                       LogNormal(0.0), c.client_per_unit, 0.0, 2e-5 if kind == "query" else 0.0)
            for kind, c in local.items()}


# --- public prices (USD, pay-as-you-go): pipeline.lifecycle.costs, which the job estimates use too ---------
FREE_GRANTS = Figure("Container Apps free grant per subscription and month: 180,000 vCPU-s, 360,000 GiB-s, "
                     "2 million requests (not deducted below)", 0, "",
                     "https://learn.microsoft.com/en-us/azure/container-apps/billing")
EGT_BILLING = Figure("an entity-group transaction billed per entity (priced both ways below)", 0, "",
                     "https://docs.particular.net/persistence/azure-table/capacity-planning "
                     "(not confirmed on a Microsoft page)", False)


def storage_cost(result: Result, kinds: dict[str, str], units_billed: bool = True) -> dict[str, float]:
    """USD of a job's storage transactions, by service. ``kinds``: each operation's cost kind;
    ``units_billed``: a transaction billed per entity (else per request)."""
    out = {"table": 0.0, "queue": 0.0, "blob": 0.0}
    for op, n in result.requests.items():
        kind = kinds.get(op, "")
        if kind in ("get", "update", "txn", "query"):
            count = result.units[op] if units_billed and kind == "txn" else n
            out["table"] += count * PRICES["table"].value / 1e4
        elif kind in ("send", "receive", "delete", "renew"):
            out["queue"] += n * PRICES["queue"].value / 1e4
        elif kind == "blob":
            price = PRICES["blob_write"] if "written" in op else PRICES["blob_read"]
            out["blob"] += n * price.value / 1e4
    return out


def compute_cost(result: Result, function_executions: float) -> dict[str, float]:
    """USD of the workers' executions (active the whole time they live) and the Functions."""
    return {"workers (Container Apps)": result.replica_seconds * (REPLICA_VCPU * PRICES["vcpu"].value
                                                                   + REPLICA_GIB * PRICES["memory"].value),
            "planner, sweep, completion (Functions)": result.function_seconds * FUNCTION_GB * PRICES["flex_gbs"].value
            + function_executions * PRICES["flex_exec"].value / 1e6}


# --- ModisAzure's workload (Hill et al., "Early observations on the performance of Windows
# Azure", section 5 and its Table 2) -------------------------------------------------------------
PAPER = 'Hill, Li, Mao, Ruiz-Alvarez and Humphrey, "Early observations on the performance of Windows Azure", §5'
MODIS = (
    Figure("task executions, February to September 2010", 3_054_430, "", PAPER + ", Table 2 (the introduction: "
           "'nearly 2.7 million independent sub-tasks')"),
    Figure("instances", 200, "", PAPER + ".1 ('the current deployment uses up to 200 instances concurrently')"),
    Figure("reprojection share of executions", 55.79, "%", PAPER + ", Table 2"),
    Figure("reduction share of executions", 39.36, "%", PAPER + ", Table 2 (source download 4.57 %, "
           "aggregation 0.29 %)"),
    Figure("reprojection time", 5, "min: 'several minutes' on a small instance; 'a normal task execution "
           "completed within 10 min'", PAPER + ".1, §5.2"),
    Figure("reduction time", 2.9, "min: 15,000 reduction hours vs 35,000 reprojection hours for the 10-year "
           "continental-US campaign, with Table 2's 1.42 reprojections per reduction",
           "Microsoft Research eScience blog, 2010-03-30 (AzureMODIS); derived", False),
)
REDUCTION_SHARE = 39.36 / (55.79 + 39.36)  # a tile task does bagpipe's collection and reprojection
MODIS_KINDS = (
    TaskKind("reprojection", 1 - REDUCTION_SHARE, LogNormal(4.5 * 60, 0.35)),
    TaskKind("reduction", REDUCTION_SHARE, LogNormal(2.75 * 60, 0.35), reduction=True),
)
TILES_PER_REDUCTION = 55.79 / 39.36
# the 10-year continental-US request: 585 K source files, 3-4 sources a tile task
MODIS_JOB_TASKS = round(585_000 / 3.5 / (1 - REDUCTION_SHARE))


def needed(load_per_s: float, target: float, fraction: float = 0.5) -> int:
    """How many servers of ``target`` units/s carry ``load_per_s`` at most ``fraction`` busy."""
    return max(1, math.ceil(load_per_s / (target * fraction)))


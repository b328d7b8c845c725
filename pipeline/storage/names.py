"""Every name bagpipe gives to something in Azure Storage, and the headers and variables its
clients use.

One module owns them (as arq keeps its keys in ``constants.py``); ``infra/bicep/`` loads the
same names from ``names.json`` (written by ``python -m pipeline.deployment``, checked by a
test). A *namespace* prefix lets several deployments (or test cases) share one storage account
without seeing each other's data; in Azure it is empty.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date

# The connection name the Functions bindings use; the host reads ``BagpipeStorage`` (a
# connection string) or ``BagpipeStorage__accountName`` (the managed identity) from it, and so
# do bagpipe's settings (pipeline/settings.py declares every app setting).
BINDING_CONNECTION = "BagpipeStorage"

# What the command line reads (the client's environment, not the service's settings).
CLI_API_URL = "BAGPIPE_API_URL"
CLI_TOKEN = "BAGPIPE_API_KEY"  # a personal API token
# The HTTP header that carries a personal API token (``Authorization: Bearer`` works too,
# but in Azure App Service Authentication may take that header for its own: see docs/deploy.md).
TOKEN_HEADER = "X-Bagpipe-Token"
# The header the portal sends with every request it makes on a platform sign-in (a cookie
# session): a cross-site form cannot set it, so a request without it is no CSRF.
CLIENT_HEADER = "X-Requested-With"
# Set by App Service Authentication: the signed-in user's Entra ID token (token store on).
PLATFORM_ID_TOKEN = "X-MS-TOKEN-AAD-ID-TOKEN"

# --- base names (Bicep declares these, with an empty namespace) -------------------------
JOBS_TABLE = "jobs"
TASKS_TABLE = "tasks"
RUNTIMES_TABLE = "runtimes"
SOURCES_TABLE = "sources"
USERS_TABLE = "users"  # users, their personal API tokens, their Entra sign-ins
AUDIT_TABLE = "audit"  # who did what when
REDUCERS_TABLE = "reducers"  # uploaded reducer bundles: versions, sharing, the jobs that used them
WORKERS_TABLE = "workerhealth"  # each worker's recent runtime ratios and health (pipeline.lifecycle.health)
TABLES = (JOBS_TABLE, TASKS_TABLE, RUNTIMES_TABLE, SOURCES_TABLE, USERS_TABLE, AUDIT_TABLE, REDUCERS_TABLE,
          WORKERS_TABLE)

PLAN_QUEUE = "plan"
DONE_QUEUE = "done"
TASK_QUEUE_PREFIX = "tasks-"
POISON_SUFFIX = "-poison"

SOURCES_CONTAINER = "sources"
TILES_CONTAINER = "tiles"
PRODUCTS_CONTAINER = "products"
LOGS_CONTAINER = "logs"
BUNDLES_CONTAINER = "bundles"  # reducer bundles, content-addressed; kept as long as a job may name them
CONTAINERS = (SOURCES_CONTAINER, TILES_CONTAINER, PRODUCTS_CONTAINER, LOGS_CONTAINER, BUNDLES_CONTAINER)
# the containers whose blobs the deployment's retention deletes (a bundle is kept for its jobs)
EXPIRING_CONTAINERS = (PRODUCTS_CONTAINER, LOGS_CONTAINER)  # deleted a set time after they were written
CACHE_CONTAINERS = (SOURCES_CONTAINER, TILES_CONTAINER)  # kept by their last use (pipeline.lifecycle.costs.keep_days)

# --- row keys inside the tables ----------------------------------------------------------
JOB_ROW = "job"  # jobs: PK = job id, RK = JOB_ROW
STATUS_ROW = "status"  # jobs: PK = job id, the job's rollups summed as of the sweep's last pass
JOB_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")  # jobs: PK; anything else is refused before a lookup
TASK_KEY_WIDTH = 9  # tasks: RK = zero-padded sequence, so a release cursor is a key range
TASK_KEYS_END = ":"  # tasks: past every task key (digits), before the rows below
ATTEMPT_PREFIX = "~attempt~"  # tasks: one row per attempt, in its job's partition
COUNTER_PREFIX = "~count~"  # tasks: per-writer rollups (counts per state and tile, runtimes, failures)
FOLDED_ROW = f"{COUNTER_PREFIX}~folded"  # tasks: the rollups of writers gone quiet, one row per partition
SLOT_MARK = "~"  # between a worker's name and its slot's number, in the writer name its slot's rollups go under
SPILL_MARK = "!"  # ends a rollup row key that continues a full one of the same writer: ``{key}!{n}``
FAILURE_PREFIX = "~failure~"  # tasks: failed and revoked attempts, newest first
TILES_ROW = "~tiles"  # tasks: the job's target tiles and task totals, written at planning
DEADLINE_PREFIX = "~deadline~"  # tasks: the monitor's index of running attempts by deadline
BACKUP_MARK = "b"  # ends the attempt and deadline keys of a backup attempt
DISPATCH_PREFIX = "~dispatch~"  # tasks: the reconciler's index of queued tasks by when to check their message

PARTITION_MARK = "."  # tasks: a job's partition past its first is ``{job}.{bucket}`` (no job id has a dot)

_NAMESPACE = re.compile(r"^[a-z][a-z0-9]{0,15}$")


def partition(job: str, bucket: int) -> str:
    """PartitionKey in ``tasks`` of a job's bucket: the job id itself for the first (where the
    job's own rows live, and every task of a job of one bucket), ``{job}.{bucket}`` after."""
    return f"{job}{PARTITION_MARK}{bucket}" if bucket else job


def job_of(part: str) -> str:
    """The job a partition of ``tasks`` belongs to."""
    return part.partition(PARTITION_MARK)[0]


def is_partition_of(part: str, job: str) -> bool:
    """Whether ``part`` names one of ``job``'s partitions (a message's claim to be one)."""
    if part == job:
        return True
    bucket = part.removeprefix(f"{job}{PARTITION_MARK}")
    return bucket != part and bucket.isascii() and bucket.isdigit() and not bucket.startswith("0")


def task_key(seq: int) -> str:
    """Row key of the task with sequence number ``seq`` within its job."""
    return f"{seq:0{TASK_KEY_WIDTH}d}"


def counter_key(owner: str) -> str:
    """Row key of the rollup row one writer (worker slot, releaser, monitor, canceller)
    starts with; it goes on in ``spilled`` rows once that one is full."""
    return f"{COUNTER_PREFIX}{owner}"


def spilled(key: str, n: int) -> str:
    """The key of a rollup row's ``n``-th continuation (0: the row itself)."""
    return f"{key}{SPILL_MARK}{n}" if n else key


def spill_of(key: str) -> tuple[str, int]:
    """A rollup row key as its first row's key and which continuation it is."""
    first, mark, n = key.rpartition(SPILL_MARK)
    return (first, int(n)) if mark and n.isdigit() else (key, 0)


def worker_of(writer: str) -> str | None:
    """The worker whose slot writes rollups as ``writer``; None for the other writers (a
    releaser, the monitor, the sweep, a canceller)."""
    worker, mark, slot = writer.rpartition(SLOT_MARK)
    return worker if mark and slot.isdigit() else None


def failure_key(ended_ms: int, task: str, attempt: int) -> str:
    """Row key in a job's failure index: inverted epoch milliseconds first, so the newest
    failures are the first rows of one key range."""
    return f"{FAILURE_PREFIX}{10**15 - ended_ms:015d}-{task}-{attempt:03d}"


def attempt_key(task: str, attempt: int, backup: bool = False) -> str:
    """Row key of one attempt of a task in its job's partition of ``tasks`` (``backup``: of
    the backup copy of that attempt the monitor started at the job's tail)."""
    return f"{ATTEMPT_PREFIX}{task}-{attempt:03d}{BACKUP_MARK if backup else ''}"


def deadline_key(deadline_ms: int, task: str, attempt: int, backup: bool = False) -> str:
    """Row key in a job's deadline index: zero-padded epoch milliseconds first, so
    "overdue now" is one key range."""
    return f"{DEADLINE_PREFIX}{deadline_ms:015d}-{task}-{attempt:03d}{BACKUP_MARK if backup else ''}"


def dispatch_key(due_ms: int, task: str) -> str:
    """Row key in a job's dispatch index: when a QUEUED task's message is to be checked
    for (zero-padded epoch milliseconds first, so "due now" is one key range)."""
    return f"{DISPATCH_PREFIX}{due_ms:015d}-{task}"


def output_prefix(job: str, task: str, attempt: int, backup: bool = False) -> str:
    """Blob prefix in ``products`` where one attempt (or its backup) writes; only the
    committed attempt's outputs are named by the task row and so by the manifest."""
    return f"{job}/tasks/{task}/a{attempt:03d}{BACKUP_MARK if backup else ''}/"


def source_blob(product: str, granule: str, file_name: str) -> str:
    """A granule's file in ``sources``, keyed by the granule's id (which carries its
    production timestamp: a reprocessed granule is a new source) and the file's name."""
    return f"{product}/{granule}/{file_name}"


TILE_OUTPUT_PREFIX = "tiles:"  # an output name in the tiles container, not in products
MARKER_PREFIX = ".making/"  # tiles, sources: a blob's maker at work (the cache's marker), listed by the sweep


def marker_blob(name: str) -> str:
    """The marker a task holds while it makes the cached blob ``name`` (in the same container)."""
    return f"{MARKER_PREFIX}{name}"


def tile_blob(key: str, product: str, layer: str, tile: str, day: str) -> str:
    """A reprojected layer of a tile in ``tiles``: content-addressed by ``key``, named for people."""
    return f"{key[:2]}/{key}/{product}.{layer}.{day}.{tile}.tif"


def reduced_blob(key: str, name: str, group: str, tile: str) -> str:
    """A reduction's output for a tile and group of dates in ``tiles``: content-addressed by
    ``key``, named for people."""
    return f"{key[:2]}/{key}/{name}.{group}.{tile}.tif"


def climatology_blob(key: str, product: str, layer: str, first: date, last: date, tile: str) -> str:
    """A baseline's climatology of a layer for a tile in ``tiles`` (its days from ``first`` to
    ``last``, over the years): content-addressed by ``key``, named for people."""
    return f"{key[:2]}/{key}/{product}.{layer}.climatology.{first}_{last}.{tile}.tif"


def vector_blob(digest: str) -> str:
    """A kept vector document (sites, zones, a region's polygon) in ``tiles``, by the SHA-256
    of its canonical JSON (``pipeline.science.vectors``)."""
    return f"vectors/{digest[:2]}/{digest}.json"


def table_blob(key: str, name: str) -> str:
    """A table (a point task's sites, a tile's partial zonal statistics, a job's joined
    table) in ``tiles``: content-addressed by ``key``, named for people (``name`` ends with its
    format's suffix)."""
    return f"{key[:2]}/{key}/{name}"


OVERVIEW_CACHE_PREFIX = ".overviews/"  # products: drawn overviews of cached tiles, by content address


def overview_cache_blob(key: str) -> str:
    """A drawn overview in ``products`` (its description and both images, one JSON), keyed
    by its tiles' content addresses and how it is drawn (``pipeline.modis.overview.cache_key``)."""
    return f"{OVERVIEW_CACHE_PREFIX}{key[:2]}/{key}.json"


def manifest_blob(job: str) -> str:
    """The job's manifest in ``products``."""
    return f"{job}/manifest.json"


def stac_blob(job: str) -> str:
    """The job's STAC items as the API serves them (made at the first ask), in ``products``."""
    return f"{job}/stac.json"


def overview_blob(job: str, name: str) -> str:
    """One of the job's overview images (its region, per layer and date) in ``products``."""
    return f"{job}/overview/{name}"


def pack_blob(job: str, number: int) -> str:
    """One of the job's packs of small outputs in ``products``."""
    return f"{job}/packs/{number:04d}.pack"


def probe_blob(token: str) -> str:
    """Where a process stages (never commits) the block that measures its connection's
    rate to storage: an uncommitted block is in no listing, and storage drops it unused."""
    return f".probe/{token}"


PACK_CACHE_PREFIX = ".packs/"  # products: packs of cached tiles, by content address (no job id has a dot)


def pack_cache_blob(key: str, number: int | None = None) -> str:
    """A pack of cached tiles in ``products``, by the content address of its members
    (``pipeline.storage.packing.cache_address``); without ``number``, their index."""
    return f"{PACK_CACHE_PREFIX}{key[:2]}/{key}/{'index.json' if number is None else f'{number:04d}.pack'}"


def bundle_blob(digest: str) -> str:
    """A reducer bundle in ``bundles``, by the SHA-256 of its canonical form."""
    return f"{digest[:2]}/{digest}.tar.gz"


def log_prefix(job: str, task: str, attempt: int) -> str:
    """Blob prefix in ``logs`` for one attempt's logs."""
    return f"{job}/{task}/{attempt:03d}/"


@dataclass(frozen=True)
class StorageNames:
    """The concrete names of one deployment: the base names behind its namespace."""

    namespace: str = ""

    def __post_init__(self) -> None:
        if self.namespace and not _NAMESPACE.match(self.namespace):
            raise ValueError(
                f"namespace {self.namespace!r}: 1-16 lowercase letters/digits, a letter first"
            )

    def table(self, base: str) -> str:
        return f"{self.namespace}{base}"

    def queue(self, base: str) -> str:
        return f"{self.namespace}-{base}" if self.namespace else base

    def container(self, base: str) -> str:
        return self.queue(base)

    @property
    def jobs(self) -> str:
        return self.table(JOBS_TABLE)

    @property
    def tasks(self) -> str:
        return self.table(TASKS_TABLE)

    @property
    def plan_queue(self) -> str:
        return self.queue(PLAN_QUEUE)

    @property
    def done_queue(self) -> str:
        return self.queue(DONE_QUEUE)

    def shard_queue(self, shard: int) -> str:
        return self.queue(f"{TASK_QUEUE_PREFIX}{shard}")

    def poison_queue(self, queue: str) -> str:
        return f"{queue}{POISON_SUFFIX}"

    def all_queues(self, shards: int) -> list[str]:
        base = [self.plan_queue, self.done_queue]
        base += [self.shard_queue(i) for i in range(shards)]
        return base + [self.poison_queue(q) for q in base]


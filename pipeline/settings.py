"""bagpipe's settings: one frozen dataclass, every field declared once.

Each field carries its environment name, its default and its documentation (:func:`setting`);
everything else is derived from that one declaration: :meth:`Settings.from_env` (every entry
point — the local stack, the workers, the Functions app — builds its settings this way),
:meth:`Settings.to_env` (what a worker process is started with), the settings table of
``docs/operations.md`` (:func:`markdown_table`, ``python -m pipeline.settings``) and the app
settings Bicep deploys (:func:`deployed_settings`, in ``infra/bicep/names.json``). Tests keep
the table and the Bicep file equal to the declarations.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any

from pipeline.storage import names

PLANETARY_COMPUTER_STAC = "https://planetarycomputer.microsoft.com/api/stac/v1"
PLANETARY_COMPUTER_SAS = "https://planetarycomputer.microsoft.com/api/sas/v1/token"
PLANETARY_COMPUTER_HOSTS = frozenset({"planetarycomputer.microsoft.com"})  # where its subscription key may go
NASA_CMR = "https://cmr.earthdata.nasa.gov/search/"
EARTHDATA_HOSTS = ("urs.earthdata.nasa.gov,data.nsidc.earthdatacloud.nasa.gov,n5eil01u.ecs.nsidc.org,"
                   "data.lpdaac.earthdatacloud.nasa.gov,e4ftl01.cr.usgs.gov")
OFF = "none"  # the word that sets a setting with a non-empty default to empty


def setting(env: str, default: Any, doc: str, *, minimum: float | None = None, choices: tuple[str, ...] = (),
            secret: bool = False, local: bool = False, off: bool = False) -> Any:
    """Declare a setting: its environment name, its default, what it does.

    ``minimum``: the least a number may be; ``choices``: the words a text may be; ``secret``:
    kept out of ``repr`` (and so out of logs); ``local``: the Azure deployment leaves it unset;
    ``off``: the word ``none`` makes it empty (its default is not)."""
    return field(default=default, repr=not secret, metadata={
        "env": env, "doc": doc, "minimum": minimum, "choices": choices, "secret": secret, "local": local,
        "off": off})


@dataclass(frozen=True)
class Settings:
    """How one bagpipe process reaches storage and behaves."""

    storage_connection: str = setting(
        names.BINDING_CONNECTION, "", "A storage connection string (the local stack's Azurite). Empty in Azure.",
        secret=True, local=True)
    storage_account: str = setting(
        f"{names.BINDING_CONNECTION}__accountName", "",
        "The storage account reached with the managed identity (Azure; the Functions host reads its "
        "bindings' connection from the same prefix).")
    namespace: str = setting(
        "BAGPIPE_NAMESPACE", "", "Prefix of every table, queue and container name, so that deployments "
        "or tests share an account; empty in Azure.", local=True)
    shards: int = setting("BAGPIPE_SHARDS", 4, "Task queues the tasks are spread over.", minimum=1)
    window: int = setting(
        "BAGPIPE_WINDOW", 256, "Most tasks of one job released to the queues and not yet finished: "
        "fairness between jobs lives here.", minimum=1)
    partitions: int = setting(
        "BAGPIPE_PARTITIONS", 0, "Table partitions a job's tasks are spread over; 0: as many as its peak "
        "rate needs (pipeline/lifecycle/partitions.py). Rounded up to a divisor of `BAGPIPE_SHARDS`, "
        "at most that.", minimum=0)
    tasks_per_message: int = setting(
        "BAGPIPE_TASKS_PER_MESSAGE", 8, "Tasks a release names in one queue message (of one shard and "
        "partition): a worker claims them in one transaction, and a short task pays a share of a send, "
        "a receive and a delete. 1: a message per task; above 24, 24.", minimum=1)
    max_tasks: int = setting("BAGPIPE_MAX_TASKS", 50_000, "A request that would make more tasks is refused (413).",
                             minimum=1)
    requests_per_minute: int = setting(
        "BAGPIPE_REQUESTS_PER_MINUTE", 60, "Submissions, estimates and addresses to confirm that one user may ask "
        "for per minute, in bursts of as many (a token bucket per user in the users table, shared by every API "
        "instance); past it, 429 with Retry-After. 0: no limit.", minimum=0)
    max_attempts: int = setting("BAGPIPE_MAX_ATTEMPTS", 3, "Attempts a task gets before it is DEAD; two, when the "
                                "same input fails the same way twice (a program's error, a broken source).", minimum=1)
    max_transient_attempts: int = setting(
        "BAGPIPE_MAX_TRANSIENT_ATTEMPTS", 10, "Attempts a task gets while its failures are the platform's "
        "(a lost worker, a stall, a connection, a monitor kill), not its own.", minimum=1)
    lease_seconds: int = setting(
        "BAGPIPE_LEASE_SECONDS", 30, "Message visibility a worker holds and renews, every third of it, "
        "with a heartbeat.", minimum=3)
    entra_issuer: str = setting(
        "BAGPIPE_ENTRA_ISSUER", "", "The Microsoft Entra ID issuer whose ID tokens (as App Service "
        "Authentication forwards them) sign users in; with `BAGPIPE_ENTRA_CLIENT_ID`. Empty: personal "
        "API tokens only (the local stack).")
    entra_client_id: str = setting("BAGPIPE_ENTRA_CLIENT_ID", "", "The app registration of those ID tokens.")
    admin_emails: str = setting(
        "BAGPIPE_ADMIN_EMAILS", "", "E-mail addresses (comma-separated) whose Entra sign-in makes them "
        "admins at once: a new deployment's first admin.")
    bundle_cache: str = setting(
        "BAGPIPE_BUNDLE_CACHE", "", "Where a worker keeps the reducer bundles it fetched (empty: a folder "
        "of its own in the system's temporary folder).", local=True)
    default_budget_usd: float = setting(
        "BAGPIPE_DEFAULT_BUDGET_USD", 0.0, "The budget, in USD, of each user's openEO job that names none: a "
        "job whose estimate exceeds it is not started, and one whose measured cost passes it is stopped, "
        "keeping what it made. 0: no budget.", minimum=0.0)
    sas_minutes: int = setting("BAGPIPE_SAS_MINUTES", 60, "Lifetime of the download links in a job's results.",
                               minimum=1)
    mail_mode: str = setting(
        "BAGPIPE_MAIL_MODE", "none", "`smtp` (the local stack), `acs` (Azure Communication Services) or "
        "`none` (no email; the completion is still recorded).", choices=("smtp", "acs", "none"))
    mail_sender: str = setting("BAGPIPE_MAIL_SENDER", "bagpipe@localhost", "The From address.")
    portal_url: str = setting(
        "BAGPIPE_PORTAL_URL", "", "The portal's public address (its page: `https://HOST/portal/` in Azure, the API's "
        "own URL on the local stack): a job's email links the job's page there. Empty: the email has no such link.")
    mail_allowed: str = setting(
        "BAGPIPE_MAIL_ALLOWED", "", "Addresses and `@domains` (comma-separated) every user's jobs may mail without "
        "confirming them; `*`: any (the local stack's, whose SMTP server keeps what it receives). Empty: a user's "
        "own address and those they confirmed or an admin allowed.")
    smtp_host: str = setting("BAGPIPE_SMTP_HOST", "127.0.0.1", "The SMTP server of mail mode `smtp`.", local=True)
    smtp_port: int = setting("BAGPIPE_SMTP_PORT", 8025, "Its port.", minimum=1, local=True)
    acs_endpoint: str = setting("BAGPIPE_ACS_ENDPOINT", "", "The Communication Services endpoint of mail mode `acs`.")
    kill_factor: float = setting(
        "BAGPIPE_KILL_FACTOR", 4.0, "An attempt running past this many times its (stage, product) mean is "
        "revoked and retried (the ModisAzure rule).", minimum=1.0)
    kill_sigmas: float = setting(
        "BAGPIPE_KILL_SIGMAS", 0.0, "If above 0, revoke earlier, past mean + this many standard deviations, "
        "when that comes before the factor's limit.", minimum=0.0)
    kill_floor_s: float = setting(
        "BAGPIPE_KILL_FLOOR_S", 10.0, "Never revoke for time before this many seconds, so that noise on very "
        "short stages kills nothing.", minimum=0.0)
    kill_ceiling_s: float = setting(
        "BAGPIPE_KILL_CEILING_S", 1800.0, "The limit while a stage has too little history.", minimum=1.0)
    kill_backoff: float = setting(
        "BAGPIPE_KILL_BACKOFF", 2.0, "Each revocation for time lets a task's later attempts run this many "
        "times longer, up to the ceiling (1: one limit for all).", minimum=1.0)
    speculate_share: float = setting(
        "BAGPIPE_SPECULATE_SHARE", 0.1, "At a job's tail (no task of it queued), an attempt running past the "
        "speculation quantile of its history gets a backup copy on another worker, the first to commit winning; "
        "at most this share of the job's tasks get one (0: off).", minimum=0.0)
    speculate_quantile: float = setting(
        "BAGPIPE_SPECULATE_QUANTILE", 0.95, "The quantile of its history (a normal law of its mean and deviation) "
        "an attempt must run past before it gets a backup.", minimum=0.5)
    min_samples: int = setting("BAGPIPE_MIN_SAMPLES", 5, "Runs of a (stage, product) before its mean is trusted.",
                               minimum=1)
    kill_grace_s: float = setting("BAGPIPE_KILL_GRACE_S", 5.0, "Between SIGTERM and SIGKILL of a revoked stage.",
                                  minimum=0.0)
    slow_ratio: float = setting(
        "BAGPIPE_SLOW_RATIO", 2.0, "A worker whose recent attempts run this many times their history (and this "
        "many times as long as the others' do) is slow: drained and replaced (0: off).", minimum=0.0)
    monitor_interval_s: float = setting("BAGPIPE_MONITOR_INTERVAL_S", 5.0, "How often the monitor sweeps.",
                                        minimum=0.1)
    stage_limits: str = setting(
        "BAGPIPE_STAGE_LIMITS", "", "Per-stage overrides as JSON, e.g. `{\"modis\": {\"factor\": 3, "
        "\"floor\": 2, \"ceiling\": 60, \"max_attempts\": 5}}`.")
    stage_modules: str = setting("BAGPIPE_STAGE_MODULES", "",
                                 "Modules (comma-separated) whose import registers more stages.")
    tile_stage: str = setting(
        "BAGPIPE_TILE_STAGE", "modis", "The stage a tile task runs: `modis` (collection, then reprojection), "
        "or one a module of `BAGPIPE_STAGE_MODULES` registers (the tests' light stand-ins, e.g. `digest`).")
    tile_batch: int = setting(
        "BAGPIPE_TILE_BATCH", 0, "The most target tiles one tile task warps, each into its own output (1: a task "
        "per target tile); 0: 32 for the `modis` stage, 1 for any other (a stage given several takes each as "
        "`planning.places` gives it).", minimum=0)
    catalog: str = setting("BAGPIPE_CATALOG", "stac", "Where granules are searched: `stac` (a STAC API) or "
                           "`cmr` (NASA's Common Metadata Repository).", choices=("stac", "cmr"))
    stac_url: str = setting("BAGPIPE_STAC_URL", PLANETARY_COMPUTER_STAC, "The STAC API (Planetary Computer's).")
    stac_sas_url: str = setting(
        "BAGPIPE_STAC_SAS_URL", PLANETARY_COMPUTER_SAS, "The token endpoint that signs the STAC assets' Blob "
        "hrefs (`{url}/{account}/{container}`); `none`: the hrefs are public.", off=True)
    pc_subscription_key: str = setting(
        "BAGPIPE_PC_SUBSCRIPTION_KEY", "", "A Planetary Computer subscription key (`Ocp-Apim-Subscription-Key`), "
        "which raises its rate limits: sent with the STAC API's and the token endpoint's requests to Planetary "
        "Computer's hosts only, over HTTPS; a Key Vault reference in Azure. Never logged.", secret=True)
    cmr_url: str = setting("BAGPIPE_CMR_URL", NASA_CMR, "NASA CMR's search API.")
    earthdata_token: str = setting(
        "BAGPIPE_EARTHDATA_TOKEN", "", "An Earthdata Login bearer token, for files from NASA's archives "
        "(catalog `cmr`); a Key Vault reference in Azure. Never logged.", secret=True)
    earthdata_hosts: str = setting(
        "BAGPIPE_EARTHDATA_HOSTS", EARTHDATA_HOSTS, "The hosts the token may go to (comma-separated): the "
        "login host and NASA's data hosts. No other host ever sees it.")
    sandbox: str = setting(
        "BAGPIPE_SANDBOX", "auto", "How a worker confines a scientist's program: `auto` (in namespaces of its own "
        "where the kernel gives them, else without) or `no-namespaces` (as on a kernel without them: to check "
        "what holds there).", choices=("auto", "no-namespaces"))
    reducers_path: str = setting(
        "BAGPIPE_REDUCERS_PATH", "", "Folders (`:`-separated) of reducer manifests, on top of the shipped "
        "`reducers/`.")
    log_format: str = setting(
        "BAGPIPE_LOG_FORMAT", "text", "`text` or `json` (one object per line, with the job, task, attempt "
        "and stage of the record).", choices=("text", "json"))
    appinsights_connection: str = setting(
        "APPLICATIONINSIGHTS_CONNECTION_STRING", "", "Where OpenTelemetry traces, logs and metrics go (Azure "
        "Monitor); empty: telemetry stays in the logs.", secret=True)
    names: names.StorageNames = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.storage_connection and not self.storage_account:
            raise ValueError(f"no storage configured: set {env_name('storage_connection')} (a connection "
                             f"string) or {env_name('storage_account')}")
        for declared in declared_fields():
            value, choices = getattr(self, declared.name), declared.metadata["choices"]
            if choices and value not in choices:
                raise ValueError(f"setting {declared.metadata['env']}={value!r}: one of {', '.join(choices)}")
        if bool(self.entra_issuer) != bool(self.entra_client_id):
            raise ValueError(f"{env_name('entra_issuer')} and {env_name('entra_client_id')} go together")
        object.__setattr__(self, "names", names.StorageNames(self.namespace))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings an environment names; a setting unset or empty keeps its default, a
        number below its minimum is refused (code may go lower: tests do)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for declared in declared_fields():
            raw = env.get(declared.metadata["env"], "")
            if raw != "":
                values[declared.name] = _parse(declared, raw)
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        """The environment that rebuilds these settings in another process (a worker)."""
        env = {}
        for declared in declared_fields():
            value = getattr(self, declared.name)
            if value == "" and declared.metadata["off"]:
                env[declared.metadata["env"]] = OFF
            elif value != "":
                env[declared.metadata["env"]] = repr(value) if isinstance(value, float) else str(value)
        return env

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]  # checked by the dataclass itself


def declared_fields() -> list[Field[Any]]:
    """The fields declared with :func:`setting`, in their order."""
    return [f for f in fields(Settings) if "env" in f.metadata]


def env_name(field_name: str) -> str:
    """The environment name of a setting, for messages that tell a user what to set."""
    return str(next(f.metadata["env"] for f in declared_fields() if f.name == field_name))


def _parse(declared: Field[Any], raw: str) -> Any:
    key, minimum = declared.metadata["env"], declared.metadata["minimum"]
    kind: type[int | float | str] = type(declared.default)  # type: ignore[assignment]  # every setting has one
    if kind is str:
        return "" if declared.metadata["off"] and raw == OFF else raw
    try:
        value = kind(raw)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ValueError(f"setting {key}={raw!r} is not {what}") from None
    if minimum is not None and not value >= minimum:
        raise ValueError(f"setting {key}={value} is below its minimum {minimum}")
    return value


def bicep_key(field_name: str) -> str:
    """A setting's key in ``names.json`` (``kill_floor_s`` → ``killFloorS``)."""
    first, *rest = field_name.split("_")
    return first + "".join(word.title() for word in rest)


def deployed_settings() -> dict[str, str]:
    """Every setting the Azure deployment sets, by its key in ``names.json``: all but the
    local stack's own (its connection string, namespaces, SMTP server, bundle cache)."""
    return {bicep_key(f.name): f.metadata["env"] for f in declared_fields() if not f.metadata["local"]}


def markdown_table() -> str:
    """The settings table of ``docs/operations.md``."""
    rows = ["| setting | default | what it does |", "| --- | --- | --- |"]
    for declared in declared_fields():
        default = declared.default
        shown = f"`{default}`" if default != "" else "(empty)"
        notes = " Secret." if declared.metadata["secret"] else ""
        notes += " Local stack only." if declared.metadata["local"] else ""
        rows.append(f"| `{declared.metadata['env']}` | {shown} | {declared.metadata['doc']}{notes} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")

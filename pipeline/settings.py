"""bagpipe's settings: one frozen dataclass built from the environment.

Every field names its app setting (see :mod:`pipeline.names`) and its default beside it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pipeline import names

PLANETARY_COMPUTER_STAC = "https://planetarycomputer.microsoft.com/api/stac/v1"
PLANETARY_COMPUTER_SAS = "https://planetarycomputer.microsoft.com/api/sas/v1/token"
NASA_CMR = "https://cmr.earthdata.nasa.gov/search/"
EARTHDATA_HOSTS = ("urs.earthdata.nasa.gov,data.nsidc.earthdatacloud.nasa.gov,n5eil01u.ecs.nsidc.org,"
                   "data.lpdaac.earthdatacloud.nasa.gov,e4ftl01.cr.usgs.gov")

def _float(env: Mapping[str, str], key: str, default: float, minimum: float = 0.0) -> float:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"setting {key}={raw!r} is not a number") from None
    if not value >= minimum:
        raise ValueError(f"setting {key}={value} is below its minimum {minimum}")
    return value


def _int(env: Mapping[str, str], key: str, default: int, minimum: int = 1) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"setting {key}={raw!r} is not a whole number") from None
    if value < minimum:
        raise ValueError(f"setting {key}={value} is below its minimum {minimum}")
    return value


def _unless_none(value: str) -> str:
    return "" if value == "none" else value


@dataclass(frozen=True)
class Settings:
    """How one bagpipe process reaches storage and behaves."""

    # BagpipeStorage: a connection string (local stack, Azurite). Empty in Azure.
    storage_connection: str = field(default="", repr=False)  # it holds the account key
    # BagpipeStorage__accountName: the account reached with DefaultAzureCredential (Azure).
    storage_account: str = ""
    # BAGPIPE_NAMESPACE: prefix of every table/queue/container name; "" in Azure.
    namespace: str = ""
    # BAGPIPE_SHARDS: number of task queues the tasks are spread over (default 4).
    shards: int = 4
    # BAGPIPE_WINDOW: most tasks of one job released to the queues and not yet finished
    # (default 256): Azurite slows sharply with queue depth, fairness lives here.
    window: int = 256
    # BAGPIPE_MAX_TASKS: a request that would make more tasks is refused with 413 (50,000).
    max_tasks: int = 50_000
    # BAGPIPE_MAX_ATTEMPTS: attempts a task gets before it is DEAD (default 3).
    max_attempts: int = 3
    # BAGPIPE_MAX_TRANSIENT_ATTEMPTS: attempts a task gets while its failures are the
    # platform's (a lost worker, a stall, a connection, a monitor kill), not its own (10).
    max_transient_attempts: int = 10
    # BAGPIPE_LEASE_SECONDS: message visibility a worker holds and renews (default 30 s);
    # it renews and heartbeats every third of it.
    lease_seconds: int = 30
    # BAGPIPE_ENTRA_ISSUER / BAGPIPE_ENTRA_CLIENT_ID: the Microsoft Entra ID issuer (e.g.
    # https://login.microsoftonline.com/<tenant>/v2.0) and the app registration whose ID
    # tokens sign users in, as App Service Authentication forwards them (set by Bicep).
    # Empty (the local stack): personal API tokens only.
    entra_issuer: str = ""
    entra_client_id: str = ""
    # BAGPIPE_ADMIN_EMAILS: e-mail addresses (comma-separated) whose Entra sign-in makes
    # them admins at once, so that a new deployment has its first admin (default none).
    admin_emails: str = ""
    # BAGPIPE_BUNDLE_CACHE: where a worker keeps the reducer bundles it fetched (default: a
    # folder of its own under the system's temporary folder).
    bundle_cache: str = ""
    # BAGPIPE_SAS_MINUTES: lifetime of the download links in a job's results (default 60).
    sas_minutes: int = 60
    # BAGPIPE_MAIL_MODE: "smtp" (local stack), "acs" (Azure Communication Services) or
    # "none" (no email; the completion is still recorded).
    mail_mode: str = "none"
    # BAGPIPE_MAIL_SENDER: the From address (default bagpipe@localhost).
    mail_sender: str = "bagpipe@localhost"
    # BAGPIPE_SMTP_HOST / BAGPIPE_SMTP_PORT: the SMTP server for mail_mode "smtp".
    smtp_host: str = "127.0.0.1"
    smtp_port: int = 8025
    # BAGPIPE_ACS_ENDPOINT: the Communication Services endpoint for mail_mode "acs".
    acs_endpoint: str = ""
    # BAGPIPE_KILL_FACTOR: an attempt running past factor × its (stage, product) mean is
    # revoked and retried (default 4, the ModisAzure rule).
    kill_factor: float = 4.0
    # BAGPIPE_KILL_SIGMAS: if > 0, revoke earlier, past mean + sigmas × standard deviation
    # (a high quantile of the history) when that comes before factor × mean (default 0: off).
    kill_sigmas: float = 0.0
    # BAGPIPE_KILL_FLOOR_S: never revoke for time before this many seconds (default 10),
    # so that noise on very short stages kills nothing.
    kill_floor_s: float = 10.0
    # BAGPIPE_KILL_CEILING_S: the limit while a stage has too little history (default 1800).
    kill_ceiling_s: float = 1800.0
    # BAGPIPE_KILL_BACKOFF: each time a task is revoked for time, its later attempts may run
    # this many times longer, up to the ceiling (default 2; 1 keeps one limit for all).
    kill_backoff: float = 2.0
    # BAGPIPE_MIN_SAMPLES: runs of a (stage, product) before its mean is trusted (default 5).
    min_samples: int = 5
    # BAGPIPE_KILL_GRACE_S: between SIGTERM and SIGKILL of a revoked stage (default 5).
    kill_grace_s: float = 5.0
    # BAGPIPE_SLOW_RATIO: a worker whose recent attempts run this many times their history
    # (and this many times as long as the others' do) is slow: drained and replaced
    # (default 2; 0: off).
    slow_ratio: float = 2.0
    # BAGPIPE_MONITOR_INTERVAL_S: how often the monitor sweeps (default 5).
    monitor_interval_s: float = 5.0
    # BAGPIPE_STAGE_LIMITS: per-stage overrides as JSON, e.g.
    # {"digest": {"factor": 3, "floor": 2, "ceiling": 60, "max_attempts": 5}} (default none).
    stage_limits: str = ""
    # BAGPIPE_STAGE_MODULES: modules (comma-separated) whose import registers more stages.
    stage_modules: str = ""
    # BAGPIPE_TILE_STAGE: the stage a tile task runs (default "modis": collection then
    # reprojection; "digest" is a light stand-in that needs no catalog).
    tile_stage: str = "modis"
    # BAGPIPE_CATALOG: where granules are searched (pipeline/catalogs.py): "stac" (a STAC API,
    # default) or "cmr" (NASA's Common Metadata Repository).
    catalog: str = "stac"
    # BAGPIPE_STAC_URL: the STAC API (default Microsoft's Planetary Computer).
    stac_url: str = PLANETARY_COMPUTER_STAC
    # BAGPIPE_STAC_SAS_URL: the token endpoint that signs the STAC assets' Blob hrefs
    # ({url}/{account}/{container}; default Planetary Computer's); "none": the hrefs are public.
    stac_sas_url: str = PLANETARY_COMPUTER_SAS
    # BAGPIPE_CMR_URL: NASA CMR's search API (default https://cmr.earthdata.nasa.gov/search/).
    cmr_url: str = NASA_CMR
    # BAGPIPE_EARTHDATA_TOKEN: an Earthdata Login bearer token, for files from NASA's DAACs
    # (catalog "cmr"); a Key Vault reference in Azure. Never logged.
    earthdata_token: str = field(default="", repr=False)
    # BAGPIPE_EARTHDATA_HOSTS: the hosts the token may go to (comma-separated; default the
    # login host and the NSIDC and LP DAAC data hosts). No other host ever sees it.
    earthdata_hosts: str = EARTHDATA_HOSTS
    # BAGPIPE_REDUCERS_PATH: folders (":"-separated) of scientists' reducer manifests, on top
    # of the shipped reducers/ (default none).
    reducers_path: str = ""
    # BAGPIPE_LOG_FORMAT: "text" (default) or "json" (one object per line, with the job,
    # task, attempt and stage of the record).
    log_format: str = "text"
    # APPLICATIONINSIGHTS_CONNECTION_STRING: where OpenTelemetry traces, logs and metrics go
    # (Azure Monitor); default none: telemetry stays in the logs.
    appinsights_connection: str = ""
    names: names.StorageNames = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.storage_connection and not self.storage_account:
            raise ValueError(
                f"no storage configured: set {names.SETTING_STORAGE} (a connection string) "
                f"or {names.SETTING_STORAGE_ACCOUNT}"
            )
        if self.log_format not in ("text", "json"):
            raise ValueError(f"{names.SETTING_LOG_FORMAT}={self.log_format!r}: text or json")
        if self.catalog not in ("stac", "cmr"):
            raise ValueError(f"{names.SETTING_CATALOG}={self.catalog!r}: stac or cmr")
        if self.mail_mode not in ("smtp", "acs", "none"):
            raise ValueError(f"{names.SETTING_MAIL_MODE}={self.mail_mode!r}: smtp, acs or none")
        if bool(self.entra_issuer) != bool(self.entra_client_id):
            raise ValueError(f"{names.SETTING_ENTRA_ISSUER} and {names.SETTING_ENTRA_CLIENT_ID} go together")
        object.__setattr__(self, "names", names.StorageNames(self.namespace))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        return cls(
            storage_connection=env.get(names.SETTING_STORAGE, ""),
            storage_account=env.get(names.SETTING_STORAGE_ACCOUNT, ""),
            namespace=env.get(names.SETTING_NAMESPACE, ""),
            shards=_int(env, names.SETTING_SHARDS, 4),
            window=_int(env, names.SETTING_WINDOW, 256),
            max_tasks=_int(env, names.SETTING_MAX_TASKS, 50_000),
            max_attempts=_int(env, names.SETTING_MAX_ATTEMPTS, 3),
            max_transient_attempts=_int(env, names.SETTING_MAX_TRANSIENT_ATTEMPTS, 10),
            lease_seconds=_int(env, names.SETTING_LEASE_SECONDS, 30, minimum=3),
            entra_issuer=env.get(names.SETTING_ENTRA_ISSUER, ""),
            entra_client_id=env.get(names.SETTING_ENTRA_CLIENT_ID, ""),
            admin_emails=env.get(names.SETTING_ADMIN_EMAILS, ""),
            bundle_cache=env.get(names.SETTING_BUNDLE_CACHE, ""),
            sas_minutes=_int(env, names.SETTING_SAS_MINUTES, 60),
            mail_mode=env.get(names.SETTING_MAIL_MODE) or "none",
            mail_sender=env.get(names.SETTING_MAIL_SENDER) or "bagpipe@localhost",
            smtp_host=env.get(names.SETTING_SMTP_HOST) or "127.0.0.1",
            smtp_port=_int(env, names.SETTING_SMTP_PORT, 8025),
            acs_endpoint=env.get(names.SETTING_ACS_ENDPOINT, ""),
            kill_factor=_float(env, names.SETTING_KILL_FACTOR, 4.0, minimum=1.0),
            kill_sigmas=_float(env, names.SETTING_KILL_SIGMAS, 0.0),
            kill_floor_s=_float(env, names.SETTING_KILL_FLOOR, 10.0),
            kill_ceiling_s=_float(env, names.SETTING_KILL_CEILING, 1800.0, minimum=1.0),
            kill_backoff=_float(env, names.SETTING_KILL_BACKOFF, 2.0, minimum=1.0),
            min_samples=_int(env, names.SETTING_MIN_SAMPLES, 5),
            kill_grace_s=_float(env, names.SETTING_KILL_GRACE, 5.0),
            slow_ratio=_float(env, names.SETTING_SLOW_RATIO, 2.0),
            monitor_interval_s=_float(env, names.SETTING_MONITOR_INTERVAL, 5.0, minimum=0.1),
            stage_limits=env.get(names.SETTING_STAGE_LIMITS, ""),
            stage_modules=env.get(names.SETTING_STAGE_MODULES, ""),
            tile_stage=env.get(names.SETTING_TILE_STAGE) or "modis",
            catalog=env.get(names.SETTING_CATALOG) or "stac",
            stac_url=env.get(names.SETTING_STAC_URL) or PLANETARY_COMPUTER_STAC,
            stac_sas_url=_unless_none(env.get(names.SETTING_STAC_SAS_URL) or PLANETARY_COMPUTER_SAS),
            cmr_url=env.get(names.SETTING_CMR_URL) or NASA_CMR,
            earthdata_token=env.get(names.SETTING_EARTHDATA_TOKEN, ""),
            earthdata_hosts=env.get(names.SETTING_EARTHDATA_HOSTS) or EARTHDATA_HOSTS,
            reducers_path=env.get(names.SETTING_REDUCERS_PATH, ""),
            log_format=env.get(names.SETTING_LOG_FORMAT) or "text",
            appinsights_connection=env.get(names.SETTING_APPINSIGHTS, ""),
        )

    def to_env(self) -> dict[str, str]:
        """The app settings that rebuild these settings in another process (a worker)."""
        env = {
            names.SETTING_STORAGE: self.storage_connection,
            names.SETTING_STORAGE_ACCOUNT: self.storage_account,
            names.SETTING_NAMESPACE: self.namespace,
            names.SETTING_SHARDS: str(self.shards),
            names.SETTING_WINDOW: str(self.window),
            names.SETTING_MAX_TASKS: str(self.max_tasks),
            names.SETTING_MAX_ATTEMPTS: str(self.max_attempts),
            names.SETTING_MAX_TRANSIENT_ATTEMPTS: str(self.max_transient_attempts),
            names.SETTING_LEASE_SECONDS: str(self.lease_seconds),
            names.SETTING_ENTRA_ISSUER: self.entra_issuer,
            names.SETTING_ENTRA_CLIENT_ID: self.entra_client_id,
            names.SETTING_ADMIN_EMAILS: self.admin_emails,
            names.SETTING_BUNDLE_CACHE: self.bundle_cache,
            names.SETTING_SAS_MINUTES: str(self.sas_minutes),
            names.SETTING_MAIL_MODE: self.mail_mode,
            names.SETTING_MAIL_SENDER: self.mail_sender,
            names.SETTING_SMTP_HOST: self.smtp_host,
            names.SETTING_SMTP_PORT: str(self.smtp_port),
            names.SETTING_ACS_ENDPOINT: self.acs_endpoint,
            names.SETTING_KILL_FACTOR: repr(self.kill_factor),
            names.SETTING_KILL_SIGMAS: repr(self.kill_sigmas),
            names.SETTING_KILL_FLOOR: repr(self.kill_floor_s),
            names.SETTING_KILL_CEILING: repr(self.kill_ceiling_s),
            names.SETTING_KILL_BACKOFF: repr(self.kill_backoff),
            names.SETTING_MIN_SAMPLES: str(self.min_samples),
            names.SETTING_KILL_GRACE: repr(self.kill_grace_s),
            names.SETTING_SLOW_RATIO: repr(self.slow_ratio),
            names.SETTING_MONITOR_INTERVAL: repr(self.monitor_interval_s),
            names.SETTING_STAGE_LIMITS: self.stage_limits,
            names.SETTING_STAGE_MODULES: self.stage_modules,
            names.SETTING_TILE_STAGE: self.tile_stage,
            names.SETTING_CATALOG: self.catalog,
            names.SETTING_STAC_URL: self.stac_url,
            names.SETTING_STAC_SAS_URL: self.stac_sas_url or "none",
            names.SETTING_CMR_URL: self.cmr_url,
            names.SETTING_EARTHDATA_TOKEN: self.earthdata_token,
            names.SETTING_EARTHDATA_HOSTS: self.earthdata_hosts,
            names.SETTING_REDUCERS_PATH: self.reducers_path,
            names.SETTING_LOG_FORMAT: self.log_format,
            names.SETTING_APPINSIGHTS: self.appinsights_connection,
        }
        return {k: v for k, v in env.items() if v}

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)

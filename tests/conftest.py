"""Test fixtures: one real Azurite per session (disk mode, free ports, a temporary folder),
isolation by a unique namespace per test, a real SMTP server, and helpers to run real
workers against them."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bagpipe.azurite import Azurite
from bagpipe.earthdata import Earthdata
from bagpipe.mailserver import MailServer
from bagpipe.planetary import Planetary
from pipeline import planning
from pipeline.failures import FailureClass
from pipeline.lifecycle import ends, jobs
from pipeline.lifecycle.policy import Outcome
from pipeline.lifecycle.rollups import RollupWriter
from pipeline.lifecycle.status import TaskStatus
from pipeline.lifecycle.transitions import Claim
from pipeline.planning import Finished
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from pipeline.storage.clients import Clients, close_shared
from worker.runner import Worker

pytest_plugins = ["tests.schedule"]  # the longest modules first

# Where test stages leave their pid files. Set before any worker or fork server starts, as
# stage processes inherit the environment of the fork server, made once per process.
PIDS = Path(tempfile.mkdtemp(prefix="bagpipe-pids-"))
os.environ["BAGPIPE_TEST_PIDS"] = str(PIDS)
# Where `bagpipe up` records its home (bagpipe.client.record_home): the tests', not the user's.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="bagpipe-state-")


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    server = Azurite(tmp_path_factory.mktemp("azurite")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def planetary(azurite: Azurite) -> Iterator[Planetary]:
    """The local Planetary Computer (STAC API, SAS tokens, assets in the session's Azurite)."""
    with Planetary(azurite.connection_string) as imitation:
        yield imitation


@pytest.fixture(scope="session")
def nasa() -> Iterator[Earthdata]:
    """The local NASA: CMR, a DAAC archive, Earthdata Login and the archive's bucket."""
    with Earthdata() as imitation:
        yield imitation


def on_stac(settings: Settings, planetary: Planetary, **changes: object) -> Settings:
    """The deployment with real tile tasks whose granules come from the local Planetary Computer."""
    return settings.with_(tile_stage="modis", catalog="stac", stac_url=planetary.stac_url,
                          stac_sas_url=planetary.sas_url, **changes)


def on_cmr(settings: Settings, nasa: Earthdata, **changes: object) -> Settings:
    """The deployment with real tile tasks whose granules come from the local NASA."""
    return settings.with_(tile_stage="modis", catalog="cmr", cmr_url=nasa.cmr_url, earthdata_token=nasa.token,
                          earthdata_hosts=nasa.hosts, **changes)


@pytest.fixture
def mail(tmp_path: Path) -> Iterator[MailServer]:
    server = MailServer(tmp_path / "mail").start()
    yield server
    server.stop()


@pytest.fixture
def settings(azurite: Azurite, mail: MailServer) -> Settings:
    """Settings of a deployment of its own (a unique namespace) on the shared Azurite."""
    return Settings(
        storage_connection=azurite.connection_string,
        namespace=f"t{secrets.token_hex(5)}",
        window=64,
        tasks_per_message=1,  # a message per task: each test of one message's path; tests/test_messages.py has several
        lease_seconds=6,
        mail_mode="smtp",
        smtp_port=mail.port,
        mail_allowed="@example.org",  # every test address; tests/test_addresses.py asks for confirmations
        max_attempts=3,
        max_tasks=2000,
        tile_stage="digest",  # the lifecycle needs no rasters; tests of the raster stages set "modis"
        stage_modules="tests.stages_for_tests",
    )


@pytest.fixture
def clients(settings: Settings) -> Iterator[Clients]:
    found = Clients(settings)
    found.ensure_resources()
    yield found
    found.close()


@pytest.fixture(scope="module", autouse=True)
def _close_shared_clients() -> Iterator[None]:
    """The clients the code under test shared for a module's deployments (workers, the
    control loop, the API) are closed after it, their connections with them (after each
    test, a module's fixture that keeps an app for its tests would lose its clients)."""
    yield
    close_shared()


def parts(clients: Clients, job: str) -> list[str]:
    """The table partitions of ``job``'s tasks."""
    return jobs.get(clients, job).parts


def make_user(clients: Clients, name: str, role: str = "scientist") -> str:
    """A user of that name and role, and a personal API token of theirs."""
    from pipeline.web import identity

    user = identity.add_user(clients, name, f"{name}@example.org", role, by="test")  # type: ignore[arg-type]
    return identity.create_token(clients, user, "test", by="test")[0]


@pytest.fixture
def admin_token(clients: Clients) -> str:
    """The personal API token of an admin of this test's deployment."""
    return make_user(clients, "admin", "admin")


def signed(token: str) -> dict[str, str]:
    """The headers that sign a request in with a personal API token."""
    from pipeline.storage import names

    return {names.TOKEN_HEADER: token}


def small_request(**changes: object) -> JobRequest:
    """Two tiles × four 8-day periods of MOD10A2 = 8 tasks."""
    body: dict[str, object] = {
        "region": {"tiles": ["h09v05", "h10v05"]},
        "start": "2022-01-01",
        "end": "2022-01-31",
        "products": ["MOD10A2"],
        "email": "scientist@example.org",
    }
    body.update(changes)
    return JobRequest.model_validate(body)


def in_an_hour(*_: object) -> datetime:
    """A kill time far away, for a claim made by hand (``tasks.claim``)."""
    return datetime.now(UTC) + timedelta(hours=1)


def end(clients: Clients, writer: RollupWriter, held: Claim, outcome: Outcome) -> ends.Ended:
    """End the attempt ``held`` through the one door (``ends.end``), its job's progress not
    followed: the tests of a move alone (workers and the monitor follow it)."""
    return ends.end(clients, writer, held, outcome, follow=lambda job: None)


def commit(clients: Clients, writer: RollupWriter, held: Claim, status: TaskStatus = TaskStatus.SUCCEEDED,
           outputs: list[str] | None = None) -> bool:
    """End ``held`` as committed (:func:`end`); whether it held the task."""
    return end(clients, writer, held, Outcome.committed(status, outputs or [])).applied


def fail(clients: Clients, writer: RollupWriter, held: Claim, failure: FailureClass, error: str,
         again: bool = False) -> TaskStatus | None:
    """End ``held`` as failed (:func:`end`; ``again``: its previous attempt failed so too);
    where it left its task (None: the attempt no longer held it)."""
    if again:
        held = dataclasses.replace(held, last_failure=failure.value)
    return end(clients, writer, held, Outcome.failed(failure, error)).status


def wait_for(predicate: Callable[[], object], timeout: float = 60, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


@contextlib.contextmanager
def decided_within(cpu_s: float, wall_s: float = 15.0) -> Iterator[None]:
    """Assert that the block spent under ``cpu_s`` seconds of this process's CPU — what
    deciding costs, which a busy machine does not stretch (at load 20 on two cores a
    process gets a tenth of a core, and milliseconds of work take a second of the wall
    clock) — and under ``wall_s`` of the wall clock: it waited on nothing either."""
    cpu, wall = time.process_time(), time.monotonic()
    yield
    spent, waited = time.process_time() - cpu, time.monotonic() - wall
    assert spent < cpu_s, f"{spent:.3f} s of CPU, over {cpu_s} s"
    assert waited < wall_s, f"{waited:.1f} s, over {wall_s} s"


class WorkerThreads:
    """Real workers (the production Worker class) run in threads of the test process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.workers: list[Worker] = []
        self.threads: list[threading.Thread] = []

    def start(self, count: int = 1, slots: int = 2) -> list[Worker]:
        started = []
        for _ in range(count):
            worker = Worker(self.settings, slots=slots, idle_sleep=0.1)
            thread = threading.Thread(target=worker.run, daemon=True)
            thread.start()
            self.workers.append(worker)
            self.threads.append(thread)
            started.append(worker)
        return started

    def stop(self) -> None:
        for worker in self.workers:
            worker.stopping.set()
        for thread in self.threads:
            thread.join(60)


@pytest.fixture
def workers(settings: Settings) -> Iterator[WorkerThreads]:
    pool = WorkerThreads(settings)
    yield pool
    pool.stop()


@contextlib.contextmanager
def running_control(settings: Settings) -> Iterator[threading.Event]:
    """The local stack's control loop (planner, completion, monitor) in a thread."""
    from bagpipe import control

    stop = threading.Event()
    thread = threading.Thread(target=control.run, args=(settings, stop),
                              kwargs={"sweep_every": 0.5, "idle_sleep": 0.05}, daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(30)


@pytest.fixture
def control_loop(settings: Settings) -> Iterator[threading.Event]:
    with running_control(settings) as stop:
        yield stop


def with_stage(settings: Settings, stage: str, **changes: object) -> Settings:
    """The same deployment with tile tasks running one of tests/stages_for_tests.py."""
    return settings.with_(stage_modules="tests.stages_for_tests", tile_stage=stage, **changes)


class PlanOnly:
    """A stand-in application whose plan is a test's own: its manifest entries are its tasks'
    parameters, and it adds nothing of its products."""

    def entry(self, params: dict[str, str]) -> dict[str, object]:
        return dict(params)

    def finished(self, clients: Clients, row: jobs.JobRow, entries: list[dict[str, object]]) -> Finished:
        return Finished()


@contextlib.contextmanager
def registered(application: planning.Application) -> Iterator[None]:
    """``application`` the deployment's while the block runs, then the one before it again."""
    before = planning.application()
    planning.register(application)
    try:
        yield
    finally:
        planning.register(before)


@contextlib.contextmanager
def running_workers(settings: Settings, count: int = 1, slots: int = 2) -> Iterator[WorkerThreads]:
    pool = WorkerThreads(settings)
    pool.start(count, slots)
    try:
        yield pool
    finally:
        pool.stop()


@contextlib.contextmanager
def descriptors_past_select() -> Iterator[None]:
    """Hold this process's lowest free descriptors until the next one opened lies past 1,100,
    beyond what select() takes (a long-lived worker's connection pools may get it there)."""
    held: list[int] = []
    while not held or held[-1] <= 1100:
        held.append(os.open(os.devnull, os.O_RDONLY))
    try:
        yield
    finally:
        for fd in held:
            os.close(fd)


def queue_depth(clients: Clients) -> int:
    return sum(q.get_queue_properties().approximate_message_count for q in clients.shard_queues)


def job_write_answer_lost(monkeypatch: pytest.MonkeyPatch, clients: Clients,
                          when: Callable[[set[str]], bool]) -> list[bool]:
    """The first write of a job row by ``clients`` whose fields (``jobs.JobRow``'s names)
    ``when`` picks is applied, its answer lost, and the client's retry of the same request
    refused (412: the row changed, by that very write). Returns a list that holds True once
    that happened."""
    real, lost = clients.jobs.update_entity, list[bool]()

    def applied_then_refused(entity: dict[str, object], *args: object, **kwargs: object) -> object:
        answer = real(entity, *args, **kwargs)  # type: ignore[arg-type]
        if not lost and when({name for name, stored in jobs.JobRow.stored_names().items() if stored in entity}):
            lost.append(True)
            real(entity, *args, **kwargs)  # type: ignore[arg-type]
        return answer

    monkeypatch.setattr(clients.jobs, "update_entity", applied_then_refused)
    return lost

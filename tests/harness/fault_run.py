"""One run of the fault-injection scenario (``tests.harness.faults`` sweeps it over every storage call):
the SDK's per-request hooks name the run's calls and fault one or more of them
(``tests.harness.fault_plan``), a driver runs the components one step at a time, and the
verdict is read from storage alone."""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bagpipe import control
from bagpipe.azurite import Azurite
from bagpipe.mailserver import MailServer
from pipeline.lifecycle import attempts, health, jobs, monitor, rollups, sweep, tasks
from pipeline.lifecycle.notify import mailer_for
from pipeline.lifecycle.status import TERMINAL, JobState, TaskStatus
from pipeline.requests import application
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from pipeline.storage import clients as clients_module
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.harness import fault_stage
from tests.harness.fault_plan import Crash, Plan, hooked
from worker.child import StageProcess
from worker.runner import Worker

COMMITTED = {TaskStatus.SUCCEEDED.value, TaskStatus.CACHED.value, TaskStatus.NO_DATA.value}
IDLE_S = 0.5  # a step that found nothing to do waits this long (as an idle worker does)
# A worker step that takes longer is a worker lost mid-attempt: the scripted hang, or on a
# loaded machine any slow step (a loss beyond the script, which the run must survive as well;
# the drive's time limit leaves no room for steps much longer than this).
STEP_S = 30.0
# where the scripted lost attempt says it hangs (stage processes inherit it from the fork server)
# (the fork server imports this module again: it must find the parent's folder, not make one)
HANGS = Path(os.environ.get(fault_stage.HANGS_ENV) or tempfile.mkdtemp(prefix="bagpipe-fault-hangs-"))
os.environ[fault_stage.HANGS_ENV] = str(HANGS)
JOB_A = {"region": {"bbox": [-108.9, 35.1, -107.1, 35.9]}, "start": "2022-01-01", "end": "2022-01-16",
         "products": ["MOD10A2"], "grid": {"tile_size": 1, "resolution": 0.0625}, "email": "faults@example.org",
         "reducer": {"name": "max_composite", "on_dependency_failure": "run"}, "label": "faults: tiles and reductions"}
JOB_B = {"region": {"bbox": [-110.9, 35.1, -110.1, 35.9]}, "start": "2022-01-01", "end": "2022-01-16",
         "products": ["MOD10A2"], "grid": {"tile_size": 1, "resolution": 0.0625}, "email": "faults@example.org",
         "label": "faults: cancelled"}


# the scenario deployment's shard queues (``tests.harness.faults --task-queues``): with 2, its jobs lie
# in two table partitions and a message names one attempt; with 1, in one partition, and a
# message names several, claimed together
TASK_QUEUES = 2


class Run:
    """One run of the scenario against a deployment of its own, with ``plan``'s fault."""

    def __init__(self, azurite: Azurite, mail_folder: Path, plan: Plan, lease_seconds: int = 3) -> None:
        self.plan = plan
        self.mail = MailServer(mail_folder).start()
        self.settings = Settings(
            storage_connection=azurite.connection_string, namespace=f"t{secrets.token_hex(5)}",
            lease_seconds=lease_seconds, window=4, partitions=min(2, TASK_QUEUES), shards=TASK_QUEUES,
            mail_mode="smtp", smtp_port=self.mail.port,
            tile_stage="fault_tile", tile_batch=32, stage_modules="tests.harness.fault_stage", max_tasks=100,
            stage_limits=json.dumps({"fault_tile": {"max_transient_attempts": 20}}))
        with self.quiet():
            Clients(self.settings).ensure_resources()  # as Bicep does: before the run, not faulted
        self.clients: dict[str, Clients] = {}  # each component's, as each process has its own
        self.workers: dict[str, Worker] = {}
        self.jobs: list[str] = []
        self.fresh = 0  # processes started again after a crash
        self.steps = 0

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """The driver's own calls: not numbered, never faulted."""
        self.plan.paused = True
        try:
            yield
        finally:
            self.plan.paused = False

    # --- components: each step runs as one of them ------------------------------------------
    def _as(self, component: str, step: Callable[[], Any]) -> Any:
        """Run ``step`` as ``component``; a crash there ends it (its next step is a fresh
        process: nothing of its memory survives)."""
        self.plan.component = component
        try:
            return step()
        except Crash:
            self._restart(component)
            return None
        except Exception:  # a component's own error: its message comes back, the sweep retries
            return None
        finally:
            self.plan.component = "driver"

    def _restart(self, component: str) -> None:
        self.plan.dead.discard(component)
        self.fresh += 1
        self.clients.pop(component, None)
        if component in self.workers:
            self.workers.pop(component).kill()
        if component == "control":  # module-level state of the control process starts anew
            monitor._writer = rollups.RollupWriter(f"monitor-{secrets.token_hex(6)}")
            sweep._writer = rollups.RollupWriter(f"sweep-{secrets.token_hex(6)}")

    def _clients_of(self, component: str) -> Clients:
        if component not in self.clients:
            self.clients[component] = Clients(self.settings)
        return self.clients[component]

    def api_submit(self, body: dict[str, Any]) -> None:
        row = self._as("api", lambda: application.submit(self._clients_of("api"), JobRequest.model_validate(body)))
        if row is not None:
            self.jobs.append(row.job)

    def api_cancel(self, job: str) -> None:
        self._as("api", lambda: jobs.cancel(self._clients_of("api"), job, owner=f"api-cancel-{job}"))

    def control(self, sweep_now: bool) -> int:
        """One pass of the control loop: plan and done messages, and the sweep if due."""
        clients = self._clients_of("control")
        mailer = mailer_for(self.settings)
        visibility = 2 * self.settings.lease_seconds
        names_ = self.settings.names

        def one_pass() -> int:
            busy = control.drain(clients.plan_queue, clients.queue(names_.poison_queue(names_.plan_queue)),
                                 lambda body: sweep.handle_plan(clients, body), visibility)
            busy += control.drain(clients.done_queue, clients.queue(names_.poison_queue(names_.done_queue)),
                                  lambda body: sweep.handle_done(clients, mailer, body), visibility)
            if sweep_now:
                sweep.sweep(clients)
            return busy

        return self._as("control", one_pass) or 0

    def worker(self, name: str) -> int:
        """One worker step: receive about two attempts and run them. A step that hangs is the scripted
        lost worker: its stage is killed and the worker is gone, as if its VM died."""
        if name not in self.workers:
            self.workers[name] = Worker(self.settings, slots=1, worker_id=f"{name}-{secrets.token_hex(3)}")
            self.workers[name].warm()
        worker = self.workers[name]
        result: list[int] = []
        # about two attempts a step: their rows read ahead in one query (worker.readahead), and
        # claimed together where one message names them (TASK_QUEUES = 1)
        thread = threading.Thread(target=lambda: result.append(self._as(name, lambda: worker.run_once(2)) or 0),
                                  daemon=True)
        thread.start()
        deadline = time.monotonic() + STEP_S
        while thread.is_alive() and time.monotonic() < deadline and not any(HANGS.iterdir()):
            thread.join(0.05)
        if thread.is_alive():
            for hang in HANGS.iterdir():
                if hang.suffix == ".slow":
                    self._found_slow(worker)
                hang.unlink(missing_ok=True)
            self.plan.dead.add(name)
            worker.kill()
            thread.join(60)
            if name in self.workers:
                self._restart(name)
            return 1
        return result[0] if result else 0

    def _found_slow(self, lost: Worker) -> None:
        """The scripted slow machine: its worker reports a stall (as its probe finds on a
        machine that barely runs it), the others their ordinary pace, so that the monitor's
        next pass finds it slow and takes its attempt from it (``monitor.revoke_slow``) —
        the other lost attempt is left to its heartbeat's lapse. The reports are the workers'
        own calls, made for them here."""
        with self.quiet():
            clients = Clients(self.settings)
            for worker in self.workers.values():
                health.report(clients, worker.id, [1.0, 1.0], [], 1, 2, 6.7 if worker is lost else 1.0)

    # --- the scenario ---------------------------------------------------------------------
    def drive(self, timeout: float = 150.0) -> None:
        self.api_submit(JOB_A)
        self.api_submit(JOB_B)
        started = time.monotonic()
        cancelled = repeated = False
        while time.monotonic() - started < timeout:
            self.steps += 1
            busy = self.control(sweep_now=self.steps % 3 == 0)
            if not cancelled and len(self.jobs) > 1 and self.steps >= 3:
                self.api_cancel(self.jobs[1])
                cancelled = True
            if not repeated and self.jobs and self.ended(self.jobs[0]):
                self.api_submit(JOB_A)  # the same request again: its tiles are settled at planning
                repeated = True
            busy += self.worker("w1") + self.worker("w2")
            if self.finished() and self.settled():
                return
            if not busy:
                time.sleep(IDLE_S)

    def settled(self) -> bool:
        """The sweep goes on after the jobs end, as it does in production: one pass of it that
        runs whole, for what only it tidies (the marker of a maker that died, its task cancelled)."""
        clients = self._clients_of("control")
        report = self._as("control", lambda: sweep.sweep(clients))
        return report is not None and report["errors"] == 0

    def ended(self, job: str) -> bool:
        with self.quiet():
            return jobs.get(Clients(self.settings), job).state.finished

    def finished(self) -> bool:
        with self.quiet():
            clients = Clients(self.settings)
            found = self.known_jobs(clients)
            return bool(found) and all(jobs.get(clients, j).state.finished for j in found)

    def known_jobs(self, clients: Clients) -> list[str]:
        """Every job storage holds (a submit that crashed may have made one)."""
        listed = clients.jobs.query_entities("PartitionKey eq @pk", parameters={"pk": jobs.LISTING})
        return [row["Job"] for row in listed if _exists(clients, row["Job"])]

    def close(self) -> None:
        with self.quiet():
            for worker in self.workers.values():
                worker.close()
            for clients in self.clients.values():
                clients.close()
            shared = clients_module._shared.pop(self.settings, None)  # the workers' (clients_for)
            if shared is not None:
                shared.close()
        self.mail.stop()

    # --- the verdict, from storage alone ---------------------------------------------------
    def check(self) -> dict[str, Any]:
        with self.quiet():
            return self._check(Clients(self.settings))

    def _check(self, clients: Clients) -> dict[str, Any]:
        found: Counter[str] = Counter()
        problems: list[str] = []
        mails = [m for _, m in self.mail.messages()]
        for job in self.known_jobs(clients):
            row = jobs.get(clients, job)
            if not row.state.finished:
                found["stuck_jobs"] += 1
                problems.append(f"{job} {row.state.value}")
            elif row.state is JobState.FAILED:  # every fault is transient: retries must absorb it
                found["failed_jobs"] += 1
                problems.append(f"{job} FAILED: {row.error or 'a task is DEAD'}")
            rows = tasks.list_tasks(clients.tasks, row.parts)
            tried = [r for part in row.parts for r in clients.tasks.query_entities(
                "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
                parameters={"pk": part, "lo": "~", "hi": "~~"})]
            ran = [attempts.AttemptRow.from_entity(r) for r in tried if r["RowKey"].startswith(names.ATTEMPT_PREFIX)]
            for task in rows:
                if task.status not in TERMINAL:
                    found["lost"] += 1
                    problems.append(f"{job}/{task.task} {task.status.value}")
                committed = [a for a in ran if a.task == task.task and a.outcome in COMMITTED]
                if len(committed) > 1:
                    found["duplicates"] += 1
                    problems.append(f"{job}/{task.task} committed {len(committed)} times")
                # a task settled at planning has no attempt: it was never queued, nor run
                expected = [] if task.settled_at else [task.attempt]
                if task.status.value in COMMITTED and [a.attempt for a in committed] != expected:
                    found["duplicates"] += 1
                    problems.append(f"{job}/{task.task} row names attempt {task.attempt}, "
                                    f"committed {[a.attempt for a in committed]}")
                if task.settled_at:
                    found["settled"] += 1
                    if [a for a in ran if a.task == task.task]:
                        found["duplicates"] += 1
                        problems.append(f"{job}/{task.task} settled at planning, yet claimed")
            indexes = (names.DEADLINE_PREFIX, names.DISPATCH_PREFIX)
            left = [r["RowKey"] for r in tried if r["RowKey"].startswith(indexes)]
            if left and row.state.finished:
                found["leftovers"] += len(left)
                problems.append(f"{job} index rows left: {left[:3]}")
            ids = {m["Message-ID"] for m in mails if job in str(m["Subject"])}
            if row.state.finished and not ids:
                found["missing_emails"] += 1
                problems.append(f"{job}: no email")
            if len(ids) > 1:
                found["extra_emails"] += len(ids) - 1
                problems.append(f"{job}: {len(ids)} different emails")
            resent = sum(job in str(m["Subject"]) for m in mails) - len(ids)
            if resent > 0:  # one Message-ID sent twice is still a second email in a scientist's mailbox
                found["resent_emails"] += resent
                problems.append(f"{job}: its email sent {resent + 1} times")
            if job in jobs.active_jobs(clients) and row.state.finished:
                problems.append(f"{job} finished but still active")
                found["leftovers"] += 1
        markers = [b.name for c in (clients.tiles, clients.sources)
                   for b in c.list_blobs(name_starts_with=names.MARKER_PREFIX)]
        found["leftovers"] += len(markers)
        problems += [f"marker left: {m}" for m in markers]
        return {"counts": dict(found), "problems": problems}


def _exists(clients: Clients, job: str) -> bool:
    try:
        jobs.get(clients, job)
        return True
    except jobs.JobNotFound:
        return False


def warm_fork_server() -> None:
    """Start the stage processes' fork server once, before any run is timed (it imports
    the stage modules: seconds on a busy machine)."""
    StageProcess(Settings(storage_connection="UseDevelopmentStorage=true")).close()


def _ignore_crashes(args: threading.ExceptHookArgs) -> None:
    """A crashed component's other threads (its lease's heartbeat) end with it, silently."""
    if not isinstance(args.exc_value, Crash):
        threading.__excepthook__(args)


def run_one(azurite: Azurite, workdir: Path, faults: dict[str, str], name: str = "") -> dict[str, Any]:
    """One run with ``faults`` (point → kind; none: a clean run); its verdict, the points it
    faulted and its calls. ``name`` names the run's mail folder."""
    plan = Plan(faults=dict(faults))
    threading.excepthook = _ignore_crashes
    with hooked(plan):
        run = Run(azurite, workdir / f"mail-{name or secrets.token_hex(4)}", plan)
        try:
            run.drive()
        finally:
            run.close()
        verdict = run.check()
    return {"faults": faults, "hits": plan.hits, "calls": plan.calls, "restarts": run.fresh,
            "steps": run.steps} | verdict

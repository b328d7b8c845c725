"""The worker loop: receive task messages in batches from the shards, run each claimed
attempt under a lease, commit it fenced on the task row, then delete the message.

While its attempts are short, a worker receives a slot's worth of messages ahead of its
free slots, so that one receive serves several tasks; a message that waits too long for a
slot is handed back for any worker to take, as are all of them when the worker stops.

A message that cannot be decoded goes to its shard's poison queue with a record. Any other
is settled through its task's row, however often it was delivered: the claim runs it if the
row wants it (the row's retry budget bounds how often), else it is deleted. SIGTERM stops
receiving; the attempts in hand finish (or fail and are requeued) before the process exits.

While it holds attempts, a worker reports how they compare with their history
(``pipeline.lifecycle.health``); once the monitor finds it slow, it drains: it takes nothing more,
gives up the attempts it holds (each requeued at once for a healthy worker) and exits, for
a fresh one to replace it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from azure.storage.queue import QueueClient, QueueMessage

from pipeline import telemetry
from pipeline.lifecycle import attempts, health, policy, progress, runtimes, speculation, tasks, transitions
from pipeline.lifecycle.failures import FailureClass
from pipeline.lifecycle.status import TaskStatus
from pipeline.redact import redact
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients, clients_for
from worker import private
from worker.child import Outcome
from worker.lease import Lease
from worker.pace import Pace, bound_to_overrun
from worker.readahead import RowsAhead
from worker.slot import Slot

log = logging.getLogger(__name__)

MAX_RECEIVE = 32  # messages one receive may return (the service's limit)
AHEAD_BELOW_S = 1.0  # receive ahead of free slots while attempts take less than this (moving mean)
AHEAD_HOLD_S = 2.0  # a message received ahead that waits this long is handed back
BACKUP_PASSES = 5  # a backup received by the worker that runs its attempt is handed back this often
PAST_KILL_TIME = "ran past its kill time"  # the error of an attempt its own worker revoked
BOUND_PAST_KILL_TIME = "bound to run far past its kill time at its pace"  # ... revoked sooner


class Worker:
    def __init__(self, settings: Settings, slots: int = 2, worker_id: str | None = None,
                 idle_sleep: float = 0.5, exit_when_idle: float | None = None) -> None:
        private.make_private()  # it holds the storage identity
        self.clients: Clients = clients_for(settings)
        self.settings = settings
        self.slots = slots
        self.id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.idle_sleep = idle_sleep
        # stop after this many seconds with every shard empty and no task in hand (an
        # event-driven execution in Azure Container Apps ends when the work is done)
        self.exit_when_idle = exit_when_idle
        self.stopping = threading.Event()
        self.draining = threading.Event()  # found slow: give up what is in hand, then exit
        self.history = runtimes.RuntimeBook(self.clients.runtimes)
        self.progress = progress.Watch(self.clients)  # what follows for a job when a task ends here
        self._free = threading.Semaphore(slots)
        self._slots = [Slot(tasks.TerminalCounter(health.slot_writer(self.id, i))) for i in range(slots)]
        self._slot_pool: list[Slot] = list(self._slots)
        self._pool_lock = threading.Lock()
        # messages received and not yet handed to a slot: (queue, message, when received)
        self._ahead: deque[tuple[QueueClient, QueueMessage, float]] = deque()
        self._rows = RowsAhead(self.clients, AHEAD_HOLD_S)  # their task rows, where one query reads several
        self._recent_s: float | None = None  # moving mean of this worker's attempt times
        self._turn = 0  # the shard run_once receives from next
        self.handled = 0  # messages that named an attempt this worker claimed
        self.handed_back = 0  # messages received ahead that went back to the queue unrun
        self.pace = Pace(settings.slow_ratio)  # its attempts against their history, for its health

    def run(self) -> None:
        """Pull and run tasks until :attr:`stopping` is set; then finish what is in hand.
        The slots' stage processes are started first, so that the first tasks do not wait
        for the fork server's imports."""
        self.warm()
        if self.settings.slow_ratio > 0:  # how its machine runs it, for its health
            threading.Thread(target=self.pace.probe, args=(self.stopping,), name="stall-probe", daemon=True).start()
        log.info("worker %s ready", self.id)
        queues = self.clients.shard_queues
        shard = 0
        idle = 0
        last_work = time.monotonic()
        with ThreadPoolExecutor(self.slots, thread_name_prefix="slot") as pool:
            while not self.stopping.is_set():
                self._hand_back_waiting(AHEAD_HOLD_S)
                self._report_health()
                self.progress.catch_up()
                free = 0
                while free < self.slots and (
                    self._free.acquire(blocking=False) if free else self._free.acquire(timeout=0.2)
                ):
                    free += 1
                if free == 0:
                    continue
                if self.pace.asked():  # an attempt was taken from it, or it stalls: hear the monitor first
                    for _ in range(free):
                        self._free.release()
                    continue
                received = 0
                if len(self._ahead) < free:
                    queue = queues[shard % len(queues)]
                    shard += 1
                    received = self._receive(queue, free - len(self._ahead) + self._extra())
                started = 0
                while started < free and self._ahead:
                    queue, message, _ = self._ahead.popleft()
                    pool.submit(self._slot, queue, message)
                    started += 1
                for _ in range(free - started):
                    self._free.release()
                idle = 0 if received or started else idle + 1
                if started or self._busy():
                    last_work = time.monotonic()
                if idle >= len(queues):  # every shard was empty: wait a little
                    if not self._busy():
                        self.history.flush()
                    if self.exit_when_idle is not None and time.monotonic() - last_work >= self.exit_when_idle:
                        log.info("worker %s: queues idle for %.0f s, exiting", self.id, self.exit_when_idle)
                        self.stopping.set()
                        break
                    self.stopping.wait(self.idle_sleep)
                    idle = 0
            self._hand_back_waiting(0)
        if self.draining.is_set():
            health.left(self.clients, self.id, "replaced")
            log.warning("worker %s found slow: drained, exiting to be replaced", self.id)
        self.close()

    def run_once(self, count: int = 1) -> int:
        """Receive up to ``count`` messages from the next shard and run them to their end in
        the calling thread, one after another. The fault-injection harness drives workers
        this way, so that their storage calls come in one order. Returns how many messages
        it received."""
        queue = self.clients.shard_queues[self._turn % len(self.clients.shard_queues)]
        self._turn += 1
        received = self._receive(queue, count)
        while self._ahead:
            self._free.acquire()
            self._slot(*self._ahead.popleft()[:2])
        return received

    def close(self) -> None:
        """Merge the last runtime samples; let the slots' stage processes end."""
        self.history.flush()
        for slot in self._slots:
            slot.close()

    def warm(self) -> None:
        """Start the slots' stage processes now (run() does it first thing)."""
        for slot in self._slots:
            slot.stage_process(self.settings)

    def kill(self) -> None:
        """SIGKILL the slots' stage processes and merge nothing: what a worker whose machine
        died leaves behind (the fault-injection harness's lost worker). Safe from another
        thread: it only sends signals."""
        for slot in self._slots:
            if slot.process is not None:
                slot.process.signal(signal.SIGKILL)

    def _receive(self, queue: QueueClient, count: int) -> int:
        """Receive up to ``count`` messages from ``queue`` into the waiting line."""
        count = min(count, MAX_RECEIVE)
        try:
            batch = list(queue.receive_messages(messages_per_page=count, max_messages=count,
                                                visibility_timeout=self.settings.lease_seconds))
        except Exception as exc:
            log.warning("receive from %s failed: %s", queue.queue_name, exc)
            return 0
        self._rows.read(batch)
        at = time.monotonic()
        self._ahead.extend((queue, message, at) for message in batch)
        return len(batch)

    def _extra(self) -> int:
        """How many messages to receive beyond the free slots: one per slot while this
        worker's recent attempts are short (a receive then serves several tasks), none
        while they are long (a message held for a busy slot is one an idle worker could
        run)."""
        with self._pool_lock:
            recent = self._recent_s
        return self.slots if recent is not None and recent < AHEAD_BELOW_S else 0

    def _hand_back_waiting(self, older_than: float) -> None:
        """Make messages received ahead that have waited ``older_than`` seconds visible
        again, for any worker (on stopping, all of them)."""
        while self._ahead and time.monotonic() - self._ahead[0][2] >= older_than:
            queue, message, _ = self._ahead.popleft()
            try:
                queue.update_message(message.id, pop_receipt=message.pop_receipt, visibility_timeout=0)
                self.handed_back += 1
            except Exception as exc:  # it comes back when its visibility times out all the same
                log.info("message %s not handed back: %s", message.id, exc)

    def _report_health(self) -> None:
        """While attempts are in hand, report how they compare with their history (now and
        then: ``Pace.report``, or at once when asked: its stall reached the floor, or an
        attempt was taken from it, which may leave it idle); if the monitor has found this
        worker slow, drain."""
        if not self._busy() and not self.pace.asked():
            return
        try:
            state = self.pace.report(self.clients, self.id, self.slots)
        except Exception as exc:  # statistics: the next report tries again
            log.info("health report of %s failed: %s", self.id, exc)
            return
        if state == health.SLOW and not self.draining.is_set():
            log.warning("worker %s found slow by the monitor: draining", self.id)
            self.draining.set()
            self.stopping.set()

    def _expected_s(self, held: transitions.Claim) -> float | None:
        """The attempt's expected seconds from its history (None while it is not trusted)."""
        history = self.history.read(held.stage, runtimes.history_key(held.params))
        if history.count < self.settings.min_samples:
            return None
        return history.mean * runtimes.work_of(held.params) or None

    def _busy(self) -> bool:
        with self._pool_lock:
            return len(self._slot_pool) < self.slots  # a slot holds a task

    def _slot(self, queue: QueueClient, message: QueueMessage) -> None:
        with self._pool_lock:
            slot = self._slot_pool.pop()
        started = time.monotonic()
        try:
            self.handle(queue, message, slot)
        except Exception:
            log.exception("task message %s on %s could not be handled", message.id, queue.queue_name)
        finally:
            took = time.monotonic() - started
            with self._pool_lock:
                self._slot_pool.append(slot)
                self._recent_s = took if self._recent_s is None else 0.8 * self._recent_s + 0.2 * took
            self._free.release()

    def handle(self, queue: QueueClient, message: QueueMessage, slot: Slot) -> None:
        """Run one delivered message to its end: dropped, poisoned, committed, failed or
        revoked."""
        try:
            ref = tasks.TaskRef.decode(message.content)
        except ValueError as exc:
            self.poison(queue, message, f"undecodable: {exc}")
            return

        def kill_time(current: tasks.TaskRef, stage: str, params: dict[str, str], timeouts: int) -> datetime:
            history = self.history.read(stage, runtimes.history_key(params))
            return policy.kill_time(self.settings, stage, history, timeouts, tasks.now(), runtimes.work_of(params))

        def speculate_time(stage: str, params: dict[str, str], started: datetime) -> datetime | None:
            history = self.history.read(stage, runtimes.history_key(params))
            return policy.speculate_time(self.settings, stage, history, started, runtimes.work_of(params))

        if ref.backup:
            last_pass = message.dequeue_count is None or message.dequeue_count >= BACKUP_PASSES
            try:
                held = speculation.claim_backup(self.clients, ref, self.id, kill_time, last_pass)
            except speculation.NotHere:  # a copy on the machine of the attempt it backs up helps nobody
                queue.update_message(message.id, pop_receipt=message.pop_receipt, visibility_timeout=1)
                return
        else:
            held = transitions.claim(self.clients, ref, self.id, kill_time, slot.counter, speculate_time,
                                     self._rows.take(ref))
        if held is None:  # stale or duplicate: the row does not want this message to run
            queue.delete_message(message)
            return
        self.handled += 1
        with telemetry.attempt_scope(held.ref.job, held.ref.task, held.ref.attempt, held.stage):
            self._attempt(queue, message, slot, held)

    def _attempt(self, queue: QueueClient, message: QueueMessage, slot: Slot, held: transitions.Claim) -> None:
        """Run a claimed attempt under its lease; commit, fail or give it up. The attempt
        leaves the monitor's index in the same write that moves its task row on: a worker
        that dies while it commits (storage slow or restarting) leaves its entry behind for
        the monitor, never a task RUNNING with nothing to revoke it."""
        expected = self._expected_s(held)
        self.pace.started(held.ref, expected)
        try:
            with Lease(self.clients, queue, message, held) as lease:
                outcome = self.run_stage(held, lease, slot)
        finally:
            self.pace.stopped(held.ref)
        if lease.revoked.is_set():
            self.pace.report_soon()  # the monitor may have found this worker slow: hear it before taking more
            # (one revoked before its kill time — cancelled, beaten by its copy — says nothing
            # of the machine)
            if tasks.now() >= held.kill_at:
                self.pace.too_slow((tasks.now() - held.started).total_seconds(), expected)
            # The task went on without this attempt (a new message names the next one):
            # nothing it made is published. Its message may stand in for the next attempt.
            transitions.discard(self.clients, held)
            if held.ref.backup:
                lease.delete()  # a backup is asked for once
            else:
                lease.hand_back()
            log.info("%s revoked: stage killed, output discarded", held.ref)
            return
        if outcome.outputs is not None and len(json.dumps(outcome.outputs)) > transitions.OUTPUTS_CHARS:
            outcome = Outcome(failure=FailureClass.USER_CODE, error=(
                f"{len(outcome.outputs)} outputs whose names take more than the {transitions.OUTPUTS_CHARS} "
                "characters a task row can name"))
        if outcome.outputs is not None:
            status = (TaskStatus.NO_DATA if outcome.no_data else TaskStatus.CACHED if outcome.cached
                      else TaskStatus.SUCCEEDED)
            committed = transitions.commit(self.clients, slot.counter, held, status, outcome.outputs)
            log.info("%s %s", held.ref, "committed" if committed else "revoked: output discarded")
            lease.delete()
            seconds = (tasks.now() - held.started).total_seconds()
            telemetry.attempt_ended(held.stage, status.value if committed else "DISCARDED", seconds)
            if committed:
                if status is TaskStatus.SUCCEEDED:  # computed: a cache hit or no data measures nothing
                    self.history.add(held.stage, runtimes.history_key(held.params),
                                     seconds / runtimes.work_of(held.params))
                    self.pace.ran(seconds, expected)
                self.progress.task_ended(held.ref.job)
            return
        failure = outcome.failure or FailureClass.UNKNOWN
        if held.ref.backup:  # the attempt it copies goes on
            speculation.abandon(self.clients, held, failure, outcome.error)
            lease.delete()
            log.info("backup %s failed (%s): dropped", held.ref, failure.value)
            return
        if failure is FailureClass.EXECUTION_TIMEOUT and outcome.error in (PAST_KILL_TIME, BOUND_PAST_KILL_TIME):
            self._revoke_self(lease, slot, held, expected, outcome.error)
            return
        if failure is FailureClass.WORKER_SLOW and speculation.give_way(self.clients, held, failure, outcome.error):
            lease.delete()  # its backup runs on a healthy worker; the monitor requeues if that fails
            log.info("%s given up to its backup", held.ref)
            return
        retry = policy.retry(self.settings, held.stage, failure, held.ref.attempt, held.last_failure)
        after = transitions.fail(self.clients, slot.counter, held, failure, outcome.error, retry.budget, retry.delay_s)
        log.info("%s failed (%s): %s -> %s", held.ref, failure.value, redact(outcome.error[:200]), after)
        telemetry.attempt_ended(held.stage, failure.value, (tasks.now() - held.started).total_seconds())
        if after is TaskStatus.QUEUED:
            # The same message now names the next attempt, visible again after the backoff
            # (lost, it is resent by the reconciler: the requeue wrote its dispatch entry).
            following = dataclasses.replace(held.ref, attempt=held.ref.attempt + 1)
            lease.hand_back(content=following.encode(), visibility=retry.delay_s)
        else:
            lease.delete()
            if after is TaskStatus.DEAD:
                self.progress.task_ended(held.ref.job)

    def _revoke_self(self, lease: Lease, slot: Slot, held: transitions.Claim, expected: float | None,
                     why: str) -> None:
        """The monitor's revocation of an attempt past its kill time, made by its own worker
        as soon as the time comes (the monitor would make it at its next pass, and the
        worker see it at its next lease check), or sooner when its pace says it will come
        (``why``): the same fenced move, the next attempt queued or the task DEAD."""
        ref = held.ref
        row = tasks.get_task(self.clients.tasks, ref.partition, ref.task)
        budget = policy.limits_for(self.settings, held.stage).budget(FailureClass.EXECUTION_TIMEOUT)
        after = transitions.revoke(self.clients, slot.counter, row, ref, held.index, FailureClass.EXECUTION_TIMEOUT,
                                   budget, self.id, by="worker")
        if after is None:  # the monitor, a cancel or a backup moved the task first
            transitions.discard(self.clients, held)
        lease.delete()  # the move sent the next attempt's message
        self.pace.too_slow((tasks.now() - held.started).total_seconds(), expected)
        telemetry.attempt_ended(held.stage, FailureClass.EXECUTION_TIMEOUT.value,
                                (tasks.now() - held.started).total_seconds())
        log.info("%s %s: revoked by its worker, task now %s", ref, why, after)
        if after is TaskStatus.DEAD:
            self.progress.task_ended(ref.job)

    def _backup_runs(self, held: transitions.Claim) -> bool | None:
        """Whether a backup of the attempt runs (None if that could not be read)."""
        if held.ref.backup:
            return False
        try:
            return attempts.is_running(self.clients, held.ref.partition, held.ref.task, held.ref.attempt, backup=True)
        except Exception as exc:  # storage unreachable: the next look, or the monitor
            log.info("backup of %s not read: %s", held.ref, exc)
            return None

    def run_stage(self, held: transitions.Claim, lease: Lease, slot: Slot) -> Outcome:
        """Run the attempt's stage in the slot's stage process (its own process group);
        kill it if the attempt is revoked meanwhile, or once it runs past its kill time, or
        as soon as the pace its stage reports will take it far past (``pace.bound_to_overrun``)."""
        context = {
            "job": held.ref.job, "task": held.ref.task, "attempt": held.ref.attempt, "params": held.params,
            "backup": held.ref.backup, "part": held.ref.partition,
            "output_prefix": names.output_prefix(held.ref.job, held.ref.task, held.ref.attempt, held.ref.backup),
        }
        process = slot.stage_process(self.settings)
        process.start(held.stage, context)
        allowed = (held.kill_at - held.started).total_seconds()
        backed_up = False  # past its kill time with a backup running: left to the monitor
        while True:
            outcome = process.poll(0.2)
            if outcome is not None:
                return outcome
            if lease.revoked.is_set():
                process.kill(self.settings.kill_grace_s)
                return Outcome(failure=FailureClass.EXECUTION_TIMEOUT, error="revoked")
            now = tasks.now()
            if not backed_up and (now >= held.kill_at or bound_to_overrun(
                    (now - held.started).total_seconds(), allowed, process.projected_s())):
                runs = self._backup_runs(held)
                if runs is False:
                    process.kill(self.settings.kill_grace_s)
                    return Outcome(failure=FailureClass.EXECUTION_TIMEOUT,
                                   error=PAST_KILL_TIME if now >= held.kill_at else BOUND_PAST_KILL_TIME)
                backed_up = runs is True
            if self.draining.is_set():  # found slow: a healthy worker runs it sooner
                process.kill(self.settings.kill_grace_s)
                return Outcome(failure=FailureClass.WORKER_SLOW, error=f"worker {self.id} found slow: given up")

    def poison(self, queue: QueueClient, message: QueueMessage, why: str) -> None:
        record = {
            "queue": queue.queue_name, "message_id": message.id, "why": why,
            "dequeue_count": message.dequeue_count, "worker": self.id, "at": time.time(),
            "content": str(message.content)[:4096],
        }
        self.clients.queue(self.settings.names.poison_queue(queue.queue_name)).send_message(
            json.dumps(record).encode()
        )
        queue.delete_message(message)
        log.warning("poisoned message %s from %s: %s", message.id, queue.queue_name, why)

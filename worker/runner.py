"""The worker loop: receive task messages in batches from the shards, run each claimed
attempt under a lease, commit it fenced on the task row, then settle its message.

A message names one attempt or several (``worker.delivery``). While its attempts are short,
a worker receives a slot's worth of attempts ahead of its free slots, so that one receive
serves several tasks (``worker.inbox``); an attempt that waits too long for a slot is given
back for any worker to take, as are all of them when the worker stops. The attempts of one
partition that go to its slots at once are claimed in one transaction where their rows were
read ahead (``worker.handout``), and their commits that come together share one
too (``worker.commits``).

A message that cannot be decoded goes to its shard's poison queue with a record. Any other
attempt is settled through its task's row, however often it was delivered: the claim runs it
if the row wants it (the row's retry budget bounds how often), else it is dropped. SIGTERM
stops receiving; the attempts in hand finish (or fail and are requeued) before the process
exits.

While it holds attempts, a worker reports how they compare with their history
(``pipeline.lifecycle.health``); once the monitor finds it slow, it drains: it takes nothing more,
gives up the attempts it holds (each requeued at once for a healthy worker) and exits, for
a fresh one to replace it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from pipeline import planning, telemetry
from pipeline.lifecycle import ends, health, progress, rollups, runtimes, tasks, transitions
from pipeline.lifecycle.policy import Act, Ending, Outcome, Verdict
from pipeline.lifecycle.status import TaskStatus
from pipeline.lifecycle.transitions import Claim
from pipeline.redact import redact
from pipeline.reduction import sandbox
from pipeline.settings import Settings
from pipeline.storage.clients import Clients, clients_for
from worker import private
from worker.commits import Commits
from worker.delivery import Delivery
from worker.handout import Handed, Handout
from worker.inbox import Inbox
from worker.lease import Lease
from worker.pace import Pace
from worker.slot import Slot

log = logging.getLogger(__name__)

AHEAD_BELOW_S = 1.0  # receive ahead of free slots while attempts take less than this (moving mean)
AHEAD_HOLD_S = 2.0  # an attempt received ahead that waits this long is given back
CLAIM_LINGER_S = 0.005  # a pass waits this long for slots ending together, to claim their next attempts at once
BACKUP_PASSES = 5  # a backup received by the worker that runs its attempt is handed back this often
# the first wait of a worker whose queues were found empty: each wait after it twice the one
# before, up to ``idle_sleep``. Work ending is when more comes (a reduction whose tile tasks
# just ended, the next window of a job): a worker looks again soon after its last task, and
# rarely once its queues have stayed empty (each look is a billed storage call)
FIRST_IDLE_NAP_S = 0.05


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
        self._slots = [Slot(rollups.RollupWriter(health.slot_writer(self.id, i))) for i in range(slots)]
        self._slot_pool: list[Slot] = list(self._slots)
        self._pool_lock = threading.Lock()
        self.inbox = Inbox(self.clients, self.id, AHEAD_HOLD_S)  # attempts received, not yet in a slot
        # the moves made several at a time go under the first slot's rollup row (its lock keeps its
        # writes in order): a look at a job reads a row per writer, and this adds none
        together = self._slots[0].writer
        self.handout = Handout(self.clients, self.id, self.history, self.inbox.rows, together)
        self.commits = Commits(self.clients, together)  # a group commit per partition
        self._recent_s: float | None = None  # moving mean of this worker's attempt times
        self._ended = 0  # attempts ended in its slots (a count the loop's naps start again from)
        self._turn = 0  # the shard run_once receives from next
        self.handled = 0  # attempts this worker claimed
        self.pace = Pace(settings.slow_ratio)  # its attempts against their history, for its health

    def run(self) -> None:
        """Pull and run tasks until :attr:`stopping` is set; then finish what is in hand.
        The slots' stage processes are started first, so that the first tasks do not wait
        for the fork server's imports."""
        self.warm()
        self.say_sandbox()
        if self.settings.slow_ratio > 0:  # how its machine runs it, for its health
            threading.Thread(target=self.pace.probe, args=(self.stopping,), name="stall-probe", daemon=True).start()
        log.info("worker %s ready", self.id)
        queues = self.clients.shard_queues
        shard = 0
        idle = 0
        shortest = min(FIRST_IDLE_NAP_S, self.idle_sleep)
        nap = shortest  # the next wait with every shard empty
        ended = 0  # attempts ended in its slots when the loop last looked
        last_work = time.monotonic()
        with ThreadPoolExecutor(self.slots, thread_name_prefix="slot") as pool:
            while not self.stopping.is_set():
                self.inbox.give_back(AHEAD_HOLD_S, alone=not self._extra())
                self._report_health()
                self.progress.catch_up()
                free, first = 0, 0.0
                while free < self.slots and self._free.acquire(timeout=self._linger(free, first)):
                    free += 1
                    first = first or time.monotonic()
                if free == 0:
                    continue
                if self.pace.asked():  # an attempt was taken from it, or it stalls: hear the monitor first
                    for _ in range(free):
                        self._free.release()
                    continue
                received = 0
                if len(self.inbox) < free:
                    queue = queues[shard % len(queues)]
                    shard += 1
                    received = self.inbox.receive(queue, free - len(self.inbox) + self._extra())
                handed = self.handout.claim_together([self.inbox.pop() for _ in range(min(free, len(self.inbox)))])
                for item in handed:
                    pool.submit(self._slot, item)
                started = len(handed)
                for _ in range(free - started):
                    self._free.release()
                idle = 0 if received or started else idle + 1
                if received or started or ended != self._ended:  # work: the next wait the shortest again
                    nap, ended = shortest, self._ended
                if started or self._busy():
                    last_work = time.monotonic()
                if idle >= len(queues):  # every shard was empty: wait a little
                    if not self._busy():
                        self.history.flush()
                    if self.exit_when_idle is not None and time.monotonic() - last_work >= self.exit_when_idle:
                        log.info("worker %s: queues idle for %.0f s, exiting", self.id, self.exit_when_idle)
                        self.stopping.set()
                        break
                    self.stopping.wait(nap)
                    nap = min(2 * nap, self.idle_sleep)
                    idle = 0
            self.inbox.give_back(0, alone=not self._extra())
        # gone from the fleet the monitor compares (else, heard from within HEARD_WITHIN, it
        # would stand for the machines a worker started now is compared with)
        health.left(self.clients, self.id, health.REPLACED if self.draining.is_set() else health.STOPPED)
        if self.draining.is_set():
            log.warning("worker %s found slow: drained, exiting to be replaced", self.id)
        self.close()

    def run_once(self, count: int = 1) -> int:
        """Receive about ``count`` attempts from the next shard and run them to their end in
        the calling thread, ``count`` at a time claimed together (as a worker of ``count``
        slots would), one after another. The fault-injection harness drives workers this way,
        so that their storage calls come in one order. Returns how many messages it received."""
        queue = self.clients.shard_queues[self._turn % len(self.clients.shard_queues)]
        self._turn += 1
        received = self.inbox.receive(queue, count)
        while len(self.inbox):
            for item in self.handout.claim_together([self.inbox.pop() for _ in range(min(count, len(self.inbox)))]):
                self._free.acquire()
                self._slot(item)
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

    def say_sandbox(self) -> None:
        """Log how this worker confines scientists' programs and write it in its health row
        (a worker that cannot confine them refuses to run them: its reductions fail, saying
        why, and its row says so from the start)."""
        mode = sandbox.mode(self.settings.sandbox == "auto")
        (log.warning if mode.missing else log.info)("worker %s sandbox: %s", self.id, mode.describe())
        health.sandbox(self.clients, self.id, mode.describe())

    def kill(self) -> None:
        """SIGKILL the slots' stage processes and merge nothing: what a worker whose machine
        died leaves behind (the fault-injection harness's lost worker). Safe from another
        thread: it only sends signals."""
        for slot in self._slots:
            if slot.process is not None:
                slot.process.signal(signal.SIGKILL)

    def _linger(self, free: int, first: float) -> float:
        """How long to wait for the next free slot: up to 0.2 s for the first; for more, while
        attempts are short and the inbox holds more than the slots freed, until
        ``CLAIM_LINGER_S`` after the first was free (slots that end together, their commits made
        together, claim their next attempts together too); else not at all."""
        if free == 0:
            return 0.2
        if not self._extra() or len(self.inbox) <= free:
            return 0.0
        return max(0.0, first + CLAIM_LINGER_S - time.monotonic())

    def _extra(self) -> int:
        """How many attempts to receive beyond the free slots: one per slot while this
        worker's recent attempts are short (a receive then serves several tasks), none
        while they are long (a message held for a busy slot is one an idle worker could
        run)."""
        with self._pool_lock:
            recent = self._recent_s
        return self.slots if recent is not None and recent < AHEAD_BELOW_S else 0

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

    def _expected_s(self, held: Claim) -> float | None:
        """The attempt's expected seconds from its history (None while it is not trusted)."""
        history = self.history.read(held.stage, planning.history_of(held.params))
        if history.count < self.settings.min_samples:
            return None
        return history.mean * planning.work_of(held.params) or None

    def _busy(self) -> bool:
        with self._pool_lock:
            return len(self._slot_pool) < self.slots  # a slot holds a task

    def _slot(self, item: Handed) -> None:
        with self._pool_lock:
            slot = self._slot_pool.pop()
        started = time.monotonic()
        try:
            self.handle(item, slot)
        except Exception:
            log.exception("attempt %s of message %s could not be handled", item.ref, item.delivery.message.id)
        finally:
            took = time.monotonic() - started
            with self._pool_lock:
                self._slot_pool.append(slot)
                self._recent_s = took if self._recent_s is None else 0.8 * self._recent_s + 0.2 * took
                self._ended += 1
            self._free.release()

    def handle(self, item: Handed, slot: Slot) -> None:
        """Run one delivered attempt to its end: dropped, committed, failed or revoked."""
        ref, delivery, held = item.ref, item.delivery, item.held
        if held is not None:
            pass  # claimed with others of its partition
        elif ref.backup:
            count = delivery.message.dequeue_count
            try:
                held = transitions.claim_backup(self.clients, ref, self.id, self.handout.kill_time,
                                                count is None or count >= BACKUP_PASSES)
            except transitions.NotHere:  # a copy on the machine of the attempt it backs up helps nobody
                delivery.hand_back(visibility=1)
                return
        else:
            held = transitions.claim(self.clients, ref, self.id, self.handout.kill_time, slot.writer,
                                     self.handout.speculate_time, item.hint)
        if held is None:  # stale or duplicate: the row does not want this message to run
            delivery.settle()
            return
        self.handled += 1
        with telemetry.attempt_scope(held.ref.job, held.ref.task, held.ref.attempt, held.stage), \
                self.commits.running(held.ref.partition):
            self._attempt(delivery, slot, held)

    def _attempt(self, delivery: Delivery, slot: Slot, held: Claim) -> None:
        """Run a claimed attempt under its lease, then end it through the one door
        (``ends.end``: committed, failed, given up to its backup, revoked) and settle its
        message as the end says. The attempt leaves the monitor's index in the same write
        that moves its task row on: a worker that dies while it ends it (storage slow or
        restarting) leaves its entry behind for the monitor, never a task RUNNING with
        nothing to revoke it."""
        expected = self._expected_s(held)
        self.pace.started(held.ref, expected)
        try:
            with Lease(self.clients, delivery, held) as lease:
                outcome = slot.run(self.clients, held, lease, self.draining, self.id)
        finally:
            self.pace.stopped(held.ref)
        seconds = (tasks.now() - held.started).total_seconds()
        if lease.revoked.is_set():  # the task went on without it: nothing it made is published
            outcome = Outcome.of(Ending.REVOKED)
            self.pace.report_soon()  # the monitor may have found this worker slow: hear it before taking more
        if outcome.ending is Ending.OVERRAN or (outcome.ending is Ending.REVOKED and tasks.now() >= held.kill_at):
            self.pace.too_slow(seconds, expected)  # (one revoked before its kill time says nothing of the machine)
        ended = ends.end(self.clients, slot.writer, held, outcome, self.progress.task_ended,
                         lambda claim, move: self.commits.commit(slot.writer, claim, move))
        move = ended.move
        if ended.verdict is Verdict.NEXT:  # its message (its own, if it names others) names the next attempt
            delivery.hand_back(dataclasses.replace(held.ref, attempt=held.ref.attempt + 1), visibility=move.delay_s)
        elif ended.verdict is Verdict.BACK:  # it may stand in for the next attempt
            delivery.hand_back()
        else:
            delivery.settle()
        committed = move.act is Act.COMMIT and ended.applied
        telemetry.attempt_ended(held.stage, ended.status.value if committed and ended.status else
                                move.failure.value if move.failure else "DISCARDED", seconds)
        if committed and ended.status is TaskStatus.SUCCEEDED:  # computed: a cache hit or no data measures nothing
            self.history.add(held.stage, planning.history_of(held.params), seconds / planning.work_of(held.params))
            self.pace.ran(seconds, expected)
        if committed:
            log.info("%s committed", held.ref)  # the line an operator (and the deployment's test) looks for
        else:
            why = f" ({redact(outcome.error[:200])})" if outcome.error else ""
            log.info("%s %s%s: %s%s", held.ref, outcome.ending.value, why, move.act.value,
                     f", task now {ended.status}" if ended.status else "" if ended.applied else ", refused: discarded")

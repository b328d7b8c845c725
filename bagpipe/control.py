"""The local stack's control loop: what the Functions host does in Azure — run the planner
on ``plan`` messages, the completion handler on ``done`` messages, and the sweep on a
timer — calling the same ``pipeline`` functions."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

from azure.storage.queue import QueueClient

from pipeline.lifecycle import sweep
from pipeline.lifecycle.notify import mailer_for
from pipeline.settings import Settings
from pipeline.storage.clients import Clients, clients_for
from pipeline.storage.names import DONE_QUEUE, PLAN_QUEUE

log = logging.getLogger(__name__)

MAX_DEQUEUES = 5  # as the Functions host's maxDequeueCount: then the message is poison


def drain(queue: QueueClient, poison: QueueClient, handle: Callable[[str], None],
          visibility: int = 60, poisoned: Callable[[str, str], None] | None = None) -> int:
    """Handle what is in one queue now; a failed message is retried (it reappears) and
    after MAX_DEQUEUES goes to the poison queue, as the Functions host does, and to
    ``poisoned`` (with why), which ends its job saying so, as the host's poison-queue trigger
    does. Returns how many it handled."""
    handled = 0
    for message in queue.receive_messages(messages_per_page=16, max_messages=16,
                                          visibility_timeout=visibility):
        if message.dequeue_count and message.dequeue_count > MAX_DEQUEUES:
            why = f"failed {MAX_DEQUEUES} times"
            poison.send_message(json.dumps({"content": message.content, "why": why}).encode())
            queue.delete_message(message)
            if poisoned is not None:
                try:
                    poisoned(message.content, why)
                except Exception:
                    log.exception("poisoned message on %s not settled: the sweep settles its job", queue.queue_name)
            continue
        try:
            handle(message.content)
        except sweep.BadMessage as exc:  # a message that can never be handled
            log.warning("poisoned message on %s: %s", queue.queue_name, exc)
            poison.send_message(json.dumps({"content": message.content, "why": str(exc)}).encode())
        except Exception:
            log.exception("message on %s failed; it will be retried", queue.queue_name)
            continue
        queue.delete_message(message)
        handled += 1
    return handled


def run(settings: Settings, stop: threading.Event, sweep_every: float | None = None,
        idle_sleep: float = 0.2) -> None:
    """Until ``stop`` is set: plan and complete jobs as their messages come, and sweep (the
    monitor) every ``sweep_every`` seconds (the settings' monitor interval by default) on a
    thread of its own — in Azure they are separate functions, so a long completion (packing
    a large job, a slow mail service) never holds up a revocation."""
    sweep_every = settings.monitor_interval_s if sweep_every is None else sweep_every
    clients = clients_for(settings)
    mailer = mailer_for(settings)
    names = settings.names
    plan_poison = clients.queue(names.poison_queue(names.plan_queue))
    done_poison = clients.queue(names.poison_queue(names.done_queue))
    sweeper = threading.Thread(target=_sweep_loop, args=(clients, stop, sweep_every), name="sweep", daemon=True)
    sweeper.start()
    while not stop.is_set():
        busy = 0
        try:
            busy += drain(clients.plan_queue, plan_poison, lambda body: sweep.handle_plan(clients, body),
                          poisoned=lambda body, why: sweep.handle_poisoned(clients, mailer, PLAN_QUEUE, body, why))
            busy += drain(clients.done_queue, done_poison, lambda body: sweep.handle_done(clients, mailer, body),
                          poisoned=lambda body, why: sweep.handle_poisoned(clients, mailer, DONE_QUEUE, body, why))
        except Exception:
            log.exception("control loop pass failed; retrying")
            stop.wait(1.0)
        if not busy:
            stop.wait(idle_sleep)
    sweeper.join()


def _sweep_loop(clients: Clients, stop: threading.Event, every: float) -> None:
    while not stop.is_set():
        try:
            sweep.sweep(clients)
        except Exception:
            log.exception("sweep failed; retrying")
        stop.wait(every)

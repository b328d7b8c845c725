"""The local stack's control loop: what the Functions host does in Azure — run the planner
on ``plan`` messages, the completion handler on ``done`` messages, and the sweep on a
timer — calling the same ``pipeline`` functions."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

from azure.storage.queue import QueueClient

from pipeline import sweep
from pipeline.clients import clients_for
from pipeline.notify import mailer_for
from pipeline.settings import Settings

log = logging.getLogger(__name__)

MAX_DEQUEUES = 5  # as the Functions host's maxDequeueCount: then the message is poison


def drain(queue: QueueClient, poison: QueueClient, handle: Callable[[str], None],
          visibility: int = 60) -> int:
    """Handle what is in one queue now; a failed message is retried (it reappears) and
    after MAX_DEQUEUES goes to the poison queue. Returns how many it handled."""
    handled = 0
    for message in queue.receive_messages(messages_per_page=16, max_messages=16,
                                          visibility_timeout=visibility):
        if message.dequeue_count and message.dequeue_count > MAX_DEQUEUES:
            poison.send_message(json.dumps({"content": message.content, "why": "too many dequeues"}).encode())
            queue.delete_message(message)
            continue
        try:
            handle(message.content)
        except ValueError as exc:  # a message that can never be handled
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
    """Until ``stop`` is set: plan, complete, and sweep (the monitor) every
    ``sweep_every`` seconds (the settings' monitor interval by default)."""
    sweep_every = settings.monitor_interval_s if sweep_every is None else sweep_every
    clients = clients_for(settings)
    mailer = mailer_for(settings)
    names = settings.names
    plan_poison = clients.queue(names.poison_queue(names.plan_queue))
    done_poison = clients.queue(names.poison_queue(names.done_queue))
    next_sweep = 0.0
    while not stop.is_set():
        busy = 0
        try:
            busy += drain(clients.plan_queue, plan_poison, lambda body: sweep.handle_plan(clients, body))
            busy += drain(clients.done_queue, done_poison,
                          lambda body: sweep.handle_done(clients, mailer, body))
            if time.monotonic() >= next_sweep:
                sweep.sweep(clients, mailer)
                next_sweep = time.monotonic() + sweep_every
        except Exception:
            log.exception("control loop pass failed; retrying")
            stop.wait(1.0)
        if not busy:
            stop.wait(idle_sleep)

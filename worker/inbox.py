"""A worker's waiting line: the attempts it received and has not handed to a slot yet.

A receive takes messages from a shard queue, each naming one attempt or several
(``worker.delivery``), and reads their task rows ahead (``worker.readahead``). A message
that cannot be decoded goes to its shard's poison queue with a record. An attempt that
waits for a slot longer than the worker's hold is given back for any worker to take
(``Delivery.give_up``), as are all of them when the worker stops.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque

from azure.storage.queue import QueueClient, QueueMessage

from pipeline.lifecycle.tasks import TaskRef
from pipeline.storage.clients import Clients
from worker.delivery import Delivery
from worker.readahead import RowsAhead

log = logging.getLogger(__name__)

MAX_RECEIVE = 32  # messages one receive may return (the service's limit)


class Inbox:
    """The attempts received by worker ``worker``, in the order they came."""

    def __init__(self, clients: Clients, worker: str, hold_s: float) -> None:
        self.clients, self.worker = clients, worker
        self.rows = RowsAhead(clients, hold_s)  # their task rows, where one query reads several
        self._line: deque[tuple[Delivery, TaskRef, float]] = deque()
        self._per_message = 1.0  # moving mean of the attempts a message named lately
        self.handed_back = 0  # attempts received that went back to the queue unrun

    def __len__(self) -> int:
        return len(self._line)

    def receive(self, queue: QueueClient, attempts: int) -> int:
        """Receive from ``queue`` as many messages as name about ``attempts`` attempts (by
        the attempts a message named lately), at least one; returns how many messages came."""
        count = max(1, min(MAX_RECEIVE, round(attempts / self._per_message)))
        try:
            batch = list(queue.receive_messages(messages_per_page=count, max_messages=count,
                                                visibility_timeout=self.clients.settings.lease_seconds))
        except Exception as exc:
            log.warning("receive from %s failed: %s", queue.queue_name, exc)
            return 0
        at, received = time.monotonic(), []
        for message in batch:
            try:
                refs = TaskRef.decode_all(message.content)
            except ValueError as exc:
                try:
                    self.poison(queue, message, f"undecodable: {exc}")
                except Exception as failed:  # it comes back when its visibility runs out, and is poisoned then
                    log.warning("message %s not poisoned: %s", message.id, failed)
                continue
            delivery = Delivery(queue, message, refs)
            self._line.extend((delivery, ref, at) for ref in refs)
            received += refs
            self._per_message = 0.8 * self._per_message + 0.2 * len(refs)
        if received:
            self.rows.read(received)
        return len(batch)

    def pop(self) -> tuple[Delivery, TaskRef]:
        """The attempt that waited longest, now going to a slot."""
        delivery, ref, _ = self._line.popleft()
        delivery.taken()
        return delivery, ref

    def give_back(self, older_than: float, alone: bool) -> None:
        """Give back the attempts that have waited ``older_than`` seconds (on stopping, 0: all
        of them), for any worker: a message none of whose attempts went to a slot comes back
        whole; the rest go out in a message of their own, or ``alone`` each in one (while
        this worker's attempts are long, so that the next worker is not handed more than it
        runs at once either)."""
        waiting: dict[int, tuple[Delivery, list[TaskRef]]] = {}
        while self._line and time.monotonic() - self._line[0][2] >= older_than:
            delivery, ref, _ = self._line.popleft()
            waiting.setdefault(id(delivery), (delivery, []))[1].append(ref)
        for delivery, refs in waiting.values():
            delivery.give_up(refs, alone)
            self.handed_back += len(refs)

    def poison(self, queue: QueueClient, message: QueueMessage, why: str) -> None:
        """Move a message that names no attempt to its shard's poison queue, with a record."""
        record = {
            "queue": queue.queue_name, "message_id": message.id, "why": why,
            "dequeue_count": message.dequeue_count, "worker": self.worker, "at": time.time(),
            "content": str(message.content)[:4096],
        }
        self.clients.queue(self.clients.settings.names.poison_queue(queue.queue_name)).send_message(
            json.dumps(record).encode()
        )
        queue.delete_message(message)
        log.warning("poisoned message %s from %s: %s", message.id, queue.queue_name, why)

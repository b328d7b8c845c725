"""A worker's hold on a task: it renews the message's visibility (``update_message``) and
heartbeats the attempt, and notices when the attempt was revoked."""

from __future__ import annotations

import logging
import threading

from azure.storage.queue import QueueClient, QueueMessage

from pipeline import tasks
from pipeline.clients import Clients

log = logging.getLogger(__name__)


class Lease:
    """Keeps one message invisible and its attempt alive while a stage runs."""

    def __init__(self, clients: Clients, queue: QueueClient, message: QueueMessage,
                 held: tasks.Claim) -> None:
        self.clients, self.queue, self.message, self.held = clients, queue, message, held
        self.seconds = clients.settings.lease_seconds
        self.revoked = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"lease-{held.ref.task}", daemon=True)

    def __enter__(self) -> Lease:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                self.renew()
                if not tasks.still_held(self.clients, self.held):
                    log.warning("attempt %s revoked", self.held.ref)
                    self.revoked.set()
                    return
            except Exception as exc:  # storage briefly unreachable: try again next beat
                log.warning("lease renewal of %s failed: %s", self.held.ref, exc)

    def renew(self, content: bytes | None = None, visibility: int | None = None) -> None:
        """Extend the message's invisibility (and optionally replace its content)."""
        with self._lock:
            receipt = self.queue.update_message(
                self.message.id, pop_receipt=self.message.pop_receipt,
                visibility_timeout=self.seconds if visibility is None else visibility,
                content=content,
            )
            self.message.pop_receipt = receipt.pop_receipt

    def delete(self) -> None:
        with self._lock:
            self.queue.delete_message(self.message, pop_receipt=self.message.pop_receipt)

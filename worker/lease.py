"""A worker's hold on a task: it renews the message's visibility (``update_message``),
heartbeats the attempt (moving its row in the monitor's deadline index), and notices when
the attempt was revoked — by the monitor or a cancel — so the stage can be killed."""

from __future__ import annotations

import logging
import threading

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import QueueClient, QueueMessage

from pipeline.lifecycle import attempts, transitions
from pipeline.storage.clients import Clients

log = logging.getLogger(__name__)


class Lease:
    """Keeps one message invisible and its attempt alive while a stage runs."""

    def __init__(self, clients: Clients, queue: QueueClient, message: QueueMessage, held: transitions.Claim) -> None:
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
        """Every third of the lease: renew the message, look whether the attempt was revoked,
        heartbeat it. Each on its own: a renewal refused (the message's receipt lost) must not
        hide a revocation, nor stop the heartbeat that keeps the monitor away."""
        failed = False  # a beat failed: its deadline entry may have been written all the same
        while not self._stop.wait(self.seconds / 3):
            try:
                self.renew()
            except Exception as exc:  # the message comes back for others; the row keeps them off
                log.warning("message of %s not renewed: %s", self.held.ref, exc)
            try:
                if not transitions.still_held(self.clients, self.held):
                    log.warning("attempt %s revoked", self.held.ref)
                    self.revoked.set()
                    return
                transitions.heartbeat(self.clients, self.held)
                if failed:
                    ref = self.held.ref
                    attempts.clear_others(self.clients, ref.partition, ref.task, ref.attempt, self.held.worker,
                                          keep=self.held.index)
                    failed = False
            except Exception as exc:  # storage briefly unreachable: try again next beat
                failed = True
                log.warning("heartbeat of %s failed: %s", self.held.ref, exc)

    def renew(self, content: bytes | None = None, visibility: int | None = None) -> None:
        """Extend the message's invisibility (and optionally replace its content)."""
        with self._lock:
            receipt = self.queue.update_message(
                self.message.id, pop_receipt=self.message.pop_receipt,
                visibility_timeout=self.seconds if visibility is None else visibility,
                content=content,
            )
            self.message.pop_receipt = receipt.pop_receipt

    def hand_back(self, content: bytes | None = None, visibility: int = 0) -> None:
        """Let the message be received again after ``visibility`` seconds (naming the next
        attempt when ``content`` is given). If storage lost this receipt, the message comes
        back anyway with its old content, and the task row's attempt wins over it."""
        try:
            self.renew(content=content, visibility=visibility)
        except ResourceNotFoundError:
            log.info("message of %s re-leased meanwhile; it will come back", self.held.ref)

    def delete(self) -> None:
        """Delete the message; if storage no longer knows this receipt (it restarted), the
        message comes back and is dropped as stale by whoever receives it."""
        with self._lock:
            try:
                self.queue.delete_message(self.message, pop_receipt=self.message.pop_receipt)
            except ResourceNotFoundError:
                log.info("message of %s already gone or re-leased", self.held.ref)

"""A received task message and the attempts it names: one, or several of one partition
(``TaskRef.encode_many``).

A worker runs each attempt of a message in a slot of its own. The message stays invisible
while any of them is unsettled (each attempt's lease renews it, a renewal serving them all)
and is deleted when the last one is settled. What a message of one attempt does by changing
its content — come back later naming the next attempt, after a failure's backoff — a
message of several does by sending that attempt in a message of its own: the others still
stand behind the first. Whichever way, the task rows decide what runs; a message only asks.
"""

from __future__ import annotations

import logging
import threading
import time

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import QueueClient, QueueMessage

from pipeline.lifecycle.tasks import TaskRef

log = logging.getLogger(__name__)


class Delivery:
    """One received message (``queue``, ``message``) and its attempts (``refs``)."""

    def __init__(self, queue: QueueClient, message: QueueMessage, refs: list[TaskRef]) -> None:
        self.queue, self.message, self.refs = queue, message, refs
        self._open = len(refs)  # attempts not settled yet
        self._taken = 0  # attempts handed to a slot
        self._renewed = time.monotonic()
        self._lock = threading.Lock()

    @property
    def shared(self) -> bool:
        """Whether the message names more than one attempt."""
        return len(self.refs) > 1

    def taken(self) -> None:
        """One of its attempts went to a slot."""
        with self._lock:
            self._taken += 1

    def renew(self, seconds: int) -> None:
        """Keep the message invisible ``seconds`` more, unless another of its attempts' leases
        renewed it within the last sixth of that."""
        with self._lock:
            if self.shared and time.monotonic() - self._renewed < seconds / 6:
                return
            self._update(seconds)

    def settle(self) -> None:
        """One attempt needs the message no more (run, dropped, or ended for good); the last
        one deletes it. Should storage no longer know this receipt (it restarted), the
        message comes back and its attempts are dropped as stale by whoever receives it."""
        with self._lock:
            self._open -= 1
            if self._open > 0:
                return
            try:
                self.queue.delete_message(self.message.id, pop_receipt=self.message.pop_receipt)
            except ResourceNotFoundError:
                log.info("message %s already gone or re-leased", self.message.id)

    def hand_back(self, following: TaskRef | None = None, visibility: int = 0) -> None:
        """One attempt's message is to come back after ``visibility`` seconds, naming the
        attempt ``following`` if given. A message of one attempt is changed so (if storage
        lost this receipt, it comes back anyway with its old content, and the task row's
        attempt wins over it); a message of several sends ``following`` alone and settles
        this attempt's share — with no ``following``, the share only (a revoked attempt:
        the move that revoked it sent the next attempt's message). A send that fails is the
        reconciler's: the requeue wrote the task's dispatch entry."""
        if not self.shared:
            with self._lock:
                try:
                    self._update(visibility, following.encode() if following else None)
                except ResourceNotFoundError:
                    log.info("message %s re-leased meanwhile; it will come back", self.message.id)
            return
        if following is not None:
            try:
                self.queue.send_message(following.encode(), visibility_timeout=visibility or None)
            except Exception as exc:
                log.warning("message of %s not sent (the reconciler will resend it): %s", following, exc)
        self.settle()

    def give_up(self, refs: list[TaskRef], alone: bool = False) -> None:
        """Attempts of the message (``refs``) that this worker will not run after all,
        waiting too long for a slot or the worker stopping. If none of the message went to a
        slot, it comes back at once for any worker; else ``refs`` go out in a message of
        their own, and their share of this one is settled. ``alone``: each in a message of
        its own, whatever went to a slot (long attempts: the next worker is not to be handed
        more than it runs at once either)."""
        with self._lock:
            whole = self._taken == 0 and len(refs) == self._open and not (alone and self.shared)
        if whole:
            try:
                with self._lock:
                    self._update(0)
            except Exception as exc:  # it comes back when its visibility times out all the same
                log.info("message %s not handed back: %s", self.message.id, exc)
            return
        for body in [ref.encode() for ref in refs] if alone else [TaskRef.body_of(refs)]:
            try:
                self.queue.send_message(body)
            except Exception as exc:  # their dispatch entries fall due: the reconciler resends them
                log.warning("attempts of message %s not sent back: %s", self.message.id, exc)
        for _ in refs:
            try:
                self.settle()
            except Exception as exc:  # the message comes back when its visibility runs out
                log.info("message %s not deleted: %s", self.message.id, exc)

    def _update(self, visibility: int, content: bytes | None = None) -> None:
        receipt = self.queue.update_message(self.message.id, pop_receipt=self.message.pop_receipt,
                                            visibility_timeout=visibility, content=content)
        self.message.pop_receipt = receipt.pop_receipt
        self._renewed = time.monotonic()

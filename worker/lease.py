"""A worker's hold on a task: it renews its message's visibility (``worker.delivery``),
heartbeats the attempt (moving its row in the monitor's deadline index), and notices when
the attempt was revoked — by the monitor or a cancel — so the stage can be killed."""

from __future__ import annotations

import logging
import threading

from pipeline.lifecycle import attempts, transitions
from pipeline.lifecycle.transitions import Claim
from pipeline.storage.clients import Clients
from worker.delivery import Delivery

log = logging.getLogger(__name__)


class Lease:
    """Keeps an attempt's message invisible and the attempt alive while its stage runs."""

    def __init__(self, clients: Clients, delivery: Delivery, held: Claim) -> None:
        self.clients, self.delivery, self.held = clients, delivery, held
        self.seconds = clients.settings.lease_seconds
        self.revoked = threading.Event()
        self._stop = threading.Event()
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
                self.delivery.renew(self.seconds)
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

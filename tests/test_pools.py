"""The storage clients keep as many connections as a process uses at once: a read of a whole
job (``partitions``: 8 threads), several of them at once in the API, a finisher's overview
copies (8 threads) beside its other calls. urllib3 keeps 10 a host by default and discards
a connection that finds its pool full, with a warning in the log, then opens a new one for
the next call (a TLS handshake, in Azure)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.storage.clients import Clients

AT_ONCE = 24  # calls in flight together: three whole-job reads' threads


@pytest.mark.parametrize("client", ["tasks", "jobs", "queue", "blobs"])
def test_calls_made_at_once_keep_their_connections(clients: Clients, client: str,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    calls: dict[str, Callable[[], object]] = {
        "tasks": lambda: list(clients.tasks.query_entities("PartitionKey eq 'none'")),
        "jobs": lambda: list(clients.jobs.query_entities("PartitionKey eq 'none'")),
        "queue": lambda: clients.plan_queue.peek_messages(max_messages=1),
        "blobs": lambda: clients.products.get_container_properties(),
    }
    call, together = calls[client], threading.Barrier(AT_ONCE)

    def one(_: int) -> None:
        for _ in range(3):
            together.wait(30)
            call()

    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"), ThreadPoolExecutor(AT_ONCE) as pool:
        list(pool.map(one, range(AT_ONCE)))
    assert not [r.getMessage() for r in caplog.records if "pool is full" in r.getMessage()]

"""Azurite itself stopped and restarted mid-job (disk mode): the job completes, with no
task lost and one email."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from bagpipe.azurite import Azurite
from bagpipe.mailserver import MailServer
from pipeline.lifecycle import jobs, tasks
from pipeline.requests import application
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from tests.conftest import parts, running_control, running_workers, small_request, wait_for, with_stage


def test_job_survives_a_storage_restart(tmp_path: Path, settings: Settings, mail: MailServer) -> None:
    storage = Azurite(tmp_path / "azurite").start()
    try:
        settings = with_stage(settings.with_(storage_connection=storage.connection_string), "slow")
        clients = Clients(settings)
        clients.ensure_resources()
        with running_control(settings), running_workers(settings, count=2, slots=2):
            job = application.submit(clients, small_request(start="2022-01-01", end="2022-06-30")).job
            for done in (10, 20):
                wait_for(lambda d=done: sum(tasks.terminal_counts(clients.tasks, parts(clients, job)).values()) >= d,
                         90, "progress")
                storage.stop()
                time.sleep(2)
                storage.start()
            wait_for(lambda: jobs.get(clients, job).state.finished, 240, "the job to finish")
        rows = tasks.list_tasks(clients.tasks, parts(clients, job))
        assert Counter(r.status for r in rows) == {"SUCCEEDED": 46}
        assert jobs.get(clients, job).state == "SUCCEEDED"
        assert sum(tasks.terminal_counts(clients.tasks, parts(clients, job)).values()) == 46
        assert len([m for _, m in mail.messages() if job in str(m["Subject"])]) == 1
    finally:
        storage.stop()

"""The retry rule the worker applies to a failed attempt (the kill rule's tests are in
test_monitor.py and test_history.py): the platform's failures get the larger budget, the
task's own the smaller and none when they repeat, and retries wait longer each time."""

from __future__ import annotations

from pipeline.failures import FailureClass
from pipeline.lifecycle import policy
from pipeline.settings import Settings


def test_a_failed_attempt_gets_the_budget_and_wait_its_failure_deserves() -> None:
    settings = Settings(storage_connection="UseDevelopmentStorage=true", max_attempts=3, max_transient_attempts=6)
    lost = policy.retry(settings, "modis", FailureClass.HEARTBEAT_LOST, 1, "")
    own = policy.retry(settings, "modis", FailureClass.USER_CODE, 1, "")
    assert (lost.budget, own.budget) == (6, 3)
    again = policy.retry(settings, "modis", FailureClass.USER_CODE, 2, FailureClass.USER_CODE.value)
    assert again.budget == 2  # the same input failed the same way twice: no third attempt
    assert policy.retry(settings, "modis", FailureClass.HEARTBEAT_LOST, 2, "heartbeat_lost").budget == 6
    assert [policy.retry(settings, "modis", FailureClass.CONNECTION, n, "").delay_s for n in (1, 2, 3, 7)] \
        == [2, 10, 30, 30]
    assert policy.retry(settings, "modis", FailureClass.WORKER_SLOW, 3, "").delay_s == 0  # to a healthy worker now
    tuned = settings.with_(stage_limits='{"reduce": {"max_attempts": 5}}')
    assert policy.retry(tuned, "reduce", FailureClass.USER_CODE, 1, "").budget == 5

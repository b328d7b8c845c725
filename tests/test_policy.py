"""What an attempt's end makes of its task (``policy.decide``), with no storage at all: a
table of every way an attempt ends × the state of its retry budget × the state of its
backup, then the details each move carries (the kill rule's tests are in test_monitor.py
and test_history.py). The doors that reach it — the worker, the monitor, the backups — are
tested against Azurite in test_worker.py, test_monitor.py and test_speculation.py."""

from __future__ import annotations

import pytest

from pipeline.failures import FailureClass
from pipeline.lifecycle import policy
from pipeline.lifecycle.policy import Act, Ending, Facts, Move, Outcome, Verdict
from pipeline.lifecycle.status import TaskStatus
from pipeline.settings import Settings

LIMITS = policy.limits_for(Settings(storage_connection="UseDevelopmentStorage=true", max_attempts=3,
                                    max_transient_attempts=5), "digest")

OUTCOMES = {
    "committed": Outcome.committed(TaskStatus.SUCCEEDED, ["a/out.tif"]),
    "failed (own)": Outcome.failed(FailureClass.USER_CODE, "divided by zero"),
    "failed (platform)": Outcome.failed(FailureClass.CONNECTION, "reset"),
    "failed (worker slow)": Outcome.failed(FailureClass.WORKER_SLOW, "found slow"),
    "overran": Outcome.overran("ran past its kill time"),
    "revoked": Outcome.of(Ending.REVOKED),
    "overdue": Outcome.of(Ending.OVERDUE),
    "silent": Outcome.of(Ending.SILENT),
    "slow": Outcome.of(Ending.SLOW),
}


def facts(budget: str, backup: str, outcome: Outcome) -> Facts:
    """The facts of an attempt whose budget is ``left`` (its first attempt), ``spent`` (its
    fifth: past both budgets) or ``twice`` (its second, the first having failed as this
    one did), and whose backup state is ``none``, ``backup`` (it is a copy), ``copy runs``,
    ``gave way`` (its worker gave it up to its copy, which ended uncommitted) or ``gone``
    (its row no longer says it runs)."""
    attempt, last = {"left": (1, ""), "spent": (5, ""), "twice": (2, outcome.failure.value)}[budget]
    return Facts(attempt, backup=backup == "backup", held=backup != "gone", copy_runs=backup == "copy runs",
                 gave_way=backup == "gave way", last_failure=last)


# each cell: act, where the task goes, what the worker does with its message (and after how long)
COMMIT = "commit SUCCEEDED settle"
RETRY_2, RETRY_0 = "fail QUEUED next 2", "fail QUEUED next 0"
REQUEUE = "fail QUEUED settle"  # the monitor's: it sends the next attempt's message itself
DEAD = "fail DEAD settle"
DISCARD, DISCARD_BACKUP = "discard - back", "discard - settle"
ABANDON, GIVE_WAY, LAPSE, WAIT, DROP = "abandon - settle", "give_way - settle", "lapse - settle", "wait - settle", \
    "drop - settle"
BACKUP_STATES = ("none", "backup", "copy runs", "gave way", "gone")
TABLE: dict[str, dict[str, tuple[str, str, str]]] = {
    # outcome:              backup state: (budget left, budget spent, failed so before)
    "committed": {
        "none": (COMMIT, COMMIT, COMMIT), "backup": (COMMIT, COMMIT, COMMIT),
        "copy runs": (COMMIT, COMMIT, COMMIT), "gave way": (COMMIT, COMMIT, COMMIT),
        "gone": (DISCARD, DISCARD, DISCARD)},
    "failed (own)": {  # the task's own failure: 3 attempts, none after the same failure twice
        "none": (RETRY_2, DEAD, DEAD), "backup": (ABANDON, ABANDON, ABANDON),
        "copy runs": (RETRY_2, DEAD, DEAD), "gave way": (RETRY_2, DEAD, DEAD),
        "gone": (DISCARD, DISCARD, DISCARD)},
    "failed (platform)": {  # transient: 5 attempts, whatever failed before; the retry waits
        "none": (RETRY_2, DEAD, "fail QUEUED next 10"), "backup": (ABANDON, ABANDON, ABANDON),
        "copy runs": (RETRY_2, DEAD, "fail QUEUED next 10"), "gave way": (RETRY_2, DEAD, "fail QUEUED next 10"),
        "gone": (DISCARD, DISCARD, DISCARD)},
    "failed (worker slow)": {  # transient, at once to a healthy worker; its copy, if one runs, keeps the task
        "none": (RETRY_0, DEAD, RETRY_0), "backup": (ABANDON, ABANDON, ABANDON),
        "copy runs": (GIVE_WAY, GIVE_WAY, GIVE_WAY), "gave way": (RETRY_0, DEAD, RETRY_0),
        "gone": (DISCARD, DISCARD, DISCARD)},
    "overran": {  # its worker revokes it at its kill time, as the monitor would
        "none": (RETRY_0, DEAD, RETRY_0), "backup": (ABANDON, ABANDON, ABANDON),
        "copy runs": (GIVE_WAY, GIVE_WAY, GIVE_WAY), "gave way": (RETRY_0, DEAD, RETRY_0),
        "gone": (DISCARD, DISCARD, DISCARD)},
    "revoked": {
        "none": (DISCARD, DISCARD, DISCARD), "backup": (DISCARD_BACKUP, DISCARD_BACKUP, DISCARD_BACKUP),
        "copy runs": (DISCARD, DISCARD, DISCARD), "gave way": (DISCARD, DISCARD, DISCARD),
        "gone": (DISCARD, DISCARD, DISCARD)},
    "overdue": {
        "none": (REQUEUE, DEAD, REQUEUE), "backup": (LAPSE, LAPSE, LAPSE),
        "copy runs": (WAIT, WAIT, WAIT), "gave way": (REQUEUE, DEAD, REQUEUE),
        "gone": (DROP, DROP, DROP)},
    "silent": {
        "none": (REQUEUE, DEAD, REQUEUE), "backup": (LAPSE, LAPSE, LAPSE),
        "copy runs": (WAIT, WAIT, WAIT), "gave way": (REQUEUE, DEAD, REQUEUE),
        "gone": (DROP, DROP, DROP)},
    "slow": {  # a backup, or an attempt whose copy runs, is left to its slow worker, which gives way
        "none": (REQUEUE, DEAD, REQUEUE), "backup": (WAIT, WAIT, WAIT),
        "copy runs": (WAIT, WAIT, WAIT), "gave way": (REQUEUE, DEAD, REQUEUE),
        "gone": (DROP, DROP, DROP)},
}


def summary(move: Move) -> str:
    after = move.status.value if move.status else "-"
    return f"{move.act.value} {after} {move.verdict.value}" + (
        f" {move.delay_s}" if move.verdict is Verdict.NEXT else "")


@pytest.mark.parametrize("name", list(OUTCOMES))
@pytest.mark.parametrize("backup", BACKUP_STATES)
@pytest.mark.parametrize("budget", ("left", "spent", "twice"))
def test_every_outcome_budget_and_backup_state_has_its_move(name: str, backup: str, budget: str) -> None:
    outcome = OUTCOMES[name]
    expected = TABLE[name][backup][("left", "spent", "twice").index(budget)]
    assert summary(policy.decide(outcome, facts(budget, backup, outcome), LIMITS)) == expected


def test_the_table_covers_every_ending() -> None:
    assert {o.ending for o in OUTCOMES.values()} == set(Ending)
    assert all(set(row) == set(BACKUP_STATES) for row in TABLE.values()) and set(TABLE) == set(OUTCOMES)


def test_a_revocation_says_who_made_it_and_what_it_counts() -> None:
    first = Facts(1)
    overdue = policy.decide(Outcome.of(Ending.OVERDUE), first, LIMITS)
    assert (overdue.ended_as, overdue.failure, overdue.revoked_by) == ("TIMED_OUT", FailureClass.EXECUTION_TIMEOUT,
                                                                      "monitor")
    assert overdue.timed_out and overdue.kill and overdue.send  # the next attempt may run longer
    silent = policy.decide(Outcome.of(Ending.SILENT), first, LIMITS)
    assert silent.failure is FailureClass.HEARTBEAT_LOST and silent.kill and not silent.timed_out
    slow = policy.decide(Outcome.of(Ending.SLOW), first, LIMITS)  # its machine's fault: no kill, no time counted
    assert (slow.ended_as, slow.failure, slow.kill, slow.timed_out) == ("FAILED", FailureClass.WORKER_SLOW, False,
                                                                        False)
    gave = policy.decide(Outcome.of(Ending.OVERDUE), Facts(1, gave_way=True), LIMITS)
    assert gave.failure is FailureClass.WORKER_SLOW and gave.keep_end and not gave.kill  # the end its worker wrote
    overran = policy.decide(Outcome.overran("ran past its kill time"), first, LIMITS)
    assert (overran.revoked_by, overran.timed_out, overran.kill, overran.send) == ("worker", True, True, False)
    assert overran.error == "ran past its kill time"
    failed = policy.decide(Outcome.failed(FailureClass.USER_CODE, "no"), first, LIMITS)
    assert (failed.revoked_by, failed.kill, failed.timed_out) == ("", False, False)


def test_retries_wait_longer_each_time_and_a_stage_may_have_its_own_budget() -> None:
    connection = Outcome.failed(FailureClass.CONNECTION, "reset")
    assert [policy.decide(connection, Facts(n), LIMITS).delay_s for n in (1, 2, 3, 4)] == [2, 10, 30, 30]
    settings = Settings(storage_connection="UseDevelopmentStorage=true",
                        stage_limits='{"reduce": {"max_attempts": 5}}')
    own = Outcome.failed(FailureClass.USER_CODE, "no")
    assert policy.decide(own, Facts(4), policy.limits_for(settings, "reduce")).status is TaskStatus.QUEUED
    assert policy.decide(own, Facts(4), policy.limits_for(settings, "other")).status is TaskStatus.DEAD


def test_outputs_a_task_row_cannot_name_fail_the_attempt_as_its_own() -> None:
    many = Outcome.committed(TaskStatus.SUCCEEDED, [f"out/{n:06d}.tif" for n in range(3000)])
    move = policy.decide(many, Facts(1), LIMITS)
    assert (move.act, move.status, move.failure) == (Act.FAIL, TaskStatus.QUEUED, FailureClass.USER_CODE)
    assert "characters a task row can name" in move.error
    commit = policy.decide(Outcome.committed(TaskStatus.CACHED, ["a"]), Facts(1), LIMITS)
    assert (commit.act, commit.status, commit.outputs, commit.ended_as) == (Act.COMMIT, TaskStatus.CACHED, ("a",),
                                                                           "CACHED")

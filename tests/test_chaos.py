"""The chaos benchmark, short: a small job of real reprojection work while workers are
SIGKILLed, storage is killed and restarted twice, and the proxy in front of storage spikes
latency and resets connections. Checked from storage against a clean run of the same
request (tests.harness.chaos does the checking; ``python -m tests.harness.chaos`` runs the 2,000-task
version)."""

from __future__ import annotations

import pytest

from tests.harness import chaos


@pytest.mark.timeout(900)
def test_a_job_under_fire_loses_nothing_duplicates_nothing_and_mails_once() -> None:
    result = chaos.run(24, workers=3, slots=2, kill_every=5.0, timeout=400)
    assert result["tasks"] >= 24
    # the faults happened ...
    assert result["kills"] >= 3 and result["restarts"] == 2
    assert result["resets"] >= 1 and result["latency_spikes"] >= 1
    # ... and changed nothing that storage holds
    assert result["lost"] == 0, result["statuses"]
    assert result["duplicates"] == 0
    assert result["mismatched"] == 0
    assert result["orphans"] == 0, result["examples"]
    assert result["emails"] == 1

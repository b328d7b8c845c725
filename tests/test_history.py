"""The runtime history measures work: cache hits are no samples, a sample is seconds per
megapixel, and each attempt's kill threshold follows its own size (against Azurite, with
real workers)."""

from __future__ import annotations

import pytest

from pipeline import planning
from pipeline.lifecycle import jobs, policy, runtimes, tasks
from pipeline.requests import application
from pipeline.requests.expansion import expand
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from tests.conftest import parts, running_control, running_workers, small_request, wait_for, with_stage

NATIVE_MPX = 2400 * 2400 / 1e6  # a MOD10A2 tile on its own grid


def request(**body: object) -> JobRequest:
    return JobRequest.model_validate({"start": "2022-01-01", "end": "2022-01-31", "products": ["MOD10A2"],
                                      "email": "scientist@example.org", **body})


def test_work_counts_target_pixels_layers_and_a_reductions_inputs() -> None:
    native = expand(small_request(), 1000)
    assert sorted({t.work() for t in native}) == pytest.approx([NATIVE_MPX])
    # the default grid: 1° tiles at 0.005°, 200 × 200 px; two layers make twice the pixels
    lonlat = expand(request(region={"bbox": [-109.5, 36.5, -108.5, 37.5]}), 1000)
    assert sorted({t.work() for t in lonlat}) == pytest.approx([0.04])
    layered = expand(request(region={"bbox": [-109.5, 36.5, -108.5, 37.5]},
                             layers={"MOD10A2": ["Maximum_Snow_Extent", "Eight_Day_Snow_Cover"]}), 1000)
    assert sorted({t.work() for t in layered}) == pytest.approx([0.08])
    # a reduction reads its four dates' tiles
    reduced = expand(request(region={"bbox": [-109.5, 36.5, -108.5, 37.5]}, reducer={"name": "snow_fraction"}), 1000)
    reductions = [t for t in reduced if t.reduction is not None]
    assert reductions and sorted({t.work() for t in reductions}) == pytest.approx([4 * 0.04])
    assert planning.work_of({"product": "MOD10A2"}) == 1.0  # no grid named: per task


def test_kill_threshold_follows_the_attempts_size(clients: Clients, settings: Settings) -> None:
    """One history, learned on native tiles, serves a job on a grid 144 times smaller."""
    table = clients.runtimes
    per_mpx = 2.0 / NATIVE_MPX  # native tiles took 2 s each
    runtimes.merge(table, "digest", "MOD10A2", runtimes.Runtime(50, per_mpx, 0.0))
    history = runtimes.read(table, "digest", "MOD10A2")
    limits = policy.limits_for(settings.with_(kill_floor_s=0.01), "digest")
    big = expand(small_request(), 1000)[0].work()
    small = expand(request(region={"bbox": [-109.5, 36.5, -108.5, 37.5]}), 1000)[0].work()
    assert policy.kill_after(limits, history, work=big) == pytest.approx(4 * 2.0)
    assert policy.kill_after(limits, history, work=small) == pytest.approx(4 * 2.0 * 0.04 / NATIVE_MPX)
    # the floor and the cold-start ceiling stay seconds, whatever the size
    floored = policy.limits_for(settings.with_(kill_floor_s=1.0), "digest")
    assert policy.kill_after(floored, history, work=small) == 1.0
    cold = runtimes.Runtime(limits.min_samples - 1, per_mpx, 0.0)
    assert policy.kill_after(limits, cold, work=small) == policy.kill_after(limits, cold, work=big)


def test_a_history_kept_per_task_is_not_read_as_work(clients: Clients) -> None:
    """Rows written before the history measured work (no unit) are neither read nor merged into."""
    clients.runtimes.upsert_entity({"PartitionKey": "digest", "RowKey": "MOD10A2", "Count": 500, "Mean": 0.05,
                                    "M2": 0.0})
    assert runtimes.read(clients.runtimes, "digest", "MOD10A2") == runtimes.Runtime()
    merged = runtimes.merge(clients.runtimes, "digest", "MOD10A2", runtimes.Runtime().add(0.3))
    assert merged == runtimes.Runtime(1, 0.3, 0.0)
    assert runtimes.read(clients.runtimes, "digest", "MOD10A2") == merged


def test_cache_hits_do_not_enter_the_history(settings: Settings) -> None:
    settings = with_stage(settings, "half_cached")
    clients = Clients(settings)
    clients.ensure_resources()
    with running_control(settings), running_workers(settings, slots=2):
        job = application.submit(clients, small_request()).job
        wait_for(lambda: jobs.get(clients, job).state.finished, 120, "the job to finish")
    rows = tasks.list_tasks(clients.tasks, parts(clients, job))
    computed = [r for r in rows if r.status == "SUCCEEDED"]
    assert len(computed) == 4 and sum(r.status == "CACHED" for r in rows) == 4
    history = runtimes.read(clients.runtimes, "half_cached", "MOD10A2")
    assert history.count == len(computed)  # the workers merged every sample when they stopped
    seconds = [float(r.runtime_s) / planning.work_of(r.parameters()) for r in computed]
    # (a sample ends after the commit, the row's runtime at it: a little shorter)
    assert history.mean == pytest.approx(sum(seconds) / len(seconds), rel=0.5)
    assert history.mean >= 0.4 / NATIVE_MPX

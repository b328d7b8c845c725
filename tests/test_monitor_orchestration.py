"""The Durable Functions monitor driven through the library's own replay engine (the
registered orchestrator function fed a built history, as the host feeds it) and its
generator helper; the singleton keeper against a stand-in of the durable client."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import azure.durable_functions as df
from azure.durable_functions.testing import orchestrator_generator_wrapper

from tests.functions_index import index_app, user_function
from triggers.orchestration import MONITOR_INSTANCE, SWEEP_ACTIVITY, ensure_monitor

T0 = datetime(2026, 11, 22, 7, 0, 0, tzinfo=UTC)
CALL_ACTIVITY, CREATE_TIMER, CONTINUE_AS_NEW = 0, 5, 4


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event(kind: int, at: datetime, event_id: int = -1, **fields: Any) -> dict[str, Any]:
    return {"EventType": kind, "EventId": event_id, "IsPlayed": False, "Timestamp": stamp(at), **fields}


def replay(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Run the registered orchestrator on a history, as the Functions host does."""
    handle = user_function(index_app()[0], "monitor")
    context = {"history": history, "instanceId": MONITOR_INSTANCE, "isReplaying": False,
               "parentInstanceId": None, "input": None}
    return json.loads(handle(json.dumps(context)))


def test_orchestration_sweeps_waits_and_continues_as_new() -> None:
    t1, t2 = T0 + timedelta(seconds=1), T0 + timedelta(seconds=9)
    history = [event(12, T0), event(0, T0, Name="monitor", Input=None, Version="")]
    state = replay(history)
    assert state == {"isDone": False, "actions": [[{"actionType": CALL_ACTIVITY, "functionName": SWEEP_ACTIVITY,
                                                    "input": "null"}]]}
    history += [event(4, T0, 0, Name=SWEEP_ACTIVITY), event(13, T0), event(12, t1),
                event(5, t1, TaskScheduledId=0, Result=json.dumps({"interval": 7.5, "revoked": 2}))]
    state = replay(history)
    (timer,) = state["actions"][1]
    assert timer["actionType"] == CREATE_TIMER
    # the timer is set from the replayed clock (the orchestrator's start time), not wall time
    fire_at = datetime.fromisoformat(timer["fireAt"].replace("Z", "+00:00"))
    assert fire_at == t1 + timedelta(seconds=7.5)
    assert replay(history) == state, "a replay of the same history decides the same"
    history += [event(10, t1, 1, FireAt=timer["fireAt"]), event(13, t1), event(12, t2),
                event(11, t2, TimerId=1, FireAt=timer["fireAt"])]
    state = replay(history)
    assert state["isDone"] is True
    assert state["actions"][2] == [{"actionType": CONTINUE_AS_NEW, "input": "null"}]


def test_orchestrator_generator_yields_activity_then_timer() -> None:
    calls: list[tuple[str, Any]] = []

    def task(result: Any) -> SimpleNamespace:
        return SimpleNamespace(result=result)

    context = SimpleNamespace(
        current_utc_datetime=T0,
        call_activity=lambda name, payload: calls.append(("activity", name)) or task({"interval": 3}),
        create_timer=lambda at: calls.append(("timer", at)) or task(None),
        continue_as_new=lambda payload: calls.append(("continue_as_new", payload)),
    )
    steps = list(orchestrator_generator_wrapper(_orchestrator_fn()(context)))
    assert calls == [("activity", SWEEP_ACTIVITY), ("timer", T0 + timedelta(seconds=3)), ("continue_as_new", None)]
    assert len(steps) == 3 and steps[-1] is None


def _orchestrator_fn() -> Any:
    return user_function(index_app()[0], "monitor").orchestrator_function


class DurableClientStandIn:
    """What ensure_monitor asks of the durable client (the host's, which cannot run here)."""

    def __init__(self, status: df.OrchestrationRuntimeStatus | None) -> None:
        self.status, self.calls = status, []

    async def get_status(self, instance: str) -> Any:
        self.calls.append(("get_status", instance))
        return None if self.status is None else SimpleNamespace(runtime_status=self.status)

    async def terminate(self, instance: str, reason: str) -> None:
        self.calls.append(("terminate", instance))

    async def start_new(self, name: str, instance: str, payload: Any) -> str:
        self.calls.append(("start_new", name, instance))
        return instance


def test_keeper_starts_the_singleton_only_when_it_is_not_running() -> None:
    for status, expected in ((None, "started"), (df.OrchestrationRuntimeStatus.Failed, "started"),
                             (df.OrchestrationRuntimeStatus.Terminated, "started"),
                             (df.OrchestrationRuntimeStatus.Running, "running"),
                             (df.OrchestrationRuntimeStatus.ContinuedAsNew, "running")):
        client = DurableClientStandIn(status)
        assert asyncio.run(ensure_monitor(client)) == expected
        started = ("start_new", "monitor", MONITOR_INSTANCE) in client.calls
        assert started == (expected == "started")
    client = DurableClientStandIn(df.OrchestrationRuntimeStatus.Running)
    assert asyncio.run(ensure_monitor(client, restart=True)) == "started"
    assert [c[0] for c in client.calls] == ["get_status", "terminate", "start_new"]

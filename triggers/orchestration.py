"""The monitor in Azure: an eternal Durable Functions orchestration (sweep activity, timer,
``continue_as_new``), kept alive as a singleton by a timer and restartable by an admin call.

The orchestrator is deterministic: its only clock is ``current_utc_datetime`` and its only
I/O the activity, which runs ``pipeline.lifecycle.sweep`` (the same pass the local stack loops on).
"""

from datetime import timedelta
from typing import Any

import azure.durable_functions as df
import azure.functions as func

from pipeline.lifecycle import sweep
from triggers import host

bp = df.Blueprint()

MONITOR_INSTANCE = "bagpipe-monitor"
SWEEP_ACTIVITY = "monitor_sweep"
_ALIVE = (df.OrchestrationRuntimeStatus.Running, df.OrchestrationRuntimeStatus.Pending,
          df.OrchestrationRuntimeStatus.ContinuedAsNew)


@bp.orchestration_trigger(context_name="context")
def monitor(context: df.DurableOrchestrationContext) -> Any:
    report = yield context.call_activity(SWEEP_ACTIVITY, None)
    yield context.create_timer(context.current_utc_datetime + timedelta(seconds=report["interval"]))
    context.continue_as_new(None)


@bp.activity_trigger(input_name="payload")
def monitor_sweep(payload: None) -> dict[str, Any]:
    return sweep.sweep(host.clients()) | {"interval": host.settings().monitor_interval_s}


async def ensure_monitor(client: df.DurableOrchestrationClient, restart: bool = False) -> str:
    """Start the singleton monitor unless it runs (or restart it); its runtime status."""
    status = await client.get_status(MONITOR_INSTANCE)
    alive = status is not None and status.runtime_status in _ALIVE
    if alive and restart:
        await client.terminate(MONITOR_INSTANCE, "restarted by an admin call")
        alive = False
    if not alive:
        await client.start_new("monitor", MONITOR_INSTANCE, None)
        return "started"
    return "running"


@bp.timer_trigger(arg_name="timer", schedule="0 */5 * * * *", run_on_startup=True)
@bp.durable_client_input(client_name="client")
async def monitor_keeper(timer: func.TimerRequest, client: df.DurableOrchestrationClient) -> None:
    await ensure_monitor(client)


@bp.route(route="monitor/restart", methods=["POST"], auth_level=func.AuthLevel.ADMIN)
@bp.durable_client_input(client_name="client")
async def monitor_restart(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    state = await ensure_monitor(client, restart=True)
    return func.HttpResponse(f'{{"monitor": "{state}"}}', status_code=202, mimetype="application/json")

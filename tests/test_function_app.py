"""The Functions app as the Python worker indexes it (Core Tools cannot run here): its
functions, triggers, queue names and connections, and each handler invoked with real
``azure.functions`` objects against Azurite."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import azure.functions as func
import pytest

from bagpipe.mailserver import MailServer
from pipeline.lifecycle import jobs, tasks
from pipeline.lifecycle.status import JobState
from pipeline.requests import application
from pipeline.settings import Settings, env_name
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.conftest import parts, signed, small_request
from tests.functions_index import index_app, user_function


@pytest.fixture
def app_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for key, value in settings.to_env().items():
        monkeypatch.setenv(key, value)
    from triggers import host

    for cached in (host.settings, host.mailer, host.asgi):
        cached.cache_clear()
    yield index_app()[0]
    for cached in (host.settings, host.mailer, host.asgi):
        cached.cache_clear()


def test_functions_triggers_and_connections() -> None:
    _, functions = index_app()
    assert set(functions) == {"api", "portal", "planner", "completion", "planner_poisoned", "completion_poisoned",
                              "monitor", "monitor_sweep", "monitor_keeper", "monitor_restart"}
    (page,) = [b for b in functions["portal"]["bindings"] if b["type"] == "httpTrigger"]
    assert page["route"] == "portal/{*path}" and page["authLevel"].lower() == "anonymous"
    (http,) = [b for b in functions["api"]["bindings"] if b["type"] == "httpTrigger"]
    # anonymous to the host: the app signs every request in itself (tokens, or Entra)
    assert http["route"] == "{*route}" and http["authLevel"].lower() == "anonymous"
    assert set(http["methods"]) == {"GET", "POST", "DELETE"}
    for name, queue in (("planner", names.PLAN_QUEUE), ("completion", names.DONE_QUEUE),
                        ("planner_poisoned", names.PLAN_QUEUE + names.POISON_SUFFIX),
                        ("completion_poisoned", names.DONE_QUEUE + names.POISON_SUFFIX)):
        (trigger,) = functions[name]["bindings"]
        assert trigger["type"] == "queueTrigger" and trigger["direction"].lower() == "in"
        assert trigger["queueName"] == queue
        assert trigger["connection"] == names.BINDING_CONNECTION == env_name("storage_connection")
    assert [b["type"] for b in functions["monitor"]["bindings"]] == ["orchestrationTrigger"]
    assert [b["type"] for b in functions["monitor_sweep"]["bindings"]] == ["activityTrigger"]
    keeper = {b["type"]: b for b in functions["monitor_keeper"]["bindings"]}
    assert set(keeper) == {"timerTrigger", "durableClient"} and keeper["timerTrigger"]["runOnStartup"]
    restart = {b["type"]: b for b in functions["monitor_restart"]["bindings"]}
    assert restart["httpTrigger"]["authLevel"].lower() == "admin" and "durableClient" in restart


def test_http_function_serves_the_api(app_env: Any, settings: Settings, clients: Clients, admin_token: str) -> None:
    api = user_function(app_env, "api")
    body = small_request().model_dump_json().encode()

    def call(headers: dict[str, str], method: str = "POST", path: str = "/api/jobs") -> func.HttpResponse:
        request = func.HttpRequest(method=method, url=f"http://localhost{path}", headers=headers,
                                   body=body if method == "POST" else b"")
        return asyncio.run(api(request, _context()))

    refused = call({"content-type": "application/json"})
    assert refused.status_code == 401
    accepted = call({"content-type": "application/json"} | signed(admin_token))
    assert accepted.status_code == 202
    job = json.loads(accepted.get_body())["job"]
    shown = call(signed(admin_token), "GET", f"/api/jobs/{job}")
    assert json.loads(shown.get_body())["state"] == "ACCEPTED"

    # the portal's page and scripts come through its anonymous function; its data does not
    portal = user_function(app_env, "portal")
    for path, kind in (("/portal/", "text/html"), ("/portal/app.js", "javascript")):
        page = asyncio.run(portal(func.HttpRequest(method="GET", url=f"http://localhost{path}", headers={},
                                                   body=b""), _context()))
        assert page.status_code == 200 and kind in page.headers["content-type"], path
    assert call({}, "GET", "/api/catalog").status_code == 401


def test_planner_and_completion_functions_run_the_pipeline(
    app_env: Any, clients: Clients, mail: MailServer
) -> None:
    job = application.submit(clients, small_request()).job
    user_function(app_env, "planner")(func.QueueMessage(body=json.dumps({"job": job}).encode()))
    assert len(tasks.list_tasks(clients.tasks, parts(clients, job))) == 8
    assert jobs.get(clients, job).state == JobState.RUNNING.value
    jobs.cancel(clients, job, owner="test")
    user_function(app_env, "completion")(func.QueueMessage(body=json.dumps({"job": job}).encode()))
    assert jobs.get(clients, job).state == JobState.CANCELLED.value
    assert len([m for _, m in mail.messages() if job in str(m["Subject"])]) == 1
    # the monitor's sweep activity finds nothing left to do
    report = user_function(app_env, "monitor_sweep")(None)
    assert report == {"revoked": 0, "stale": 0, "backups": 0, "resent": 0, "replanned": 0, "announced": 0,
                      "slow_workers": 0, "markers": 0, "folded": 0, "summed": 0, "stopped": 0, "errors": 0,
                      "interval": clients.settings.monitor_interval_s}
    assert job not in jobs.active_jobs(clients)
    with pytest.raises(ValueError):
        user_function(app_env, "planner")(func.QueueMessage(body=b"not json"))


def _context() -> Any:
    class Context:
        invocation_id = "test-invocation"
        function_name = "api"
        function_directory = "."
        trace_context = None
        retry_context = None

    return Context()

"""The Azure deployment checked offline against the code: every Bicep file parses (the
tree-sitter-bicep grammar); the names, app settings, trigger connections, KEDA queues and
role assignments in the Bicep are the code's; and the worker image's command line — its
Dockerfile entry point with the arguments the Container Apps Job passes — runs a worker
that finishes a job against Azurite and exits when the queues go idle, logging JSON lines
that name the job, task, attempt and stage."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import tree_sitter
import tree_sitter_bicep

from pipeline.deployment import deployment_names
from pipeline.lifecycle import jobs, sweep
from pipeline.requests import application
from pipeline.settings import Settings, declared_fields
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web import auth as auth_module
from tests.conftest import small_request, wait_for
from tests.functions_index import index_app

REPO = Path(__file__).resolve().parents[1]
BICEP = REPO / "infra" / "bicep"
PARSER = tree_sitter.Parser(tree_sitter.Language(tree_sitter_bicep.language()))
DEPLOYED = json.loads((BICEP / "names.json").read_text())
# the data roles by plane (built-in role definition ids)
PLANES = {
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": "blob",  # Storage Blob Data Owner
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": "blob",  # Storage Blob Data Contributor
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": "queue",  # Storage Queue Data Contributor
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "table",  # Storage Table Data Contributor
}


def _tree(path: Path) -> tree_sitter.Tree:
    return PARSER.parse(path.read_bytes())


def _nodes(node: tree_sitter.Node, kind: str) -> Iterator[tree_sitter.Node]:
    if node.type == kind:
        yield node
    for child in node.children:
        yield from _nodes(child, kind)


def _text(node: tree_sitter.Node) -> str:
    return (node.text or b"").decode()


def _broken(node: tree_sitter.Node) -> list[str]:
    found = [f"{node.start_point}: {_text(node)[:60]!r}"] if node.is_error or node.is_missing else []
    for child in node.children:
        found += _broken(child)
    return found


def _declaration(path: Path, kind: str, name: str) -> tree_sitter.Node:
    """The ``var``/``module``/``resource`` declaration of that name."""
    for node in _nodes(_tree(path).root_node, kind):
        if any(c.type == "identifier" and _text(c) == name for c in node.children):
            return node
    raise AssertionError(f"no {kind} {name} in {path.name}")


def test_every_bicep_file_parses_without_error_nodes() -> None:
    files = sorted(BICEP.rglob("*.bicep"))
    assert len(files) >= 7
    for path in files:
        tree = _tree(path)
        assert not tree.root_node.has_error and not _broken(tree.root_node), (path.name, _broken(tree.root_node))
    # the check can fail: a broken file is seen as broken
    assert PARSER.parse(b"param x string = {\nresource r 'a@1' = \n").root_node.has_error


def test_the_deployment_sets_every_setting_the_code_reads() -> None:
    assert DEPLOYED == deployment_names()  # names.json is the code's
    settings = _declaration(BICEP / "main.bicep", "variable_declaration", "settings")
    keys = set(re.findall(r"names\.settings\.(\w+)", _text(settings)))
    assert keys == set(DEPLOYED["settings"])
    # what the code reads, minus what only the local stack sets, is exactly that
    read = {f.metadata["env"] for f in declared_fields()}
    local = {f.metadata["env"] for f in declared_fields() if f.metadata["local"]}
    assert local and {DEPLOYED["settings"][k] for k in keys} == read - local
    # both the Function App and the workers get them all
    for module in ("functions", "workers"):
        declared = _text(_declaration(BICEP / "main.bicep", "module_declaration", module))
        assert re.search(r"\bsettings: settings\b", declared), module
    for path in (BICEP / "modules/functions.bicep", BICEP / "modules/workers.bicep"):
        assert "items(settings)" in path.read_text()
    # no storage name retyped anywhere: every one comes from names.json
    for path in BICEP.rglob("*.bicep"):
        text = path.read_text()
        for name in [*DEPLOYED["tables"], *DEPLOYED["queues"], *DEPLOYED["containers"]]:
            assert f"'{name}'" not in text, f"{name} retyped in {path.name}"


def test_the_portal_address_the_emails_link_is_the_function_apps_own_page() -> None:
    """The app's settings carry the portal's address before the app exists: the Function
    App's host name as its module names the app, with the page's path the portal is served
    at (the ``portalUrl`` output), unless the deployment is given one."""
    settings = _text(_declaration(BICEP / "main.bicep", "variable_declaration", "settings"))
    assert re.search(r"'\$\{names\.settings\.portalUrl\}': portalAddress\n", settings)
    address = _text(_declaration(BICEP / "main.bicep", "variable_declaration", "portalAddress"))
    (app,) = re.findall(r"resource app '[^']+' = \{\s*name: '([^']+)'", (BICEP / "modules/functions.bicep").read_text())
    assert f"'https://{app}.azurewebsites.net/portal/'" in address and "publicPortalUrl" in address
    output = re.search(r"output portalUrl string = '(.*)'", (BICEP / "main.bicep").read_text())
    assert output and output[1] == "https://${functions.outputs.hostName}/portal/"


def test_every_trigger_connection_is_an_app_setting() -> None:
    _, metadata = index_app()
    connections = {b["connection"] for function in metadata.values() for b in function["bindings"]
                   if b.get("connection")}
    assert connections == {DEPLOYED["bindingConnection"]}
    for connection in connections:  # identity-based: CONNECTION__accountName
        assert f"{connection}__accountName" == DEPLOYED["settings"]["storageAccount"]
    host = (BICEP / "modules/functions.bicep").read_text()
    assert "'AzureWebJobsStorage__accountName'" in host  # the host's own storage (Durable task hub)
    queues = {b["queueName"] for function in metadata.values() for b in function["bindings"] if b.get("queueName")}
    assert queues <= set(DEPLOYED["queues"])


def test_keda_scales_the_workers_on_the_real_shard_queues() -> None:
    workers = BICEP / "modules/workers.bicep"
    job = _text(_declaration(workers, "resource_declaration", "job"))
    (rules,) = re.findall(r"rules: \[for (\w+) in names\.taskQueues: \{(.*?)\}\]", job, re.S)
    variable, body = rules
    assert "type: 'azure-queue'" in body and f"queueName: {variable}" in body
    assert "identity: identity.id" in body and "accountName: storageName" in body
    assert DEPLOYED["taskQueues"] == [Settings(storage_connection="x").names.shard_queue(i)
                                      for i in range(DEPLOYED["shards"])]
    assert "minExecutions: 0" in job and "triggerType: 'Event'" in job


def test_the_caches_are_kept_by_last_use_and_the_results_by_age() -> None:
    storage = BICEP / "modules/storage.bicep"
    service = _text(_declaration(storage, "resource_declaration", "blobService"))
    assert re.search(r"lastAccessTimeTrackingPolicy: \{ enable: true", service), "a read must record the blob's use"
    caches = _text(_declaration(storage, "variable_declaration", "cacheRules"))
    assert "names.cacheRetention" in caches and "daysAfterLastAccessTimeGreaterThan: c.days" in caches
    results = _text(_declaration(storage, "variable_declaration", "resultRules"))
    assert "names.expiringContainers" in results and "daysAfterModificationGreaterThan: retentionDays" in results
    rules = _text(_declaration(storage, "resource_declaration", "retention"))
    assert "concat(cacheRules, resultRules)" in rules
    assert {e["container"] for e in DEPLOYED["cacheRetention"]}.isdisjoint(DEPLOYED["expiringContainers"])


def test_role_assignments_cover_every_data_plane_for_both_identities() -> None:
    main = (BICEP / "main.bicep").read_text()
    role_ids = dict(re.findall(r"(\w+): '([0-9a-f-]{36})'", _text(_declaration(BICEP / "main.bicep",
                                                                               "variable_declaration", "roles"))))
    for module in ("functionRoles", "workerRoles"):
        declared = _text(_declaration(BICEP / "main.bicep", "module_declaration", module))
        granted = re.findall(r"(?<![/\w])roles\.(\w+)", declared)
        assert {PLANES[role_ids[r]] for r in granted} == {"blob", "queue", "table"}, module
    assert "principalId: functions.outputs.principalId" in main and "principalId: workers.outputs.principalId" in main
    storage = (BICEP / "modules/storage.bicep").read_text()
    assert "allowSharedKeyAccess: false" in storage


def _image_command() -> list[str]:
    """The worker image's command line as Azure runs it: ENTRYPOINT + the job's args."""
    dockerfile = (REPO / "Dockerfile").read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.M).group(1))  # type: ignore[union-attr]
    job = _text(_declaration(BICEP / "modules/workers.bicep", "resource_declaration", "job"))
    args = re.search(r"args: \[(.*?)\]", job).group(1)  # type: ignore[union-attr]
    values = {"string(slots)": "2", "string(idleSeconds)": "3"}  # idle shortened for the test
    return [*entry, *[values.get(a.strip(), a.strip().strip("'")) for a in args.split(",")]]


class _Ingestion(BaseHTTPRequestHandler):
    """Azure Monitor's ingestion endpoint, as far as the exporter sees it: keeps every
    envelope it is sent."""

    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        envelopes = json.loads(body)
        envelopes = envelopes if isinstance(envelopes, list) else [envelopes]
        self.received.extend(envelopes)
        answer = json.dumps({"itemsReceived": len(envelopes), "itemsAccepted": len(envelopes), "errors": []})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(answer.encode())

    def log_message(self, *_: object) -> None:
        pass


def test_the_worker_image_command_runs_a_job_and_exits_when_idle(settings: Settings, clients: Clients) -> None:
    ingestion = ThreadingHTTPServer(("127.0.0.1", 0), _Ingestion)
    threading.Thread(target=ingestion.serve_forever, daemon=True).start()
    command = _image_command()
    assert command[:3] == ["python", "-m", "bagpipe.cli"] and "--exit-when-idle" in command
    row = application.submit(clients, small_request())
    job = row.job
    sweep.handle_plan(clients, json.dumps({"job": job}).encode())
    telemetry = settings.with_(log_format="json", appinsights_connection=(
        "InstrumentationKey=00000000-0000-0000-0000-000000000000;"
        f"IngestionEndpoint=http://127.0.0.1:{ingestion.server_port}/"))
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")} | telemetry.to_env() | {
        "PYTHONPATH": str(REPO)}
    try:
        worker = subprocess.run([sys.executable, *command[1:]], env=env, cwd=REPO, capture_output=True,
                                text=True, timeout=240)
    finally:
        ingestion.shutdown()
    assert worker.returncode == 0, worker.stderr[-2000:]
    status = wait_for(lambda: (s := jobs.status(clients, job))["progress"] == 1.0 and s, 30, "every task ended")
    assert status["counts"]["SUCCEEDED"] == status["total"]  # type: ignore[index]
    lines = [json.loads(line) for line in worker.stderr.splitlines() if line.startswith("{")]
    assert any("exiting" in line["message"] for line in lines)
    committed = [line for line in lines if line["message"].endswith("committed")]
    assert len(committed) == status["total"]  # type: ignore[index]
    for line in committed:
        assert line["job"] == job and line["task"] and line["attempt"] == 1 and line["stage"] == settings.tile_stage
    # and to Azure Monitor, through OpenTelemetry: a span per attempt, the logs with the
    # same fields, the attempt metrics
    spans = [s for kind in ("RequestData", "RemoteDependencyData") for s in _telemetry_of(_Ingestion.received, kind)
             if s["name"].startswith("attempt ")]
    assert {s["properties"]["bagpipe.job"] for s in spans} == {job} and len(spans) == status["total"]  # type: ignore[index]
    logged = [m for m in _telemetry_of(_Ingestion.received, "MessageData") if m["message"].endswith("committed")]
    assert len(logged) == status["total"] and all(m["properties"]["job"] == job for m in logged)  # type: ignore[index]
    metrics = {m["metrics"][0]["name"] for m in _telemetry_of(_Ingestion.received, "MetricData")}
    assert {"bagpipe.attempts", "bagpipe.attempt.duration"} <= metrics


@pytest.mark.parametrize("path", ["Dockerfile", ".dockerignore"])
def test_the_image_ships_the_worker_and_the_reductions(path: str) -> None:
    text = (REPO / path).read_text()
    if path == "Dockerfile":
        for needed in ("COPY pipeline", "COPY worker", "COPY bagpipe", "reducers", "requirements.txt", "USER "):
            assert needed in text
        assert "BAGPIPE_REDUCERS_PATH=/opt/bagpipe/reducers" in text
    else:
        assert ".venv" in text and "tests" in text


def _telemetry_of(envelopes: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"]["baseData"] for e in envelopes if e.get("data", {}).get("baseType") == kind]


def test_app_service_authentication_is_what_the_code_expects() -> None:
    """Entra sign-in in front of the Function App (authsettingsV2): it lets every request
    through (scripts come with personal tokens; the app refuses the rest itself), keeps the
    token store on (the app reads the ID token it forwards) and signs in with the provider
    whose login path the portal links to; the app's settings name the same issuer and client."""
    functions = BICEP / "modules/functions.bicep"
    auth = _text(_declaration(functions, "resource_declaration", "auth"))
    assert "'Microsoft.Web/sites/config@" in auth and "name: 'authsettingsV2'" in auth and "parent: app" in auth
    assert "if (signIn)" in auth and "var signIn = !empty(entraClientId)" in functions.read_text()
    assert "unauthenticatedClientAction: 'AllowAnonymous'" in auth and "requireAuthentication: false" in auth
    assert re.search(r"tokenStore: \{ enabled: true \}", auth)
    assert re.search(r"azureActiveDirectory: \{\s*enabled: true", auth)
    assert "openIdIssuer: entraIssuer" in auth and "clientId: entraClientId" in auth
    assert "offline_access" in auth  # the portal refreshes an expired ID token (/.auth/refresh)
    assert auth_module.LOGIN_PATH == "/.auth/login/aad" and auth_module.REFRESH_PATH == "/.auth/refresh"
    assert names.PLATFORM_ID_TOKEN == "X-MS-TOKEN-AAD-ID-TOKEN"  # what the token store forwards for aad
    # the same issuer and client reach the app as its settings, from main.bicep's parameters
    main = BICEP / "main.bicep"
    settings = _text(_declaration(main, "variable_declaration", "settings"))
    assert "'${names.settings.entraIssuer}': entraIssuer" in settings
    assert "'${names.settings.entraClientId}': entraClientId" in settings
    issuer = _text(_declaration(main, "variable_declaration", "entraIssuer"))
    assert "environment().authentication.loginEndpoint" in issuer and "tenant().tenantId}/v2.0" in issuer
    module = _text(_declaration(main, "module_declaration", "functions"))
    for param in ("entraClientId: entraClientId", "entraIssuer: entraIssuer", "entraClientSecret: entraClientSecret"):
        assert param in module
    assert "@secure()" in main.read_text().split("param entraClientSecret")[0].rsplit("param ", 1)[-1]
    # the HTTP function is anonymous to the host, so that both kinds of callers reach the app
    _, metadata = index_app()
    (http,) = [b for b in metadata["api"]["bindings"] if b["type"] == "httpTrigger"]
    assert http["authLevel"].lower() == "anonymous"


def test_the_earthdata_token_and_the_subscription_key_are_key_vault_secrets_for_both_identities() -> None:
    main = (BICEP / "main.bicep").read_text()
    settings = _text(_declaration(BICEP / "main.bicep", "variable_declaration", "settings"))
    assert "'@Microsoft.KeyVault(SecretUri=${vault.outputs.secretUri})'" in settings  # the Function App's syntax
    assert "@secure()\nparam earthdataToken" in main
    # Planetary Computer's subscription key: its own secret, read the same ways
    assert "'${names.settings.pcSubscriptionKey}': empty(pcSubscriptionKey) ? '' : " \
           "'@Microsoft.KeyVault(SecretUri=${vault.outputs.keyUri})'" in settings
    assert "@secure()\nparam pcSubscriptionKey" in main
    vault = (BICEP / "modules/vault.bicep").read_text()
    assert "name: 'pc-subscription-key'" in vault and "@secure()\nparam pcSubscriptionKey" in vault
    workers_module = _text(_declaration(BICEP / "main.bicep", "module_declaration", "workers"))
    assert "'${names.settings.pcSubscriptionKey}': vault.outputs.keyUri" in workers_module
    assert "if (secrets)" in _text(_declaration(BICEP / "main.bicep", "module_declaration", "vault"))
    workers = (BICEP / "modules/workers.bicep").read_text()
    assert "keyVaultUrl: s.value, identity: identity.id" in workers and "secretRef:" in workers
    assert "!contains(secretSettings, s.key)" in workers  # the reference string never reaches a worker
    readers = _text(_declaration(BICEP / "main.bicep", "module_declaration", "vaultReaders"))
    assert "functions.outputs.principalId" in readers and "workers.outputs.principalId" in readers
    assert "4633458b-17de-408a-b874-0445c86b69e6" in (BICEP / "modules/vaultroles.bicep").read_text()

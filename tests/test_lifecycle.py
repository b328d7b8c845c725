"""The whole request lifecycle on the local stack: HTTP API under uvicorn, control loop,
real worker processes, Azurite, SMTP — then the CLI on the finished job."""

from __future__ import annotations

import asyncio
import hashlib
import json
import smtplib
import socket
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
import rasterio
from fastapi import FastAPI

from bagpipe import modis_world as world
from bagpipe.azurite import Azurite
from bagpipe.client import Api, download_results
from bagpipe.mailserver import MailServer
from bagpipe.serving import Served, bound
from bagpipe.stack import LocalStack, StackRunning
from pipeline.modis import layout, stacitems
from pipeline.modis.access import Access
from pipeline.modis.cmr import CmrCatalog
from pipeline.modis.granules import Granule, as_param
from pipeline.modis.products import CATALOG
from pipeline.modis.stac import StacCatalog
from pipeline.modis.targets import lonlat_bounds
from pipeline.requests.expansion import expand
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients, clients_for
from tests.conftest import wait_for

REQUEST = {
    "region": {"tiles": ["h09v05", "h10v05"]},
    "start": "2022-02-01",
    "end": "2022-03-01",
    "products": ["MOD10A2", "MOD13A1"],
    "email": "scientist@example.org",
    "label": "lifecycle",
}


def test_submit_run_complete_notify_download(azurite: Azurite, settings: Settings, tmp_path: Path) -> None:
    with LocalStack(tmp_path / "stack", workers=2, slots=2, connection=azurite.connection_string,
                    namespace=settings.namespace,
                    overrides={"window": 8, "tile_stage": "digest", "stage_modules": settings.stage_modules}) as stack:
        key = stack.token
        http = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        created = http.post("/api/jobs", json=REQUEST)
        assert created.status_code == 202, created.text
        job, total = created.json()["job"], created.json()["total"]
        assert total == 2 * (5 + 3)  # h09v05, h10v05 × (5 eight-day + 3 sixteen-day periods)

        status = wait_for(lambda: (s := http.get(f"/api/jobs/{job}").json())["state"] in
                          ("SUCCEEDED", "FAILED", "CANCELLED") and s, 120, "the job to finish")
        assert status["state"] == "SUCCEEDED"
        assert status["counts"]["SUCCEEDED"] == total and status["progress"] == 1.0
        assert status["failures"] == {}

        # exactly one manifest, exactly one email, saying the job succeeded
        clients = Clients(stack.settings)
        manifests = [b.name for b in clients.products.list_blobs(name_starts_with=f"{job}/")
                     if b.name.endswith("manifest.json")]
        assert manifests == [names.manifest_blob(job)]
        mails = [m for _, m in stack.mail.messages() if job in str(m["Subject"])]
        assert len(mails) == 1
        assert "succeeded" in str(mails[0]["Subject"]) and mails[0]["To"] == "scientist@example.org"
        assert f"{total} succeeded" in mails[0].get_content()

        # the results: every output reachable through its short-lived SAS link, and it is
        # the digest of the very source blob it names
        results = http.get(f"/api/jobs/{job}/results").json()
        assert len(results["tasks"]) == total
        # the small outputs are packed too: one pack, one ranged read for the whole job
        assert set(results["packed"]) == {o for task in results["tasks"] for o in task["outputs"]}
        assert len(results["pack_links"]) == 1
        direct: dict[str, bytes] = {}
        for task in results["tasks"]:
            assert task["status"] == "SUCCEEDED" and len(task["outputs"]) == 1
            (_blob, link), = task["links"].items()
            direct[task["task"]] = httpx.get(link).content
            query = parse_qs(urlparse(link).query)
            expiry = datetime.fromisoformat(query["se"][0].replace("Z", "+00:00"))
            assert expiry - datetime.now(UTC) < timedelta(minutes=61)
            assert query["sp"] == ["r"]
            summary = httpx.get(link).json()
            assert (summary["product"], summary["tile"], summary["date"]) == (
                task["product"], task["tile"], task["date"])
            source = clients.sources.download_blob(summary["source"]).readall()
            assert summary["sha256"] == hashlib.sha256(source).hexdigest()
        unsigned = link.split("?")[0]
        assert httpx.get(unsigned).status_code in (403, 404)

        # the command line on the same job
        cli = [sys.executable, "-m", "bagpipe.cli"]
        auth = ["--api", stack.api_url, "--key", key]
        shown = subprocess.run([*cli, "status", job, "--json", *auth], capture_output=True, text=True,
                               check=True)
        assert json.loads(shown.stdout)["state"] == "SUCCEEDED"
        out = tmp_path / "out" / job  # where it goes by default, as the demo's
        said = subprocess.run([*cli, "results", job, *auth], check=True, capture_output=True, text=True,
                              cwd=tmp_path).stdout
        written = [p for p in out.rglob("*") if p.is_file()]  # the products and all beside them
        assert f"{len(written)} files written in out/{job}: {total} products" in " ".join(said.split()), said
        manifest = json.loads((out / "manifest.json").read_text())
        files = [f for task in manifest["tasks"] for f in task["files"]]
        assert len(files) == total
        for task in manifest["tasks"]:  # unpacked from the pack, the same bytes as each link gives
            (local,) = task["files"]
            assert (out / local).read_bytes() == direct[task["task"]]
        refused = subprocess.run([*cli, "status", job, "--api", stack.api_url, "--key", "nope"],
                                 capture_output=True, text=True)
        assert refused.returncode == 1 and "401" in refused.stdout

        # a manifest that names places outside the results folder writes nothing at all
        stored = json.loads(clients.products.download_blob(names.manifest_blob(job)).readall())
        stored["tasks"][0]["tile"] = "../../escaped"
        clients.products.upload_blob(names.manifest_blob(job), json.dumps(stored), overwrite=True)
        tampered = tmp_path / "tampered" / "out"
        escaped = subprocess.run([*cli, "results", job, "--out", str(tampered), *auth], capture_output=True,
                                 text=True)
        assert escaped.returncode == 1 and "outside the results folder" in escaped.stdout
        assert not any((tmp_path / "tampered").rglob("*.json")) and not (tmp_path / "escaped").exists()


def test_the_modis_pipeline_end_to_end_and_a_second_request_is_cached(
    azurite: Azurite, settings: Settings, tmp_path: Path
) -> None:
    request = {"region": {"bbox": [-110.5, 34.2, -108.6, 34.8]}, "grid": {"tile_size": 1.0, "resolution": 0.01},
               "start": "2022-02-02", "end": "2022-02-12", "products": ["MOD10A2"], "label": "snow"}
    with LocalStack(tmp_path / "stack", workers=1, slots=2, connection=azurite.connection_string,
                    namespace=settings.namespace, token_minutes=0.05) as stack:  # SAS tokens live 3 s
        api = Api(stack.api_url, stack.token)
        first = api.submit(request)
        # 1° tiles x-111, x-110, x-109 (over h08v05 | h09v05) × 2 periods: a tile task per period warps all three
        assert first["total"] == 2

        def finished(job: str) -> dict:
            return wait_for(lambda: (s := api.status(job))["state"] in ("SUCCEEDED", "FAILED") and s,
                            180, "the job")  # type: ignore[return-value]

        status = finished(first["job"])
        assert status["state"] == "SUCCEEDED" and status["counts"]["SUCCEEDED"] == 2, status
        # the sources came signed with the imitation's SAS tokens (whether the job outlives one
        # depends on the machine's speed: their renewal is tests/test_access.py's)
        assert stack.planetary.tokens_issued >= 1
        out = tmp_path / "out"
        manifest, files = download_results(api, first["job"], out)
        assert files == 6
        entries = json.loads(manifest.read_text())["tasks"]
        assert len(entries) == 6 and len({e["task"] for e in entries}) == 2, "an entry per target tile"
        for task in entries:
            (local,) = task["files"]
            with rasterio.open(out / local) as tile:
                assert tile.crs.to_epsg() == 4326 and tile.res == (0.01, 0.01) and tile.shape == (100, 100)
                assert tile.tags()["DATE"] == task["date"] and tile.tags()["TARGET_TILE"] == task["tile"]
                assert tile.nodata == 255 and (tile.read(1) != 255).any()
                # its parameters typed: numbers as numbers, lists as lists, documents as objects
                assert task["res"] == 0.01 and task["layers"] == ["Maximum_Snow_Extent"]
                assert tuple(task["bounds"]) == pytest.approx(tuple(tile.bounds))
                assert all(isinstance(v, float) for v in task["bounds"]) and isinstance(task["work"], float)
                assert [g["id"] for g in task["granules"].values()] == tile.tags()["SOURCES"].split(",")

        again = finished(api.submit(request | {"label": "snow again"})["job"])
        assert again["counts"]["CACHED"] == 2, again  # invariant 4: nothing computed twice
        sources = clients_for(stack.settings).sources
        assert len(list(sources.list_blobs())) == 2 * 2  # each granule's layer fetched once (2 tiles × 2 periods)


def test_a_manifest_entry_is_typed_and_one_written_before_reads_alike() -> None:
    """A task's parameters as its manifest entry gives them (text on the task row): numbers,
    boxes, runs of tasks and names as lists, documents as objects; the entries of a manifest
    written before, as text, read the same through every reader of an entry."""
    request = JobRequest.model_validate({
        "region": {"bbox": [-110.5, 34.2, -110.1, 34.8]}, "grid": {"resolution": 0.01}, "start": "2022-02-02",
        "end": "2022-02-20", "products": ["MOD10A2"], "reduce": {"by": "month", "reducer": "max"}})
    params = [spec.params() | {"work": "1.25"} for spec in expand(request, 100)]
    params[0]["granules"] = as_param([Granule.named("MOD10A2.A2022033.h08v05.061.2022042050729", {}, True)])
    typed = [layout.typed(p) for p in params]
    assert typed[0] | {"granules": None} == {
        "product": "MOD10A2", "tile": "x-0111y+0034", "date": "2022-02-02", "crs": "EPSG:4326", "res": 0.01,
        "bounds": [-111.0, 34.0, -110.0, 35.0], "sources": ["h08v05"], "layers": ["Maximum_Snow_Extent"],
        "work": 1.25, "granules": None}
    assert typed[0]["granules"]["h08v05"]["id"] == "MOD10A2.A2022033.h08v05.061.2022042050729"
    reduction = typed[3]
    assert reduction["deps"] == [[0, 3]] and reduction["reduce"]["reducer"] == "max"
    assert reduction["encodings"]["MOD10A2.Maximum_Snow_Extent"]["nodata"] == 255
    for entries in ([p | {"task": names.task_key(i), "stage": s.stage} for i, (p, s) in enumerate(
            zip(params, expand(request, 100), strict=True))], [t | {"task": names.task_key(i), "stage": s.stage}
                                                             for i, (t, s) in enumerate(zip(typed, expand(request, 100),
                                                                                            strict=True))]):
        by_key = layout.by_task(entries)
        assert [layout.span(e) for e in entries] == ["2022-02-02", "2022-02-10", "2022-02-18", "2022-02"]
        assert layout.dates(entries[3]) == (date(2022, 2, 2), date(2022, 2, 20))
        assert [e["task"] for e in layout.dependencies(entries[3], by_key)] == [names.task_key(i) for i in range(3)]
        assert layout.folder(entries[3]) == "max" and stacitems.granule_ids(entries[0]) == [
            "MOD10A2.A2022033.h08v05.061.2022042050729"]
        assert lonlat_bounds(entries[0]["crs"], entries[0]["bounds"]) == (-111.0, 34.0, -110.0, 35.0)


def test_a_granule_found_before_a_restart_of_the_stack_is_read_after_it(
        azurite: Azurite, settings: Settings, tmp_path: Path) -> None:
    """A planned task keeps its granules' hrefs: after a restart in the same home, the
    imitations of Planetary Computer's storage and NASA's archive still serve them."""
    home, box, day = tmp_path / "stack", (-108.0, 35.0, -107.5, 35.5), date(2022, 2, 2)
    def stack_in(home: Path) -> LocalStack:
        return LocalStack(home, workers=0, connection=azurite.connection_string, namespace=settings.namespace)

    with stack_in(home) as stack:
        (from_stac,) = StacCatalog(stack.planetary.stac_url).search(CATALOG["MOD10A2"], box, day, day)
        (from_cmr,) = CmrCatalog(stack.nasa.cmr_url).search(CATALOG["MOD10A2"], box, day, day)
    with stack_in(home) as again:
        signed = Access(again.settings.stac_sas_url, "", "").fetch(from_stac.href("Maximum_Snow_Extent"))
        assert signed.data == (world.REAL_DATA / f"{from_stac.id}_Maximum_Snow_Extent.tif").read_bytes()
        logged_in = Access("", again.nasa.token, again.nasa.hosts).fetch(from_cmr.href("hdf"))
        assert logged_in.data == (world.REAL_DATA / f"{from_cmr.id}.hdf").read_bytes()


def test_a_stack_home_is_held_while_anything_the_stack_started_runs(tmp_path: Path) -> None:
    """One stack a home: a second is refused, naming what holds it, and so it is while the
    Azurite a stack started runs on the home's files, the stack's own process gone (here: its
    hold on the lock let go); once all is stopped the home is free."""
    home = tmp_path / "stack"
    stack = LocalStack(home, workers=0).start()  # its own Azurite, in the home
    try:
        assert stack.azurite is not None and stack.azurite.process is not None
        azurite = str(stack.azurite.process.pid)
        with pytest.raises(StackRunning, match=azurite):
            LocalStack(home, workers=0).start()
        assert stack._lock is not None
        stack._lock.close()  # as when its process is killed: its Azurite runs on, in its own session
        stack._lock = None
        with pytest.raises(StackRunning, match=azurite):
            LocalStack(home, workers=0).start()
    finally:
        stack.stop()
    LocalStack(home, workers=0).start().stop()


def test_a_served_app_holds_its_port_from_the_moment_it_is_made() -> None:
    """The local stack's servers (its API, the imitations of Planetary Computer and NASA)
    take their port when they are made, not when they listen: no other process can take it in
    between, as one took a port found free and let go before the server bound it."""
    served = Served(FastAPI(), name="held")
    with socket.socket() as other, pytest.raises(OSError):
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind theirs
        other.bind((served.host, served.port))
    served.start()
    try:
        assert httpx.get(f"{served.url}/openapi.json").status_code == 200
    finally:
        served.stop()


def test_the_mail_server_holds_its_port_from_the_moment_it_is_made(tmp_path: Path) -> None:
    """The local SMTP server takes its port when it is made, as the stack's other servers do."""
    mail = MailServer(tmp_path / "mail")
    with socket.socket() as other, pytest.raises(OSError):
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind theirs
        other.bind(("127.0.0.1", mail.port))
    mail.start()
    try:
        with smtplib.SMTP("127.0.0.1", mail.port) as smtp:
            smtp.sendmail("a@example.org", ["b@example.org"], b"Subject: held\r\n\r\nits port held")
        assert [message["Subject"] for _, message in mail.messages()] == ["held"]
    finally:
        mail.stop()


def test_connections_to_a_held_port_send_their_small_writes_at_once() -> None:
    """A held port's server (uvicorn, aiosmtpd: asyncio's ``create_server`` on the socket)
    turns Nagle's algorithm off on each connection it accepts, as on a port it binds itself:
    with it on, the mail server's reply to EHLO, written a line at a time, waited out the
    client's delayed acknowledgement (40 ms an email)."""
    async def accepted() -> int:
        loop = asyncio.get_running_loop()
        nodelay: asyncio.Future[int] = loop.create_future()

        class Accepted(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                nodelay.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        server = await loop.create_server(Accepted, sock=bound("127.0.0.1"))
        async with server:
            _, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
            try:
                return await asyncio.wait_for(nodelay, 10)
            finally:
                writer.close()

    assert asyncio.run(accepted())

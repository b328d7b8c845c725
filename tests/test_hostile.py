"""Everything that crosses a trust boundary, made hostile: messages on the task queues,
source files from an archive, reducer manifests, the files a reduction program leaves. Each gets
a clear error or a classified failure; nothing crashes, nothing is lost, nothing runs twice
and nothing is written where it should not be. (Request bodies: tests/test_api.py and the
Schemathesis run in tests/test_api_fuzz.py.)"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from datetime import date
from pathlib import Path

import pytest
from azure.storage.blob import ContentSettings

from bagpipe.azurite import Azurite
from bagpipe.mailserver import MailServer
from bagpipe.modis_world import REAL_DATA
from bagpipe.planetary import Planetary
from pipeline.failures import FailureClass, StageFailure
from pipeline.lifecycle import attempts, jobs, tasks
from pipeline.lifecycle.status import JobState, TaskStatus
from pipeline.modis.granules import from_param
from pipeline.modis.products import CATALOG
from pipeline.modis.reprojection import Source, Target, warp
from pipeline.reduction import reducers
from pipeline.reduction.stage import run_program
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.storage.transfer import md5_of
from tests.conftest import on_stac, parts, queue_depth, running_control, running_workers, wait_for
from tests.test_tilestage import params_for, run
from tests.test_worker import planned_job

SNOW = REAL_DATA / "MOD10A2.A2022033.h09v05.061.2022042050729_Maximum_Snow_Extent.tif"


def test_hostile_messages_amid_a_job_lose_nothing_and_run_nothing_twice(
    settings: Settings, clients: Clients, mail: MailServer
) -> None:
    job = planned_job(clients)
    first = tasks.list_tasks(clients.tasks, parts(clients, job))[0].task
    undecodable = [
        b"\x00\xff\xfe binary",
        b"{not json",
        json.dumps([job, first, 1]).encode(),
        json.dumps({"job": job, "task": first, "attempt": "1"}).encode(),
        json.dumps({"job": job, "task": first, "attempt": True}).encode(),
        json.dumps({"job": job, "task": first, "attempt": 10**9}).encode(),
        json.dumps({"job": job, "task": first, "attempt": 0}).encode(),
        json.dumps({"job": job, "task": "\u0660" * 8 + "\u0661", "attempt": 1}).encode(),  # Arabic-Indic digits
        json.dumps({"job": f"{job}' or PartitionKey ne '", "task": first, "attempt": 1}).encode(),
        json.dumps({"job": "../../products", "task": first, "attempt": 1}).encode(),
        json.dumps({"job": job, "task": first, "attempt": 1, "stage": "rm -rf /"}).encode(),
        json.dumps({"job": job, "task": first, "attempt": 1, "pad": "x" * 45_000}).encode(),  # near the 64 KiB cap
    ]
    decodable_but_void = [
        {"job": job, "task": first, "attempt": 7},  # a forged later attempt
        {"job": job, "task": first, "attempt": 1},  # a duplicate of the real message
        {"job": "jnosuchjob", "task": first, "attempt": 1},  # a job that does not exist
    ]
    queue = clients.shard_queues[0]
    for body in undecodable + [json.dumps(b).encode() for b in decodable_but_void]:
        queue.send_message(body)

    with running_control(settings), running_workers(settings, count=2):
        wait_for(lambda: jobs.get(clients, job).state.finished, 120, "the job to finish")
        wait_for(lambda: queue_depth(clients) == 0, 60, "every shard to empty")

    assert jobs.get(clients, job).state == JobState.SUCCEEDED.value
    rows = tasks.list_tasks(clients.tasks, parts(clients, job))
    assert len(rows) == 8 and {r.status for r in rows} == {TaskStatus.SUCCEEDED.value}
    tried = attempts.list_attempts(clients.tasks, parts(clients, job))
    assert sorted(a.key for a in tried) == sorted(names.attempt_key(r.task, 1) for r in rows)
    poison = clients.queue(settings.names.poison_queue(queue.queue_name))
    records = [json.loads(tasks.message_bytes(m.content)) for m in poison.peek_messages(max_messages=32)]
    assert len(records) == len(undecodable)
    assert all(r["why"].startswith("undecodable") and r["queue"] == queue.queue_name for r in records)
    written = [b.name for b in clients.products.list_blobs()]
    assert written and all(name.startswith(f"{job}/") for name in written)
    assert len(mail.messages()) == 1


def _lonlat_copy() -> bytes:
    """The real granule, reprojected to plain lon/lat: a valid GeoTIFF in the wrong CRS."""
    return warp([Source(SNOW.stem, {"Maximum_Snow_Extent": SNOW})], CATALOG["MOD10A2"], "Maximum_Snow_Extent",
                Target("EPSG:4326", (-110.0, 35.0, -109.0, 36.0), 0.005, "nearest"))


def _served_as(clients: Clients, settings: Settings, planetary: Planetary, content: bytes,
               md5: bytes | None = None) -> dict[str, str]:
    """The real granule's tile task, its layer file in the archive replaced by ``content``
    (with a stored MD5 of ``md5``, if given)."""
    mine = on_stac(settings, planetary)
    params = params_for(mine, -108.0, 35.0, date(2022, 2, 2))
    (granule,) = from_param(params["granules"])
    container, blob = dict(granule.files)["Maximum_Snow_Extent"].split("/devstoreaccount1/", 1)[1].split("/", 1)
    client = clients.blob_service.get_blob_client(container, blob)
    client.upload_blob(content, overwrite=True)
    client.set_http_headers(ContentSettings(content_md5=bytearray(md5 or md5_of(content))))
    return params


@pytest.mark.parametrize(("what", "content", "failure", "words"), [
    ("an HTML error page", lambda: b"<html>503 try later</html>", FailureClass.BAD_SOURCE, "GDAL"),
    ("a truncated granule", lambda: SNOW.read_bytes()[:50_000], FailureClass.BAD_SOURCE, "GDAL"),
    ("an empty file", lambda: b"", FailureClass.BAD_SOURCE, "raster"),
    ("the wrong projection", _lonlat_copy, FailureClass.BAD_SOURCE, "sinusoidal"),
])
def test_a_broken_source_file_is_a_classified_failure_and_never_cached(
    clients: Clients, settings: Settings, azurite: Azurite, what: str, content: object, failure: FailureClass,
    words: str,
) -> None:
    with Planetary(azurite.connection_string, prefix=settings.namespace) as planetary:
        params = _served_as(clients, settings, planetary, content())  # type: ignore[operator]
        with pytest.raises(StageFailure, match=words) as caught:
            run(on_stac(settings, planetary), params)
    assert caught.value.failure is failure and caught.value.failure.transient is False, what
    assert list(clients.sources.list_blobs()) == [] and list(clients.tiles.list_blobs()) == []


def test_a_source_whose_stored_md5_lies_is_refused(clients: Clients, settings: Settings, azurite: Azurite) -> None:
    with Planetary(azurite.connection_string, prefix=settings.namespace) as planetary:
        params = _served_as(clients, settings, planetary, SNOW.read_bytes(), md5_of(b"some other file"))
        with pytest.raises(StageFailure, match="MD5") as caught:
            run(on_stac(settings, planetary), params)
    assert caught.value.failure is FailureClass.SOURCE_DOWNLOAD
    assert list(clients.sources.list_blobs()) == [] and list(clients.tiles.list_blobs()) == []


GOOD = {"name": "fine", "argv": ["{python}", "{here}/fine.py", "{task}"], "outputs": ["*.tif"]}


@pytest.mark.parametrize(("change", "field"), [
    ({"argv": "python fine.py; rm -rf ~"}, "argv"),  # a shell line
    ({"argv": []}, "argv"),
    ({"argv": ["{python}", "{python.__class__.__mro__}"]}, "argv"),  # format-string reach-through
    ({"argv": ["{python}", "{0}"]}, "argv"),
    ({"argv": ["{python}", "{here"]}, "argv"),
    ({"name": "../../etc"}, "name"),
    ({"name": "Fine"}, "name"),
    ({"outputs": ["../*.tif"]}, "outputs.0"),
    ({"outputs": "*.tif"}, "outputs"),
    ({"env": {"AZURE_STORAGE_CONNECTION_STRING": "x"}}, "env"),
    ({"env": {"LD PRELOAD": "x"}}, "env"),
    ({"env": ["A=1"]}, "env"),
    ({"timeout_s": -1}, "timeout_s"),
    ({"timeout_s": "NaN"}, "timeout_s"),
    ({"limits": {"memory_mb": 10**9}}, "limits.memory_mb"),
    ({"limits": {"cpu_s": "forever"}}, "limits.cpu_s"),
    ({"limits": {"nice": -20}}, "limits.nice"),
    ({"input_format": "MAT"}, "input_format"),
    ({"run_as": "root"}, "run_as"),
    ({"network": True}, "network"),  # a reducer lists the hosts it reaches
    ({"network": {"hosts": ["127.0.0.1:8080"]}}, "network.hosts"),
    ({"network": {"hosts": ["[::1]:8080"]}}, "network.hosts"),
    ({"network": {"hosts": ["169.254.169.254:80"]}}, "network.hosts"),  # the cloud's metadata endpoint
    ({"network": {"hosts": ["10.0.0.4:10000"]}}, "network.hosts"),
    ({"network": {"hosts": ["localhost:10000"]}}, "network.hosts"),
    ({"network": {"hosts": ["example.org"]}}, "network.hosts"),
    ({"network": {"hosts": []}}, "network.hosts"),
])
def test_a_hostile_manifest_is_refused_naming_its_field_and_hides_no_other(
    tmp_path: Path, change: dict[str, object], field: str
) -> None:
    for name, manifest in (("fine", GOOD), ("bad", GOOD | {"name": "bad"} | change)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "reducer.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=rf"reducer\.json: {re.escape(field)}[.:]"):
        reducers.load(tmp_path / "bad" / "reducer.json")
    found = reducers.catalog(str(tmp_path))
    assert "fine" in found and "max_composite" in found and "bad" not in found


@pytest.mark.parametrize("text", ["not json", "[1, 2]", "", '{"name": "fine"'])
def test_a_manifest_that_is_not_a_json_object_is_refused(tmp_path: Path, text: str) -> None:
    (tmp_path / "reducer.json").write_text(text)
    with pytest.raises(ValueError, match=r"reducer\.json"):
        reducers.load(tmp_path / "reducer.json")


def test_only_regular_files_inside_the_output_folder_are_published(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(f"""
        import json, os, pathlib, sys
        out = pathlib.Path(json.load(open(sys.argv[1]))["outputs_dir"])
        (out / "ok.tif").write_bytes(b"fine")
        (out / "deep" / "er").mkdir(parents=True)
        (out / "deep" / "er" / "nested.tif").write_bytes(b"nested")
        (out / "a name with spaces, ü and ; | $(x).tif").write_bytes(b"odd but ours")
        (out / "notes.txt").write_text("not in the manifest's patterns")
        os.symlink("/etc/hostname", out / "link.tif")
        os.symlink("/etc", out / "etc.tif")
        os.symlink("/etc", out / "deep" / "etc")
        os.mkfifo(out / "fifo.tif")
        refused = 0
        for target in [out / ".." / "escape.tif", pathlib.Path({str(tmp_path)!r}) / "escape.tif"]:
            try:
                target.write_bytes(b"escaped")
            except PermissionError:
                refused += 1
        print(refused)
    """))
    reducer = reducers.Reducer(name="hostile", argv=(sys.executable, str(program), "{task}"), here=tmp_path,
                               outputs=("*.tif",))
    made = run_program(reducer, [], tmp_path / "run", {"args": {}})
    assert made.result.exit_code == 0, (made.folder / "stderr.txt").read_text()
    assert (made.folder / "stdout.txt").read_text().strip() == "2"
    outputs = tmp_path / "run" / "outputs"
    assert sorted(str(p.relative_to(outputs)) for p in made.outputs) == sorted(
        ["ok.tif", "deep/er/nested.tif", "a name with spaces, ü and ; | $(x).tif"])
    assert not list(tmp_path.rglob("escape.tif"))


@pytest.mark.parametrize("link", [False, True])
def test_a_programs_progress_reaches_its_stage_and_its_file_is_only_read_as_its_own(
        tmp_path: Path, link: bool) -> None:
    # the program says the share of its work done by rewriting its progress file; made a
    # link to a file outside its folders (which says 0.9), it is not followed
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("0.9\n")
    program = tmp_path / "paced.py"
    program.write_text(textwrap.dedent(f"""
        import json, os, sys, time
        path = json.load(open(sys.argv[1]))["progress_file"]
        if {link!r}:
            os.symlink({str(elsewhere)!r}, path)
            time.sleep(1.2)
        else:
            for step in range(1, 5):
                time.sleep(0.3)
                with open(path + ".new", "w") as f:
                    f.write(f"{{step / 4}}\\n")
                os.replace(path + ".new", path)
            time.sleep(0.3)
    """))
    reducer = reducers.Reducer(name="paced", argv=(sys.executable, str(program), "{task}"), here=tmp_path,
                               outputs=("*.tif",))
    said: list[float] = []
    made = run_program(reducer, [], tmp_path / "run", {"args": {}}, on_progress=said.append)
    assert made.result.exit_code == 0, (made.folder / "stderr.txt").read_text()
    if link:
        assert said == []
    else:
        assert said == sorted(said) and {0.25, 0.5, 0.75, 1.0} <= set(said), said

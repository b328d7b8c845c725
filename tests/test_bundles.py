"""Reducers scientists upload: a bundle is refused whole, with a message naming the problem
and nothing stored, for every way an archive can reach outside itself or lie about itself;
a valid one is stored content-addressed and versioned; a compiled C reducer and a Python one
are uploaded and run end to end by real workers, which fetch each bundle once, check it and
keep it in their cache; the job keeps the exact digest it ran. One uploaded under the name of
openEO's UDF bundles is run and published as any program, never taken for a UDF."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bagpipe.manage import pack
from bagpipe.planetary import Planetary
from pipeline.failures import FailureClass, StageFailure
from pipeline.lifecycle import jobs
from pipeline.reduction import bundlecache, bundles, udf
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web import identity, registry
from pipeline.web.api import create_app
from tests.conftest import make_user, on_stac, running_control, running_workers, signed, wait_for
from tests.test_reduction import GRID, REGION, SPAN, outputs_of, reduction_row, tiles_of

MEAN_PY = """
import json, sys
import numpy as np
import rasterio
sys.path.insert(0, sys.argv[2])
from lib.helpers import valid_mean
task = json.load(open(sys.argv[1]))
means = {}
for date, path in zip(task["dates"], task["inputs"]):
    with rasterio.open(path) as src:
        means[date] = valid_mean(src.read(1), src.nodata)
json.dump({"means": means, "note": task["args"].get("note")}, open(task["outputs_dir"] + "/summary.json", "w"))
print(len(means), "dates")
"""
HELPERS_PY = """
import numpy as np
def valid_mean(a, nodata):
    keep = a != nodata if nodata is not None else np.ones(a.shape, bool)
    return float(a[keep].mean()) if keep.any() else None
"""
COUNT_C = r"""
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
int main(int argc, char **argv) {
    DIR *d = opendir(argv[1]); struct dirent *e; long files = 0, size = 0; char path[4096]; struct stat st;
    if (!d) return 2;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 4 || strcmp(e->d_name + n - 4, ".bin")) continue;
        snprintf(path, sizeof path, "%s/%s", argv[1], e->d_name);
        if (stat(path, &st) == 0) { files++; size += st.st_size; }
    }
    closedir(d);
    snprintf(path, sizeof path, "%s/count.txt", argv[2]);
    FILE *out = fopen(path, "w");
    if (!out) return 3;
    fprintf(out, "%ld files, %ld bytes\n", files, size);
    return fclose(out) ? 4 : 0;
}
"""


def python_reducer(folder: Path, name: str = "mean") -> Path:
    (folder / "lib").mkdir(parents=True)
    (folder / "lib" / "__init__.py").write_text("")
    (folder / "lib" / "helpers.py").write_text(HELPERS_PY)
    (folder / "mean.py").write_text(MEAN_PY)
    (folder / "reducer.json").write_text(json.dumps({
        "name": name, "description": "mean of the valid pixels per date",
        "argv": ["{python}", "{here}/mean.py", "{task}", "{here}"], "outputs": ["*.json"], "timeout_s": 120}))
    return folder


def c_reducer(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "count.c").write_text(COUNT_C)
    subprocess.run(["cc", "-O2", "-Wall", "-o", str(folder / "count"), str(folder / "count.c")], check=True)
    (folder / "reducer.json").write_text(json.dumps({
        "name": "count", "description": "counts its ENVI inputs (C)", "argv": ["{here}/count", "{inputs}", "{outputs}"],
        "input_format": "ENVI", "outputs": ["*.txt"], "limits": {"memory_mb": 256, "processes": 4}}))
    return folder


def archive(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return raw.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


GZIP = {"content-type": "application/gzip"}
GOOD = json.dumps({"name": "fine", "argv": ["{python}", "{here}/fine.py", "{task}"]}).encode()


def with_manifest(*extra: tuple[tarfile.TarInfo, bytes], manifest: bytes = GOOD) -> bytes:
    return archive([(member("reducer.json"), manifest), (member("fine.py"), b"print('ok')"), *extra])


def big_zeros(size: int) -> bytes:
    return bytes(size)


REFUSED = [
    # (what, upload, status, words the message must hold, the field it names)
    ("a '..' path", with_manifest((member("../escape.sh"), b"x")), 422, "'..'", "../escape.sh"),
    ("a nested '..' path", with_manifest((member("lib/../../escape"), b"x")), 422, "'..'", "lib/../../escape"),
    ("an absolute path", with_manifest((member("/etc/cron.d/x"), b"x")), 422, "absolute", "/etc/cron.d/x"),
    ("a symbolic link", with_manifest((member("passwd", tarfile.SYMTYPE, link="/etc/passwd"), b"")), 422,
     "symbolic link", "passwd"),
    ("a hard link", with_manifest((member("h", tarfile.LNKTYPE, link="fine.py"), b"")), 422, "hard link", "h"),
    ("a device", with_manifest((member("sda", tarfile.BLKTYPE), b"")), 422, "device", "sda"),
    ("a character device", with_manifest((member("tty", tarfile.CHRTYPE), b"")), 422, "device", "tty"),
    ("a FIFO", with_manifest((member("pipe", tarfile.FIFOTYPE), b"")), 422, "FIFO", "pipe"),
    ("an oversize member", lambda: with_manifest((member("huge.bin"), big_zeros(bundles.MAX_MEMBER + 1))), 422,
     "per file", "huge.bin"),
    ("too much in all", lambda: with_manifest(*[(member(f"part{i}.bin"), big_zeros(bundles.MAX_MEMBER))
                                                for i in range(2)]), 422, "add up to", "part1.bin"),
    ("a gzip bomb", lambda: gzip.compress(big_zeros(bundles.MAX_UNPACKED + 1024 * 1024), 1), 422,
     "unpacks to more", "archive"),
    ("a name twice", with_manifest((member("fine.py"), b"again")), 422, "twice", "fine.py"),
    ("no manifest", archive([(member("fine.py"), b"x")]), 422, "no reducer.json", "reducer.json"),
    ("a manifest that is not JSON", with_manifest(manifest=b"{name: fine"), 422, "reducer.json", "reducer.json"),
    ("a secret-looking env name", with_manifest(manifest=json.dumps({
        "name": "fine", "argv": ["{python}", "{here}/fine.py"], "env": {"AWS_SECRET_ACCESS_KEY": "x"}}).encode()),
     422, "no secrets", "reducer.json"),
    ("a shell line for argv", with_manifest(manifest=json.dumps({"name": "fine", "argv": "python fine.py; rm -rf ~"})
                                            .encode()), 422, "argv", "reducer.json"),
    ("a program not in the bundle", with_manifest(manifest=json.dumps({
        "name": "fine", "argv": ["{here}/missing", "{task}"]}).encode()), 422, "not in the bundle", "argv"),
    ("a relative argv[0]", with_manifest(manifest=json.dumps({"name": "fine", "argv": ["bin/run"]}).encode()),
     422, "argv[0]", "argv"),
    ("the network asked for", with_manifest(manifest=json.dumps({
        "name": "fine", "argv": ["{python}", "{here}/fine.py"], "network": True}).encode()), 422,
     "an uploaded reducer gets no network", "network"),
    ("hosts listed", with_manifest(manifest=json.dumps({
        "name": "fine", "argv": ["{python}", "{here}/fine.py"], "network": {"hosts": ["example.org:443"]}}).encode()),
     422, "an uploaded reducer gets no network", "network"),
    ("not an archive", b"just some text", 422, "not a tar archive", "archive"),
    ("a broken gzip", b"\x1f\x8b\x08\x00garbage", 422, "gzip", "archive"),
    ("the name of an installed reducer", with_manifest(manifest=json.dumps({
        "name": "snow_fraction", "argv": ["{python}", "{here}/fine.py"]}).encode()), 409, "installed",
     "reducer.json:name"),
]


@pytest.fixture
def api(settings: Settings, clients: Clients) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        yield client


def nothing_stored(clients: Clients) -> bool:
    return not list(clients.bundles.list_blobs()) and not list(clients.reducers.list_entities())


@pytest.mark.parametrize(("what", "upload", "status", "words", "field"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_bad_bundle_is_refused_naming_the_problem_and_nothing_is_stored(
    api: TestClient, clients: Clients, what: str, upload: bytes | Callable[[], bytes], status: int, words: str,
    field: str
) -> None:
    token = make_user(clients, "alice")
    content = upload() if callable(upload) else upload
    response = api.post("/api/reducers", content=content, headers=signed(token) | GZIP)
    assert response.status_code == status, (what, response.text)
    assert words in response.json()["detail"] and response.json()["field"] == field, response.json()
    assert nothing_stored(clients), what


def test_a_multipart_upload_is_held_to_the_same_checks(api: TestClient, clients: Clients) -> None:
    token = make_user(clients, "alice")
    files = [("files", ("reducer.json", GOOD)), ("files", ("../fine.py", b"x"))]
    response = api.post("/api/reducers", files=files, headers=signed(token))
    assert response.status_code == 422 and "'..'" in response.json()["detail"]
    assert nothing_stored(clients)
    too_big = api.post("/api/reducers", content=b"x" * (bundles.MAX_UPLOAD + 1),
                       headers=signed(token) | GZIP)
    assert too_big.status_code == 413 and nothing_stored(clients)


def test_the_digest_is_the_content_s_and_pushing_makes_versions(
    api: TestClient, clients: Clients, tmp_path: Path
) -> None:
    token = make_user(clients, "alice")
    folder = python_reducer(tmp_path / "mean")
    first = bundles.from_tar(pack(folder))
    # the same files under a top folder, in another order, with other times and owners: one digest
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for path in sorted(folder.rglob("*"), reverse=True):
            if path.is_file():
                info = tar.gettarinfo(str(path), arcname=f"mean/{path.relative_to(folder)}")
                info.mtime, info.uid, info.uname = 12345, 999, "someone"
                tar.addfile(info, path.open("rb"))
    assert bundles.from_tar(raw.getvalue()).digest == first.digest == bundles.from_tar(first.archive()).digest

    # and a bundle over the API's 64 KiB request limit is taken: the upload has its own
    (folder / "weights.bin").write_bytes(np.random.default_rng(1).bytes(200_000))
    pushed = api.post("/api/reducers", content=pack(folder), headers=signed(token) | GZIP)
    assert pushed.status_code == 201 and pushed.json()["version"] == 1 and pushed.json()["new"], pushed.text
    again = api.post("/api/reducers", content=pack(folder), headers=signed(token) | GZIP)
    assert again.json()["version"] == 1 and not again.json()["new"]  # unchanged: no new version
    (folder / "mean.py").write_text(MEAN_PY + "\n# v2\n")
    second = api.post("/api/reducers", files=[("files", (str(p.relative_to(folder)), p.read_bytes()))
                                              for p in sorted(folder.rglob("*")) if p.is_file()],
                      headers=signed(token))
    assert second.status_code == 201 and second.json()["version"] == 2, second.text
    assert second.json()["digest"] != pushed.json()["digest"]
    blobs = sorted(b.name for b in clients.bundles.list_blobs())
    assert blobs == sorted(names.bundle_blob(r.json()["digest"]) for r in (pushed, second))
    shown = api.get("/api/reducers/alice/mean", headers=signed(token)).json()
    assert [v["version"] for v in shown["versions"]] == [1, 2]
    alice = identity.get_user(clients, "alice")
    assert alice is not None
    assert registry.resolve(clients, alice, "mean").digest == second.json()["digest"]
    assert registry.resolve(clients, alice, "mean@1").digest == pushed.json()["digest"]
    assert registry.resolve(clients, alice, "alice/mean@2").version == 2


def alices_stack(settings: Settings, planetary: Planetary, tmp_path: Path) -> tuple[Settings, Clients, str]:
    """A deployment on the imitation's STAC API with its bundle cache in ``tmp_path``, its
    storage made, and alice's token."""
    mine = on_stac(settings, planetary, bundle_cache=str(tmp_path / "cache"))
    clients = Clients(mine)
    clients.ensure_resources()
    return mine, clients, make_user(clients, "alice")


def test_a_c_and_a_python_reducer_uploaded_and_run_end_to_end(
    settings: Settings, planetary: Planetary, tmp_path: Path
) -> None:
    mine, clients, token = alices_stack(settings, planetary, tmp_path)
    made = {}
    with TestClient(create_app(mine)) as api:
        for folder in (python_reducer(tmp_path / "mean"), c_reducer(tmp_path / "count")):
            pushed = api.post("/api/reducers", content=pack(folder),
                              headers=signed(token) | GZIP)
            assert pushed.status_code == 201, pushed.text
            made[pushed.json()["name"]] = pushed.json()
        body = {"region": REGION, "grid": GRID, **SPAN, "products": ["MOD10A2"]}
        answers = {name: api.post("/api/jobs", json=body | {"reducer": {"name": name, "args": {"note": name}}},
                                  headers=signed(token)) for name in made}
        assert all(a.status_code == 202 for a in answers.values()), {n: a.text for n, a in answers.items()}
        submitted = {name: answer.json()["job"] for name, answer in answers.items()}
        with running_control(mine), running_workers(mine, 1, slots=2):
            for job in submitted.values():
                wait_for(lambda job=job: jobs.get(clients, job).state in ("SUCCEEDED", "FAILED"), 240, "the job")
        shown = api.get("/api/reducers/alice/count", headers=signed(token)).json()
    for name, job in submitted.items():
        status = jobs.status(clients, job)
        assert status["state"] == "SUCCEEDED", status
        row = reduction_row(clients, job)
        # the job ran the exact bundle it resolved to, and says so
        assert row.parameters()["bundle"] == made[name]["digest"] == status["program"]["digest"]
    outputs = outputs_of(clients, reduction_row(clients, submitted["count"]))
    assert outputs["count.txt"].decode() == f"3 files, {3 * 100 * 100} bytes\n"
    summary = json.loads(outputs_of(clients, reduction_row(clients, submitted["mean"]))["summary.json"])
    stack = tiles_of(clients, submitted["mean"])
    assert summary["note"] == "mean" and len(summary["means"]) == 3
    expected = sorted(float(t[t != 255].mean()) for t in stack)
    assert sorted(summary["means"].values()) == pytest.approx(expected)
    assert shown["versions"][0]["jobs"] == [submitted["count"]]
    # each bundle fetched once into the worker's cache: one read-only folder per digest
    cache = tmp_path / "cache"
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == sorted(m["digest"] for m in made.values())
    program = cache / made["count"]["digest"] / "count"
    assert program.stat().st_mode & 0o777 == 0o555


def test_a_reducer_uploaded_under_the_name_of_openeos_udf_runs_in_every_job_as_any_program(
    settings: Settings, planetary: Planetary, tmp_path: Path
) -> None:
    """An openEO UDF's outputs are kept in tiles, content-addressed, and found made by the next
    job; a reducer uploaded under the name the UDF's bundle has (``run_udf``) is a program as
    any other: its files published to each job's products, run by each job, its arguments its
    own."""
    mine, clients, token = alices_stack(settings, planetary, tmp_path)
    submitted = {}
    with TestClient(create_app(mine)) as api:
        pushed = api.post("/api/reducers", content=pack(python_reducer(tmp_path / "named", name=udf.NAME)),
                          headers=signed(token) | GZIP)
        assert pushed.status_code == 201, pushed.text
        body = {"region": REGION, "grid": GRID, **SPAN, "products": ["MOD10A2"]}
        with running_control(mine), running_workers(mine, 1, slots=2):
            for note in ("first", "second"):  # one after the other: the second would find the first's, were it kept
                answer = api.post("/api/jobs", json=body | {"reducer": {"name": udf.NAME, "args": {"note": note}}},
                                  headers=signed(token))
                assert answer.status_code == 202, answer.text
                job = submitted[note] = answer.json()["job"]
                wait_for(lambda job=job: jobs.get(clients, job).state in ("SUCCEEDED", "FAILED"), 240, "the job")
    for note, job in submitted.items():
        row = reduction_row(clients, job)
        assert row.status == "SUCCEEDED" and "udf" not in row.parameters(), (note, row.status)  # ran, not CACHED
        assert json.loads(outputs_of(clients, row)["summary.json"])["note"] == note  # in the job's products


def test_the_cache_fetches_a_bundle_once_for_concurrent_slots_and_checks_it(
    clients: Clients, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_user(clients, "alice")
    alice = identity.get_user(clients, "alice")
    assert alice is not None
    bundle = bundles.from_tar(pack(python_reducer(tmp_path / "mean")))
    digest = registry.push(clients, alice, bundle)["digest"]
    mine = clients.settings.with_(bundle_cache=str(tmp_path / "cache"))
    fetched: list[str] = []
    real_fetch = bundlecache.fetch

    def counted(clients: Clients, digest: str) -> bytes:
        fetched.append(digest)
        time.sleep(0.2)  # a slow download: the others must wait for it, not start their own
        return real_fetch(clients, digest)

    monkeypatch.setattr(bundlecache, "fetch", counted)
    found: list[Path] = []
    threads = [threading.Thread(target=lambda: found.append(bundlecache.folder_for(Clients(mine), digest)))
               for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert fetched == [digest] and len(set(found)) == 1 and len(found) == 6
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()) == [digest]  # no half copies
    reducer = bundlecache.reducer_for(Clients(mine), digest)
    assert reducer.name == "mean" and reducer.here == tmp_path / "cache" / digest
    # a cached copy someone changed is never run again: it is fetched anew
    program = tmp_path / "cache" / digest / "mean.py"
    program.chmod(0o644)
    program.write_text("import os; os.system('curl evil')")
    assert bundlecache.folder_for(Clients(mine), digest) == tmp_path / "cache" / digest
    assert fetched == [digest, digest] and program.read_text() == MEAN_PY
    assert bundles.digest_of(tmp_path / "cache" / digest) == digest

    # a stored bundle that does not match its digest is a corrupt read, never run
    other = bundles.from_tar(pack(c_reducer(tmp_path / "count")))
    clients.transfers.upload(clients.bundles, names.bundle_blob("f" * 64), other.archive(), "application/gzip")
    with pytest.raises(StageFailure) as caught:
        bundlecache.folder_for(Clients(mine), "f" * 64)
    assert caught.value.failure is FailureClass.CORRUPT_BLOB
    with pytest.raises(StageFailure) as gone:
        bundlecache.folder_for(Clients(mine), "e" * 64)
    assert gone.value.failure is FailureClass.USER_CODE and "no longer stored" in str(gone.value)
    assert not (tmp_path / "cache" / ("f" * 64)).exists()


def test_a_cache_another_user_could_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(RuntimeError, match="writable by it alone"):
        bundlecache.root_of(str(shared))

"""``bagpipe up`` as a user runs it: its own Azurite in its home folder, submit and watch
from the command line, Ctrl-C stops everything, and a restarted stack still has the job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from bagpipe.azurite import Azurite
from tests.conftest import wait_for

CLI = [sys.executable, "-m", "bagpipe.cli"]


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """The ``bagpipe up`` processes a test starts, stopped at its end if it failed before
    stopping them (Ctrl-C, as a user stops one: the stack stops what it started)."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()


def start_up(home: Path, started: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    process = subprocess.Popen([*CLI, "up", "--home", str(home), "--workers", "1"], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    started.append(process)
    wait_for(lambda: (home / "stack.json").exists() or process.poll() is not None, 60, "bagpipe up")
    assert process.poll() is None, process.stdout.read() if process.stdout else ""
    return process


def stop_up(process: subprocess.Popen[str], home: Path) -> str:
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=90)
    assert process.returncode == 0, output
    assert not (home / "stack.json").exists()
    return output


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.timeout(900)  # a dozen command lines, each a new interpreter: minutes on a busy machine
def test_up_submit_watch_stop_and_restart(tmp_path: Path, started: list[subprocess.Popen[str]]) -> None:
    from typer.testing import CliRunner

    from bagpipe.cli import app

    home = tmp_path / ".bagpipe"  # as `bagpipe up` names it, in the folder it ran in
    env = {k: v for k, v in os.environ.items() if not k.startswith("BAGPIPE_")}
    up = start_up(home, started)
    assert len(children_of(up.pid)) >= 2, "azurite and a worker run under bagpipe up"
    submitted = subprocess.run(
        [*CLI, "submit", "--home", str(home), "--tiles", "h09v05,h08v05", "--start", "2022-03-01",
         "--end", "2022-03-20", "--product", "MOD10A2", "--email", "me@example.org", "--label", "cli"],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job = submitted.stdout.strip().splitlines()[-1]
    watched = subprocess.run([*CLI, "watch", job, "--home", str(home)], capture_output=True, text=True,
                             env=env, timeout=120)
    assert watched.returncode == 0 and "SUCCEEDED" in watched.stdout, watched.stdout
    # without a terminal, plain lines (the bar printed nothing until the end)
    assert f"{job} SUCCEEDED 6/6 succeeded=6" in watched.stdout.splitlines(), watched.stdout
    mail = list((home / "mail").glob("*.eml"))
    assert len(mail) == 1 and job in mail[0].read_text()
    refused = subprocess.run([*CLI, "submit", "--home", str(home), "--tiles", "h99v99", "--start", "2022-03-01",
                              "--end", "2022-03-20", "--product", "MOD10A2"], capture_output=True, text=True, env=env)
    assert refused.returncode == 1 and "region.tiles" in refused.stdout
    # a job whose reduction crashes: its status says why, and where the program's output is
    crash = tmp_path / "crash"
    crash.mkdir()
    (crash / "reducer.json").write_text(json.dumps({"name": "crash", "argv": [
        "{python}", "-c", "import sys; print('boom', file=sys.stderr); raise SystemExit(3)"]}))
    pushed = subprocess.run([*CLI, "reducers", "push", str(crash), "--home", str(home)], capture_output=True,
                            text=True, env=env, timeout=60)
    assert pushed.returncode == 0, pushed.stdout
    crashing = subprocess.run([*CLI, "submit", "--home", str(home), "--tiles", "h09v05", "--start", "2022-03-01",
                               "--end", "2022-03-08", "--product", "MOD10A2", "--reducer", "crash"],
                              capture_output=True, text=True, env=env, timeout=60)
    assert crashing.returncode == 0, crashing.stdout
    failed = crashing.stdout.strip().splitlines()[-1]
    watched = subprocess.run([*CLI, "watch", failed, "--home", str(home)], capture_output=True, text=True, env=env,
                             timeout=120)
    assert watched.returncode == 1 and "FAILED" in watched.stdout, watched.stdout  # `watch && results` stops here
    # watch and status say why, and how to read what the program wrote
    assert "exited with code 3" in watched.stdout and f"bagpipe logs {failed} " in watched.stdout, watched.stdout
    shown = subprocess.run([*CLI, "status", failed, "--home", str(home)], capture_output=True, text=True, env=env,
                           timeout=60)
    assert shown.returncode == 0 and "FAILED" in shown.stdout, shown.stdout
    assert "exited with code 3" in shown.stdout and f"bagpipe logs {failed} " in shown.stdout, shown.stdout
    task = shown.stdout.split(f"bagpipe logs {failed} ", 1)[1].split()[0]
    unset = {k: None for k in os.environ if k.startswith("BAGPIPE_")}
    listed = CliRunner().invoke(app, ["logs", failed, "--home", str(home)], env=unset)
    assert listed.exit_code == 0 and f"bagpipe logs {failed} TASK" in listed.stdout, listed.stdout
    read = CliRunner().invoke(app, ["logs", failed, task, "--home", str(home)], env=unset)
    assert read.exit_code == 0 and f"task {task} attempt 1 stderr.txt" in read.stdout, read.stdout
    assert "boom" in read.stdout and "attempt 2" in read.stdout, read.stdout  # each attempt's
    refused = CliRunner().invoke(app, ["logs", failed, "x1", "--home", str(home)], env=unset)
    assert refused.exit_code == 1 and "task: a task's number" in refused.stdout, refused.stdout
    # a second stack in the running one's home is refused, and leaves the first as it was
    state = {name: (home / name).read_text() for name in ("stack.json", "ports.json")}
    second = subprocess.run([*CLI, "up", "--home", str(home), "--workers", "0"], capture_output=True, text=True,
                            env=env, timeout=60)
    assert second.returncode == 1 and "runs in" in second.stdout and "Traceback" not in second.stdout, second.stdout
    assert {name: (home / name).read_text() for name in state} == state
    assert subprocess.run([*CLI, "status", job, "--home", str(home)], capture_output=True, env=env,
                          timeout=60).returncode == 0
    # from any folder, the command line finds the stack `bagpipe up` runs: below its home's
    # folder, and anywhere else (it said to start one)
    for folder in (tmp_path / "analysis", Path(tempfile.mkdtemp(prefix="bagpipe-elsewhere-"))):
        folder.mkdir(exist_ok=True)
        shown = subprocess.run([*CLI, "status", job], capture_output=True, text=True, env=env, cwd=folder, timeout=60)
        assert shown.returncode == 0 and "SUCCEEDED" in shown.stdout, shown.stdout
    children = children_of(up.pid)
    said = stop_up(up, home)
    gone = subprocess.run([*CLI, "status", job], capture_output=True, text=True, env=env, cwd=folder, timeout=60)
    assert gone.returncode == 1 and "no local stack runs" in gone.stdout and "--api" in gone.stdout, gone.stdout
    assert "HTTP Request:" not in said, said[-2000:]  # no line per request of the imitations' pass-through
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]

    # the jobs survive a restart of the stack (Azurite keeps them on disk in the home)
    again = start_up(home, started)
    try:
        shown = subprocess.run([*CLI, "status", job, "--json", "--home", str(home)], capture_output=True,
                               text=True, env=env, timeout=60)
        assert shown.returncode == 0, shown.stdout
        status = json.loads(shown.stdout)
        assert status["state"] == "SUCCEEDED" and status["counts"]["SUCCEEDED"] == 2 * 3
        shown = subprocess.run([*CLI, "status", job, "--home", str(home)], capture_output=True, text=True, env=env,
                               timeout=60)
        assert shown.returncode == 0 and "workers" in shown.stdout, shown.stdout  # who ran it, and how
        assert sum(w["attempts"] for w in status["workers"]) == 2 * 3
        # the first stack's workers stopped with it: not among the workers the monitor compares now
        assert {w["state"] for w in status["workers"]} == {"stopped"} and all(
            w["worker"][:40] in shown.stdout for w in status["workers"])
    finally:
        stop_up(again, home)


def test_mistakes_on_the_command_line_are_named_not_traced(tmp_path: Path) -> None:
    """What a scientist mistypes, and an API that is not there, each end in a message that
    names it (exit code 1), never a traceback; nothing is sent or written."""
    from typer.testing import CliRunner

    from bagpipe.cli import app
    from bagpipe.modis_world import REAL_DATA
    from bagpipe.serving import free_port

    runner = CliRunner()
    unset = {k: None for k in os.environ if k.startswith("BAGPIPE_")}
    nowhere = ["--api", f"http://127.0.0.1:{free_port()}", "--key", "bgp_x_y"]  # an API that would be refused
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    stale = tmp_path / "stale"  # a stack's home whose stack died without cleaning up
    stale.mkdir()
    ended = subprocess.Popen(["true"])
    ended.wait()
    (stale / "stack.json").write_text(json.dumps({"api": "http://127.0.0.1:1", "pid": ended.pid}))
    (stale / "api-key").write_text("bgp_x_y")
    snow = REAL_DATA / "MOD10A2.A2022033.h09v05.061.2022042050729_Maximum_Snow_Extent.tif"
    cases = {
        "--bbox": ["submit", "--bbox", "-112,34,-108,abc", *nowhere],
        "--layer": ["submit", "--tiles", "h09v05", "--layer", "MOD13A1", *nowhere],
        "--bbox or --tiles": ["submit", "--bbox", "-112,34,-108,35", "--tiles", "h09v05", *nowhere],
        "bad.json": ["submit", "--file", str(tmp_path / "bad.json"), *nowhere],
        "a JSON object": ["submit", "--file", str(tmp_path / "list.json"), *nowhere],
        "did not answer": ["status", "j1", *nowhere],
        "is its stack up": ["jobs", "--api", "notaurl", "--key", "bgp_x_y"],
        "has stopped": ["status", "j1", "--home", str(stale)],
        "--bounds": ["run-stage", "reproject", "--input", str(snow), "--out", str(tmp_path / "x.tif"),
                     "--bounds", "-105", "34", "-106", "35"],
        "is a MOD10A2 granule": ["run-stage", "reproject", "--input", str(snow), "--out", str(tmp_path / "x.tif"),
                                 "--bounds", "-107", "35", "-106", "36", "--product", "MOD13A1"],
        "do not say one product": ["run-stage", "reproject", "--input", str(tmp_path / "bad.json"), "--out",
                                   str(tmp_path / "x.tif"), "--bounds", "-107", "35", "-106", "36"],
        "--dst-crs": ["run-stage", "reproject", "--input", str(snow), "--out", str(tmp_path / "x.tif"),
                      "--dst-crs", "EPSG:4978", "--bounds", "0", "0", "1", "1"],  # geocentric
    }
    for said, args in cases.items():
        found = runner.invoke(app, args, env=unset)
        assert found.exit_code == 1 and isinstance(found.exception, SystemExit), (args, found.exception)
        assert said in found.stdout and "Traceback" not in found.stdout, (args, found.stdout)
    assert not (tmp_path / "x.tif").exists()


def test_watchs_bar_keeps_its_width_and_says_the_time_left_at_80_columns() -> None:
    """The counts beside the bar squeezed it to two characters at 80 columns."""
    import io
    import re

    from rich.console import Console
    from rich.progress import Progress

    from bagpipe.cli import BAR_WIDTH, progress_columns

    screen = io.StringIO()
    narrow = Console(width=80, file=screen, force_terminal=True, color_system=None)
    progress = Progress(*progress_columns(), console=narrow, auto_refresh=False)
    progress.add_task("RUNNING", total=7200, completed=3600,
                      detail="succeeded=3000 cached=400 running=150 queued=50 failed=0 pending=3600")
    narrow.print(progress.get_renderable())
    (line,) = screen.getvalue().rstrip("\n").splitlines()
    # half done: half the bar drawn (the rest is blank without colours); the time left not known
    # at the first look; the counts cut, not the bar
    assert re.fullmatch(rf"RUNNING +━{{{BAR_WIDTH // 2}}} {{{BAR_WIDTH - BAR_WIDTH // 2}}} +3600/7200 +--:-- "
                        r"succeeded=3000 cached\S* *", line), line


def test_help_is_plain_text_and_flags_take_no_value() -> None:
    """``bagpipe --help`` and a command's: no reStructuredText markup, and a flag shown as
    the flag it is (it was ``--help <bool>``, as if it took a value)."""
    from typer.testing import CliRunner

    from bagpipe.cli import app

    runner = CliRunner()
    for args in ([], ["status"], ["submit"], ["reducers"], ["reducers", "share"], ["run-stage"]):
        shown = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "80"})
        assert shown.exit_code == 0, shown.stdout
        assert "``" not in shown.stdout and "<bool>" not in shown.stdout, shown.stdout
        assert "--help  " in shown.stdout or "--help\n" in shown.stdout, shown.stdout


def test_run_stage_reproject_reads_the_product_and_layer_from_a_granules_name(tmp_path: Path) -> None:
    """A granule's file is named for its product (and a layer's GeoTIFF for its layer):
    without --product it is read as what it is (a MOD13A1 file was read as MOD10A2 and
    failed, "Maximum_Snow_Extent is int16")."""
    import rasterio
    from typer.testing import CliRunner

    from bagpipe.cli import app
    from bagpipe.modis_world import REAL_DATA

    runner = CliRunner()
    vegetation = REAL_DATA / "MOD13A1.A2022081.h09v05.006.2022101145817_BR_B06_cropped.TIF"
    cover = REAL_DATA / "MOD10A2.A2022033.h09v05.061.2022042050729_Eight_Day_Snow_Cover.tif"
    for source, product, layer in ((vegetation, "MOD13A1", "500m_16_days_NDVI"),
                                   (cover, "MOD10A2", "Eight_Day_Snow_Cover")):
        out = tmp_path / f"{product}.tif"
        done = runner.invoke(app, ["run-stage", "reproject", "--input", str(source), "--out", str(out),
                                   "--res", "0.01", "--bounds", "-107", "35", "-106", "36"])
        assert done.exit_code == 0, done.stdout
        with rasterio.open(out) as written:
            assert (written.tags()["PRODUCT"], written.tags()["LAYER"]) == (product, layer)


def test_run_stage_reproject_then_reduce_with_no_azure(tmp_path: Path) -> None:
    """A scientist debugging on a laptop: the stages workers run, on local files only."""
    from rio_cogeo.cogeo import cog_validate

    from bagpipe.modis_world import REAL_DATA, cog, granule_name
    from pipeline.modis.products import CATALOG

    snow = REAL_DATA / "MOD10A2.A2022033.h09v05.061.2022042050729_Maximum_Snow_Extent.tif"
    earlier = tmp_path / (granule_name(CATALOG["MOD10A2"], "h09v05", date(2022, 1, 25)) + "_Maximum_Snow_Extent.tif")
    earlier.write_bytes(cog(earlier.name.split("_", 1)[0], "Maximum_Snow_Extent"))  # the period before, synthesized
    env = {k: v for k, v in os.environ.items() if not k.startswith(("Bagpipe", "BAGPIPE"))}
    tiles = []
    for source in (snow, earlier):  # a tile's two dates
        tile = tmp_path / f"{source.name[9:17]}.tif"
        subprocess.run([*CLI, "run-stage", "reproject", "--input", str(source), "--out", str(tile), "--res", "0.01",
                        "--bounds", "-107", "35", "-106", "36"], check=True, env=env, capture_output=True)
        tiles += ["--input", str(tile)]
    outside = subprocess.run([*CLI, "run-stage", "reproject", "--input", str(snow), "--out", str(tmp_path / "o.tif"),
                              "--bounds", "-111", "34", "-110", "35"], env=env, capture_output=True, text=True)
    assert outside.returncode == 0 and "no valid pixel" in outside.stdout, outside.stdout  # h08v05's, not h09v05's
    mixed = subprocess.run([*CLI, "run-stage", "reduce", "--reducer", "snow_fraction", *tiles, "--input",
                            str(tmp_path / "o.tif"), "--out", str(tmp_path / "mixed")], env=env, capture_output=True,
                           text=True)
    assert mixed.returncode == 1 and "another tile" in mixed.stdout, mixed.stdout  # a reduction is one tile's
    done = subprocess.run([*CLI, "run-stage", "reduce", "--reducer", "snow_fraction", *tiles,
                           "--out", str(tmp_path / "result")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (tmp_path / "result").iterdir()) == ["snow_fraction.png", "snow_fraction.tif"]
    assert cog_validate(str(tmp_path / "result" / "snow_fraction.tif"), strict=True, quiet=True)[0]  # as a worker's
    assert "2 periods" in done.stdout
    crash = tmp_path / "crash"
    crash.mkdir()
    manifest = {"name": "crash", "argv": ["{python}", "-c", "raise SystemExit(5)"]}
    (crash / "reducer.json").write_text(json.dumps(manifest))
    failed = subprocess.run([*CLI, "run-stage", "reduce", "--reducer", "crash", "--reducers-path", str(tmp_path),
                             *tiles, "--out", str(tmp_path / "x")], env=env, capture_output=True, text=True)
    assert failed.returncode == 1 and "exited with code 5" in failed.stdout
    # a reducer's own folder, given the task.json a worker gives: the tile's product, layer,
    # place, its layers by name, and inputs staged under a worker's names
    show = tmp_path / "show"
    show.mkdir()
    manifest = {"name": "show", "argv": ["{python}", "-c", "import shutil, sys; shutil.copy(sys.argv[1], sys.argv[2])",
                                         "{task}", "{outputs}/task.json"]}
    (show / "reducer.json").write_text(json.dumps(manifest))
    shown = subprocess.run([*CLI, "run-stage", "reduce", "--reducer", str(show), *tiles, "--arg", "k=3",
                            "--out", str(tmp_path / "shown")], env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stdout
    task = json.loads((tmp_path / "shown" / "task.json").read_text())
    assert {k: task[k] for k in ("product", "layer", "tile", "crs", "args", "dates")} == {
        "product": "MOD10A2", "layer": "Maximum_Snow_Extent", "tile": "x-0107y+0035", "crs": "EPSG:4326",
        "args": {"k": 3}, "dates": ["2022-01-25", "2022-02-02"]}, task
    assert [float(v) for v in task["bounds"].split(",")] == pytest.approx([-107, 35, -106, 36])
    assert list(task["layers"]) == ["Maximum_Snow_Extent"] and list(task["by_input"]) == ["MOD10A2.Maximum_Snow_Extent"]
    assert [Path(p).name for p in task["inputs"]] == ["MOD10A2.2022-01-25.x-0107y+0035.tif",
                                                      "MOD10A2.2022-02-02.x-0107y+0035.tif"]


def test_accounts_and_reducers_from_the_command_line(azurite: Azurite, tmp_path: Path) -> None:
    """The admin of a local stack adds a scientist and makes their token; the scientist
    pushes a reducer, lists, shows, shares and deletes it; a revoked token is refused. (The
    CLI's own app, run in this process: each command as a user types it, minus the start-up.)"""
    from typer.testing import CliRunner

    from bagpipe.cli import app
    from bagpipe.stack import LocalStack
    from tests.test_bundles import python_reducer

    home = tmp_path / "home"
    runner = CliRunner()
    unset = {k: None for k in os.environ if k.startswith("BAGPIPE_")}

    def cli(*args: str, key: str | None = None) -> Any:
        found = runner.invoke(app, [*args, "--home", str(home), *(["--key", key] if key else [])], env=unset)
        found.returncode = found.exit_code
        return found

    with LocalStack(home, workers=0, connection=azurite.connection_string, namespace="clitest"):
        assert "admin (admin" in cli("whoami").stdout  # the stack's admin, from its token file
        added = cli("users", "add", "grace", "--email", "grace@example.org")
        assert added.returncode == 0 and "added grace (scientist" in added.stdout, added.stdout + added.stderr
        assert cli("users", "add", "bob", "--email", "bob@example.org").returncode == 0
        made = cli("tokens", "create", "--user", "grace", "--label", "cli")
        token = made.stdout.strip().splitlines()[-1]
        assert made.returncode == 0 and token.startswith("bgp_"), made.stdout
        assert "grace (scientist" in cli("whoami", key=token).stdout
        refused = cli("users", "add", "eve", "--email", "eve@example.org", key=token)
        assert refused.returncode == 1 and "only an admin" in refused.stdout

        folder = python_reducer(tmp_path / "mean")
        pushed = cli("reducers", "push", str(folder), key=token)
        assert pushed.returncode == 0 and pushed.stdout.strip().endswith("grace/mean@1"), pushed.stdout
        assert "unchanged: still grace/mean@1" in cli("reducers", "push", str(folder), key=token).stdout
        (folder / "evil").symlink_to("/etc/passwd")
        bad = cli("reducers", "push", str(folder), key=token)
        assert bad.returncode == 1 and "symbolic link" in bad.stdout
        (folder / "evil").unlink()
        listed = cli("reducers", "list", key=token)
        assert "mean" in listed.stdout and "snow_fraction" in listed.stdout
        shared = cli("reducers", "share", "mean", "--with", "bob", key=token)
        assert shared.returncode == 0 and "shared with bob" in shared.stdout, shared.stdout
        shown = json.loads(cli("reducers", "show", "mean", "--json", key=token).stdout)
        assert [v["version"] for v in shown["versions"]] == [1] and shown["sharing"]["users"] == ["bob"]
        assert "private" not in cli("reducers", "share", "mean", "--private", key=token).stdout
        absent = cli("reducers", "delete", "mean@9", key=token)
        assert absent.returncode == 1 and "no reducer grace/mean@9" in absent.stdout, absent.stdout
        deleted = cli("reducers", "delete", "mean@1", key=token)
        assert deleted.returncode == 0 and "version(s) 1" in deleted.stdout
        assert cli("reducers", "show", "mean", key=token).returncode == 1

        added = cli("addresses", "add", "colleague@uni.example", key=token)  # the local stack mails anyone
        assert added.returncode == 0 and "colleague@uni.example: confirmed" in added.stdout, added.stdout
        assert "grace@example.org" in cli("addresses", "list", key=token).stdout

        tokens = cli("tokens", "list", key=token)
        token_id = token.split("_")[1]
        assert token_id in tokens.stdout and token.split("_", 2)[2] not in tokens.stdout
        assert cli("tokens", "revoke", token_id, key=token).returncode == 0
        gone = cli("whoami", key=token)
        assert gone.returncode == 1 and "401" in gone.stdout
        zero = cli("submit", "--tiles", "h09v05", "--start", "2022-01-01", "--end", "2022-01-09", "--product",
                   "MOD10A2", "--resolution", "0")  # sent as given (it was taken for no value: the default grid)
        assert zero.returncode == 1 and "grid.resolution" in zero.stdout, zero.stdout
        unknown = cli("submit", "--tiles", "h09v05", "--start", "2022-01-01", "--end", "2022-01-09", "--product",
                      "MOD10A2", "--layer", "MOD10A2:Nope")
        assert unknown.returncode == 1 and "no layer 'Nope'" in unknown.stdout, unknown.stdout
        job = cli("submit", "--tiles", "h09v05", "--start", "2022-01-01", "--end", "2022-01-09", "--product",
                  "MOD10A2", "--layer", "MOD10A2:Eight_Day_Snow_Cover").stdout.strip().splitlines()[-1]
        shown = json.loads(cli("status", job, "--json").stdout)
        assert shown["request"]["layers"] == {"MOD10A2": ["Eight_Day_Snow_Cover"]}, shown["request"]
        assert job in cli("jobs").stdout and job in cli("status", job).stdout  # whole on 80 columns, to copy
        audit = cli("audit", "--user", "grace")
        assert "reducer.push" in audit.stdout and "token.revoke" in audit.stdout
        # the first admin of a deployment without Entra sign-in, made straight in storage
        storage = {"BagpipeStorage": azurite.connection_string, "BAGPIPE_NAMESPACE": "clitest"}
        boot = runner.invoke(app, ["users", "bootstrap", "root", "--email", "root@example.org"], env=unset | storage)
        assert boot.exit_code == 0, boot.stdout
        assert "root (admin" in cli("whoami", key=boot.stdout.strip().splitlines()[-1]).stdout


def test_submit_shows_the_estimate_and_asks_before_what_looks_like_a_slip(azurite: Azurite, tmp_path: Path) -> None:
    """submit says what a request costs before it sends it (--dry-run: only that), and asks
    before a box across half the world (west and east swapped made 1,436 tasks where 2 were
    meant) or a request far larger than the user's last job (in places: its tasks, in batches
    of tiles, are far fewer): without a terminal to ask on, it submits nothing unless --yes."""
    from typer.testing import CliRunner

    from bagpipe.cli import app
    from bagpipe.client import Api
    from bagpipe.stack import LocalStack

    home = tmp_path / "home"
    runner = CliRunner()
    unset = {k: None for k in os.environ if k.startswith("BAGPIPE_")}
    span = ["--start", "2022-01-01", "--end", "2022-01-09", "--product", "MOD10A2"]

    def submit(*args: str) -> Any:
        return runner.invoke(app, ["submit", *args, *span, "--home", str(home)], env=unset)

    with LocalStack(home, workers=0, connection=azurite.connection_string, namespace="clisubmit") as stack:
        def jobs() -> list[dict[str, Any]]:
            return list(Api(stack.api_url, stack.token).get("/api/jobs"))

        dry = submit("--bbox", "-110,35,-109,36", "--dry-run")
        assert dry.exit_code == 0 and "2 tasks" in dry.stdout and "check:" not in dry.stdout, dry.stdout
        swapped = submit("--bbox", "-109,35,-110,36")
        assert swapped.exit_code == 1, swapped.stdout
        assert "did you mean -110,35,-109,36?" in swapped.stdout and "--yes" in swapped.stdout, swapped.stdout
        assert jobs() == []
        made = submit("--bbox", "-110,35,-109,36")
        assert made.exit_code == 0 and "bagpipe watch" in made.stdout, made.stdout
        first = made.stdout.strip().splitlines()[-1]
        larger = ["--bbox", "-115,33,-105,43"]  # 100 target tiles on 2 dates: 100 times the last job's places
        said = submit(*larger, "--dry-run")
        assert said.exit_code == 0 and "200 pieces of work" in said.stdout, said.stdout
        assert f"your last job's ({first}: 2)" in said.stdout and "200 tasks" not in said.stdout, said.stdout
        assert submit(*larger).exit_code == 1 and [j["job"] for j in jobs()] == [first]
        sure = submit(*larger, "--yes")
        assert sure.exit_code == 0, sure.stdout
        assert len(jobs()) == 2
        # status says what its states mean: how far a running job is, what a task's state is
        wait_for(lambda: Api(stack.api_url, stack.token).status(first)["state"] != "ACCEPTED", 60, "the plan")
        shown = runner.invoke(app, ["status", first, "--home", str(home)], env=unset)
        assert shown.exit_code == 0 and f"{first}  " in shown.stdout and "% of 2 tasks ended" in shown.stdout
        assert "waiting for a worker" in shown.stdout or "waiting for its turn" in shown.stdout, shown.stdout
        cancelled = sure.stdout.strip().splitlines()[-1]
        runner.invoke(app, ["cancel", cancelled, "--home", str(home)], env=unset)
        wait_for(lambda: Api(stack.api_url, stack.token).status(cancelled)["state"] == "CANCELLED", 60, "the cancel")
        shown = runner.invoke(app, ["status", cancelled, "--home", str(home)], env=unset)
        total = next(j["total"] for j in jobs() if j["job"] == cancelled)
        assert total < 200 and f"{cancelled}  CANCELLED  ({total} tasks)" in shown.stdout, shown.stdout
        assert "100%" not in shown.stdout, shown.stdout
        assert "not run: the job was cancelled" in shown.stdout, shown.stdout


def test_stack_json_names_the_catalogs_the_stack_uses(azurite: Azurite, tmp_path: Path) -> None:
    """Its imitations', unless the environment names a STAC API or a CMR of its own: then
    that one (it named the imitation, which nothing used)."""
    from bagpipe.stack import LocalStack

    for env, named in (({}, None), ({"BAGPIPE_STAC_URL": "https://stac.example.org/v1", "BAGPIPE_STAC_SAS_URL": "none",
                                     "BAGPIPE_CMR_URL": "https://cmr.example.org/search/"}, "example")):
        home = tmp_path / ("own" if named else "imitated")
        with LocalStack(home, workers=0, connection=azurite.connection_string, namespace=f"cli{len(env)}",
                        env=env) as stack:
            state = json.loads((home / "stack.json").read_text())
            assert state["catalog"] == "stac"
            if named:
                assert (state["stac"], state["stac_sas"], state["cmr"]) == (
                    "https://stac.example.org/v1", "", "https://cmr.example.org/search/")
            else:
                assert (state["stac"], state["stac_sas"], state["cmr"]) == (
                    stack.planetary.stac_url, stack.planetary.sas_url, stack.nasa.cmr_url)

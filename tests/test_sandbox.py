"""The sandbox holds, in each of its modes (namespaces of its own; none, as on a kernel that
gives none; none and, for root, no pids cgroup either, as for a worker that is not root): a
program that loops forever, allocates without bound, forks without bound, writes outside its
folder, floods stdout, ignores SIGTERM or exits non-zero ends with a clear verdict, leaves
nothing running and nothing written outside its folders. (Its attacks on its worker:
tests/test_hostile_reducer.py.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.reduction import sandbox
from pipeline.reduction.reducers import Limits
from tests.conftest import wait_for

LIMITS = Limits(cpu_s=20, memory_mb=400, file_mb=1, open_files=64, processes=16)


@dataclass(frozen=True)
class Cell:
    namespaces: bool
    cgroup: bool = True  # root's pids cgroup (the sandbox makes one where it may)


CELLS = {"namespaces": Cell(True), "no namespaces": Cell(False), "no namespaces, no cgroup": Cell(False, False)}


@pytest.fixture(params=list(CELLS))
def cell(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Cell:
    found = CELLS[request.param]
    mode = sandbox.mode(found.namespaces)
    if mode.missing or mode.namespaces != found.namespaces:
        pytest.skip(mode.missing or "this kernel gives no namespaces")
    if not found.cgroup:
        if os.geteuid() != 0:
            pytest.skip("only root's programs get a pids cgroup")
        monkeypatch.setattr(sandbox, "PIDS_CGROUPS", ())
    return found


def run(tmp_path: Path, cell: Cell, code: str, timeout_s: float = 20, **limits: int) -> tuple[sandbox.Result, Path]:
    work, out, tmp = tmp_path / "work", tmp_path / "out", tmp_path / "tmp"
    for folder in (work, out, tmp):
        folder.mkdir(exist_ok=True)
    result = sandbox.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=work, writable=[out, tmp],
        stdout=tmp_path / "stdout.txt", stderr=tmp_path / "stderr.txt",
        limits=Limits(**{**LIMITS.__dict__, **limits}), env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp),
                                                            "OUT": str(out), "MARK": tmp_path.name},
        timeout_s=timeout_s, namespaces=cell.namespaces,
    )
    return result, out


def leftovers(mark: str) -> list[int]:
    """Processes whose environment carries this test's mark."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if f"MARK={mark}".encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_a_good_program_writes_its_outputs_and_sees_only_the_environment_given(tmp_path: Path, cell: Cell) -> None:
    result, out = run(tmp_path, cell, """
        import os, pathlib
        pathlib.Path(os.environ["OUT"], "result.txt").write_text(",".join(sorted(os.environ)))
        print("done")
    """)
    assert (result.exit_code, result.why) == (0, "")
    seen = set((out / "result.txt").read_text().split(",")) - {"LC_CTYPE"}  # Python's own locale coercion
    assert seen == {"MARK", "OUT", "PATH", "TMPDIR"}
    assert (tmp_path / "stdout.txt").read_text() == "done\n"


def test_a_non_zero_exit_is_the_verdict(tmp_path: Path, cell: Cell) -> None:
    result, _ = run(tmp_path, cell, "import sys; print('bad input', file=sys.stderr); sys.exit(3)")
    assert result.exit_code == 3 and result.why == ""
    assert "bad input" in (tmp_path / "stderr.txt").read_text()


def test_a_program_that_loops_forever_is_stopped_at_its_timeout(tmp_path: Path, cell: Cell) -> None:
    result, _ = run(tmp_path, cell, "while True: pass", timeout_s=1.5)
    assert result.exit_code < 0 and "timeout" in result.why
    assert result.seconds < 1.5 + sandbox.GRACE_S + 2


def test_one_that_ignores_sigterm_is_killed(tmp_path: Path, cell: Cell) -> None:
    result, _ = run(tmp_path, cell, """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True: time.sleep(0.1)
    """, timeout_s=1)
    assert result.exit_code == -9 and "timeout" in result.why
    assert leftovers(tmp_path.name) == []


def test_cpu_time_is_limited(tmp_path: Path, cell: Cell) -> None:
    result, _ = run(tmp_path, cell, "while True: pass", timeout_s=30, cpu_s=1)
    assert result.exit_code < 0 and ("CPU" in result.why) and result.seconds < 10


def test_unbounded_allocation_fails_inside_the_program(tmp_path: Path, cell: Cell) -> None:
    result, _ = run(tmp_path, cell, "blocks = []\nwhile True: blocks.append(bytearray(50_000_000))", memory_mb=300)
    assert result.exit_code != 0
    assert "MemoryError" in (tmp_path / "stderr.txt").read_text() or result.exit_code < 0


def test_a_fork_bomb_is_bounded_and_leaves_nothing_running(tmp_path: Path, cell: Cell) -> None:
    if not cell.cgroup:
        pytest.skip("root's processes are bounded only by its cgroup")
    result, _ = run(tmp_path, cell, """
        import os, time
        failures = 0
        for _ in range(200):
            try:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
            except OSError:
                failures += 1
        print(failures, flush=True)
        time.sleep(60)
    """, timeout_s=3, processes=10)
    assert "timeout" in result.why
    refused = (tmp_path / "stdout.txt").read_text()
    assert refused and int(refused) >= 185  # at most 10 processes at once were allowed
    assert leftovers(tmp_path.name) == []


def test_a_flood_of_stdout_is_cut_at_the_file_size_limit(tmp_path: Path, cell: Cell) -> None:
    result, _ = run(tmp_path, cell, "import sys\nwhile True: sys.stdout.write('x' * 65536)", file_mb=1)
    assert result.exit_code != 0
    assert (tmp_path / "stdout.txt").stat().st_size <= 1024 * 1024


def test_it_cannot_write_outside_its_folders(tmp_path: Path, cell: Cell) -> None:
    outside = tmp_path / "outside.txt"
    result, out = run(tmp_path, cell, f"""
        import os, pathlib
        errors = []
        for target in [{str(outside)!r}, "/tmp/bagpipe-escape-{tmp_path.name}"]:
            try:
                pathlib.Path(target).write_text("escaped")
            except PermissionError as exc:
                errors.append(type(exc).__name__)
        pathlib.Path(os.environ["OUT"], "ok.txt").write_text(",".join(errors))
        pathlib.Path(os.environ["TMPDIR"], "scratch").write_text("fine")
    """)
    assert result.exit_code == 0, (tmp_path / "stderr.txt").read_text()
    assert (out / "ok.txt").read_text() == "PermissionError,PermissionError"
    assert not outside.exists() and not Path(f"/tmp/bagpipe-escape-{tmp_path.name}").exists()


HOSTILE = """
    import json, os, pathlib, socket, sys, time
    needle = os.environ["NEEDLE_REVERSED"][::-1]  # never whole in its own environment
    seen = {}
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except PermissionError:  # without namespaces, the host's /proc is not its to read
        pids = []
    found = []
    for pid in pids:
        try:
            if needle.encode() in pathlib.Path(f"/proc/{pid}/environ").read_bytes():
                found.append(pid)
        except OSError:
            pass
    seen["pids"], seen["found"] = len(pids), found
    try:
        seen["file"] = pathlib.Path(os.environ["SECRET_FILE"]).read_text()
    except OSError as exc:
        seen["file"] = type(exc).__name__
    for name, address in (("local", ("127.0.0.1", int(os.environ["PORT"]))), ("identity", ("169.254.169.254", 80))):
        try:
            socket.create_connection(address, timeout=1).close()
            seen[name] = "connected"
        except OSError as exc:
            seen[name] = type(exc).__name__
    child = os.fork()
    if child == 0:  # a new session, and a grandchild that lives on and writes
        os.setsid()
        if os.fork() == 0:
            while True:
                with open(os.path.join(os.environ["OUT"], "alive.txt"), "a") as f:
                    f.write("x")
                time.sleep(0.05)
        os._exit(0)
    os.waitpid(child, 0)
    time.sleep(0.3)
    pathlib.Path(os.environ["OUT"], "report.json").write_text(json.dumps(seen))
"""


def hostile_run(tmp_path: Path, cell: Cell) -> tuple[dict[str, object], Path]:
    """Run the hostile program beside a stand-in for its worker (a process whose environment
    holds a secret) and a TCP port listening on this machine; what it saw, and its folder."""
    needle = f"storage-key-{tmp_path.name}"
    secret = tmp_path / "api-key"
    secret.write_text(needle)
    secret.chmod(0o600)
    worker = subprocess.Popen(["sleep", "60"], env={"BagpipeStorage": needle})
    server = socket.create_server(("127.0.0.1", 0))
    work, out, tmp = tmp_path / "work", tmp_path / "out", tmp_path / "tmp"
    for folder in (work, out, tmp):
        folder.mkdir()
    try:
        result = sandbox.run(
            [sys.executable, "-c", textwrap.dedent(HOSTILE)], cwd=work, writable=[out, tmp],
            stdout=tmp_path / "stdout.txt", stderr=tmp_path / "stderr.txt", limits=LIMITS, timeout_s=20,
            namespaces=cell.namespaces, env={"PATH": "/usr/bin:/bin", "OUT": str(out), "MARK": tmp_path.name,
                                  "NEEDLE_REVERSED": needle[::-1], "SECRET_FILE": str(secret),
                                  "PORT": str(server.getsockname()[1])})
    finally:
        worker.kill()
        worker.wait()
        server.close()
    assert (result.exit_code, result.why) == (0, ""), (tmp_path / "stderr.txt").read_text()
    return json.loads((out / "report.json").read_text()), out


def test_a_hostile_program_sees_nothing_of_its_worker_reaches_nothing_and_leaves_nothing(
        tmp_path: Path, cell: Cell) -> None:
    seen, out = hostile_run(tmp_path, cell)
    assert seen["found"] == [], "no process's environment shows it the worker's secret"
    assert int(seen["pids"]) < 10, "it sees only its own cell's processes"  # type: ignore[call-overload]
    assert seen["file"] == "PermissionError", "files beside its folders are not readable"
    assert seen["local"] != "connected" and seen["identity"] != "connected"
    # the grandchild that left its session died with the program
    written = (out / "alive.txt").stat().st_size
    time.sleep(0.5)
    assert (out / "alive.txt").stat().st_size == written
    assert leftovers(tmp_path.name) == []


def test_a_program_dies_with_the_stage_that_runs_it(tmp_path: Path, cell: Cell) -> None:
    """Kill the stage process (a revocation, a worker lost): the program and what it started
    in a session of its own are gone within a second or two."""
    stage = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, pathlib
        from pipeline.reduction.reducers import Limits
        from pipeline.reduction import sandbox
        if not {cell.cgroup!r}:
            sandbox.PIDS_CGROUPS = ()
        top = pathlib.Path({str(tmp_path)!r})
        for name in ("work", "out", "tmp"):
            (top / name).mkdir()
        sandbox.run([sys.executable, "-c", "import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n"
                     "    time.sleep(600)\\ntime.sleep(600)"],
                    cwd=top / "work", writable=[top / "out"], stdout=top / "o.txt", stderr=top / "e.txt",
                    limits=Limits(), env={{"MARK": top.name, "PATH": "/usr/bin:/bin"}}, timeout_s=600,
                    namespaces={cell.namespaces!r})
    """)])
    try:
        wait_for(lambda: len(leftovers(tmp_path.name)) >= 3, 30, "the program and its escaped child")
        stage.kill()
        stage.wait()
        wait_for(lambda: not leftovers(tmp_path.name), 5, "every process of the program to die")
    finally:
        stage.kill()

"""A hostile scientist's program against its worker, each attack of issue 42 its own test, in
every sandbox mode: in namespaces of its own, in namespaces with hosts listed (an installed
reducer's network), and without namespaces (``namespaces=False``, as ``BAGPIPE_SANDBOX=
no-namespaces`` forces it: what a worker on a kernel that gives none runs).

Beside each program run the pieces of a worker: its fork server and a warm stage process
(``worker.child.StageProcess``, from the test process as from a worker), and a stand-in for a
process of the worker whose environment holds a secret and which, unlike the worker's own,
is dumpable. The program is run through ``sandbox.run``; at the end of the module, a real
worker (a ``bagpipe worker`` process, on Azurite) runs an uploaded bundle that makes the same
attack on its fork server, on each of two tiles.

What must hold: the program reaches no socket and no process of the worker (it runs no
code there, kills nothing, reads no secret), reaches no loopback or host socket, reads
none of ``/etc/shadow``, ``/dev/shm``, ``/sys`` or another process's ``/proc``, and reaches
the network only through the proxy, to the hosts listed, at public addresses.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bagpipe.manage import pack
from pipeline.lifecycle import attempts, jobs, tasks
from pipeline.reduction import proxy, sandbox
from pipeline.reduction.reducers import Limits
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from pipeline.web.api import create_app
from tests.conftest import descriptors_past_select, make_user, parts, running_control, signed, wait_for
from tests.test_bundles import GZIP
from tests.test_reduction import GRID, SPAN
from worker.child import Outcome, StageProcess

LIMITS = Limits(cpu_s=30, memory_mb=1024, file_mb=16, open_files=64, processes=16)
LISTED = ("example.org:443",)  # the hosts of the mode with network: never reached here (no route out)
STAGES = Settings(storage_connection="UseDevelopmentStorage=true", stage_modules="tests.stages_for_tests")


@dataclass(frozen=True)
class Case:
    name: str
    namespaces: bool
    network: tuple[str, ...] = ()


CASES = [Case("namespaces", True), Case("namespaces, hosts listed", True, LISTED), Case("no namespaces", False)]


@pytest.fixture(params=CASES, ids=[c.name for c in CASES])
def case(request: pytest.FixtureRequest) -> Case:
    found: Case = request.param
    mode = sandbox.mode(found.namespaces)
    if mode.missing:
        pytest.skip(mode.missing)
    if found.namespaces and not mode.namespaces:
        pytest.skip("this kernel gives no namespaces")
    return found


# --- the attacker's tools, in the program --------------------------------------------------
TOOLS = r'''
import array, json, os, pickle, socket, sys

OUT = os.environ["OUT"]


def report(found):
    with open(os.path.join(OUT, "report.json"), "w") as f:
        json.dump(found, f)


def failed(call, *args):
    """None if the call worked, else the name of its error."""
    try:
        call(*args)
    except OSError as exc:
        return type(exc).__name__
    return None


def read(path):
    """What a file holds, or the name of the error reading it."""
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError as exc:
        return type(exc).__name__


def opened(path):
    """None if it could be read (what it holds stays here), else the name of the error."""
    return failed(lambda: open(path, "rb").close())


class Escape:
    """A pickle that, unpickled, writes the marker: code run by whoever unpickles it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write(str(__import__('os').getpid()))",))


def address(target):
    return "\0" + target[1:] if target.startswith("@") else target


def send_pickle(target, marker):
    """A multiprocessing fork server's request: one byte, four descriptors (the first a pipe
    that holds the pickle it unpickles)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(address(target))
        r, w = os.pipe()
        os.write(w, pickle.dumps(Escape(marker)))
        a, b = os.pipe()
        s.sendmsg([bytes([4])], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r, w, a, b]))])


def connect_and_close(target):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(address(target))


def visible_unix_sockets():
    """The UNIX socket addresses /proc/net/unix shows, or why it cannot be read."""
    text = read("/proc/net/unix")
    if not text.startswith("Num"):
        return text
    return [line.split()[7] for line in text.splitlines()[1:] if len(line.split()) >= 8]
'''


def attack(tmp_path: Path, case: Case, code: str, **env: str) -> dict[str, Any]:
    """Run ``code`` (after TOOLS) as a scientist's program in ``case``'s mode; what it reported."""
    top = tmp_path / "cell"
    work, out, scratch, program = top / "work", top / "out", top / "tmp", top / "program"
    for folder in (work, out, scratch, program):
        folder.mkdir(parents=True)
    (program / "attack.py").write_text(TOOLS + textwrap.dedent(code))
    result = sandbox.run([sys.executable, str(program / "attack.py")], cwd=work, writable=[out, scratch],
                         readable=[program], stdout=top / "stdout.txt", stderr=top / "stderr.txt", limits=LIMITS,
                         env={"PATH": "/usr/bin:/bin", "OUT": str(out), "TMPDIR": str(scratch), **env}, timeout_s=60,
                         network=case.network, namespaces=case.namespaces)
    assert (result.exit_code, result.why) == (0, ""), (top / "stderr.txt").read_text()
    found: dict[str, Any] = json.loads((out / "report.json").read_text())
    return found


# --- the worker beside it ------------------------------------------------------------------
def descendants(pid: int) -> list[int]:
    """The processes below ``pid``."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        children = [child for child, of in parents.items() if of == parent]
        found += children
        todo += children
    return found


def unix_addresses(pids: list[int]) -> list[str]:
    """The addresses (paths, or @abstract names) of the UNIX sockets ``pids`` hold: what
    another process can connect to. Read from outside, as root (the worker's processes are
    not dumpable: their descriptors are hidden from anyone else)."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    return sorted({line.split()[7] for line in lines if len(line.split()) >= 8 and line.split()[6] in inodes})


def run_one(process: StageProcess) -> Outcome:
    process.start("whoami", {"job": "j", "part": "j", "task": "000000001", "attempt": 1, "params": {},
                             "output_prefix": "j/tasks/000000001/a001/"})
    while (outcome := process.poll(1.0)) is None:
        pass
    return outcome


@dataclass
class Worker:
    """A worker's fork server and warm stage process (from this test process), and a
    stand-in for one of its processes that holds a secret in its environment."""

    stage: StageProcess
    stand_in: subprocess.Popen[bytes]
    secret: str

    def sockets(self) -> list[str]:
        return unix_addresses([p for p in descendants(os.getpid()) if p != self.stand_in.pid])

    def still_serves(self) -> bool:
        """Its stage process alive and running an attempt, and a new one forked for the next."""
        if not self.stage.usable() or run_one(self.stage).outputs != [str(self.stage.process.pid)]:
            return False
        fresh = StageProcess(STAGES)
        try:
            return bool(run_one(fresh).outputs)
        finally:
            fresh.close()


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    secret = f"storage-key-{tmp_path.name}"
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                env={"BagpipeStorage": f"AccountKey={secret}"})
    stage = StageProcess(STAGES)
    try:
        assert run_one(stage).outputs, "the stage process serves"
        yield Worker(stage, stand_in, secret)
    finally:
        stage.close()
        stand_in.kill()
        stand_in.wait()


# --- the attacks ---------------------------------------------------------------------------
def test_no_process_of_a_worker_holds_a_socket_another_process_can_connect_to(worker: Worker) -> None:
    """The fork server and its stage processes are reached only through socket pairs their
    worker holds: no path in the file system, no abstract name (a multiprocessing fork
    server listens on /tmp/pymp-*/listener-*, and unpickles what any peer sends)."""
    if not os.access(f"/proc/{worker.stage.process.pid}/fd", os.R_OK):
        pytest.skip("reading the descriptors of a worker's processes needs root")
    pids = descendants(os.getpid())
    assert worker.stage.process.pid in pids and len(pids) >= 3, "the fork server, the stage process, the stand-in"
    assert worker.sockets() == []


def test_the_fork_server_runs_no_pickle_a_program_sends(tmp_path: Path, case: Case, worker: Worker) -> None:
    marker = tmp_path / "escaped"
    targets = worker.sockets()  # as the attacker found them through the host's /proc/net/unix
    seen = attack(tmp_path, case, """
        targets = json.loads(os.environ["TARGETS"])
        visible = visible_unix_sockets()
        report({"visible": [t for t in targets if t in visible] if isinstance(visible, list) else visible,
                "sent": {t: failed(send_pickle, t, os.environ["MARKER"]) for t in targets}})
    """, TARGETS=json.dumps(targets), MARKER=str(marker))
    time.sleep(1)  # a fork server's child would have run it by now
    assert not marker.exists(), f"code ran in the worker's fork server as pid {marker.read_text()}: {seen}"
    assert seen["visible"] in ([], "PermissionError"), "the worker's sockets are not in its view"
    assert all(seen["sent"].values()), seen
    assert worker.still_serves()


def test_a_connect_and_close_on_the_worker_s_sockets_kills_nothing(tmp_path: Path, case: Case, worker: Worker) -> None:
    targets = worker.sockets()
    seen = attack(tmp_path, case, """
        report({t: failed(connect_and_close, t) for t in json.loads(os.environ["TARGETS"])})
    """, TARGETS=json.dumps(targets))
    assert all(seen.values()), seen
    time.sleep(0.5)
    assert worker.still_serves(), "the stage process lives on, and the fork server forks the next"


def test_proc_net_unix_shows_no_socket_of_the_host(tmp_path: Path, case: Case) -> None:
    path = tmp_path / "host.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as host:
        host.bind(str(path))
        host.listen()
        seen = attack(tmp_path, case, 'report({"visible": visible_unix_sockets()})')
    assert seen["visible"] == "PermissionError" or str(path) not in seen["visible"], seen


def test_no_tcp_or_udp_to_the_host_s_loopback(tmp_path: Path, case: Case) -> None:
    with socket.create_server(("127.0.0.1", 0)) as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        seen = attack(tmp_path, case, """
            tcp, udp = int(os.environ["TCP"]), int(os.environ["UDP"])

            def over_tcp(address):
                socket.create_connection(address, timeout=2).close()

            def over_udp(address):
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.sendto(b"hello from the cell", address)

            report({"tcp": failed(over_tcp, ("127.0.0.1", tcp)), "udp": failed(over_udp, ("127.0.0.1", udp)),
                    "tcp6": failed(over_tcp, ("::1", tcp)), "identity": failed(over_tcp, ("169.254.169.254", 80))})
        """, TCP=str(tcp.getsockname()[1]), UDP=str(udp.getsockname()[1]))
        tcp.settimeout(0.5)
        udp.settimeout(0.5)
        with pytest.raises(TimeoutError):
            tcp.accept()
        with pytest.raises(TimeoutError):
            udp.recvfrom(100)
    assert seen["tcp"] and seen["tcp6"] and seen["identity"], seen
    if not case.network:  # no socket at all
        assert seen["tcp"] == seen["udp"] == "PermissionError", seen


def test_no_unix_socket_of_the_host(tmp_path: Path, case: Case) -> None:
    path = tmp_path / "host.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as host:
        host.bind(str(path))
        host.listen()
        host.settimeout(0.5)
        seen = attack(tmp_path, case, 'report({"connect": failed(connect_and_close, os.environ["SOCKET"])})',
                      SOCKET=str(path))
        with pytest.raises(TimeoutError):
            host.accept()
    assert seen["connect"] == "PermissionError", seen


def test_no_etc_shadow_dev_shm_or_sys(tmp_path: Path, case: Case) -> None:
    seen = attack(tmp_path, case, """
        report({"shadow": opened("/etc/shadow"), "shm": failed(os.listdir, "/dev/shm"),
                "sys": failed(os.listdir, "/sys"), "sys_file": opened("/sys/devices/system/cpu/online"),
                "etc": failed(os.listdir, "/etc"),
                "hostname": opened("/etc/hostname"), "passwd": read("/etc/passwd")[:5]})
    """)
    assert seen["shadow"] == "PermissionError" and seen["shm"] == "PermissionError", seen
    assert seen["sys"] == seen["sys_file"] == "PermissionError", seen
    assert seen["etc"] == "PermissionError" and seen["hostname"] == "PermissionError", "not /etc wholesale"
    assert seen["passwd"] == "root:", "what a program needs of /etc it reads"


def test_no_environment_of_another_process(tmp_path: Path, case: Case, worker: Worker) -> None:
    pids = [1, os.getpid(), worker.stand_in.pid, worker.stage.process.pid, *descendants(os.getpid())]
    seen = attack(tmp_path, case, """
        def environ(pid):
            said = read(f"/proc/{pid}/environ")
            if os.environ["SECRET"][::-1] in said:
                return "the secret"
            return "its cell's" if "CELL=ours" in said else said[:20]

        report({pid: environ(pid) for pid in json.loads(os.environ["PIDS"])})
    """, PIDS=json.dumps(pids), CELL="ours", SECRET=worker.secret[::-1])
    # unreadable, or (in a PID namespace of its own) a process of its cell: never the worker's
    assert set(seen.values()) <= {"PermissionError", "FileNotFoundError", "its cell's"}, seen


def test_no_signal_trace_or_limit_reaches_a_process_of_the_worker(tmp_path: Path, case: Case, worker: Worker) -> None:
    seen = attack(tmp_path, case, """
        import ctypes, resource, signal
        libc = ctypes.CDLL(None, use_errno=True)
        pid, group = int(os.environ["VICTIM"]), int(os.environ["GROUP"])

        def call(name, *args):
            if getattr(libc, name)(*args) < 0:
                raise OSError(ctypes.get_errno(), name)

        report({"signal": failed(os.kill, pid, signal.SIGTERM),
                "group": failed(os.killpg, group, 0),  # 0: only asks
                "ptrace": failed(call, "ptrace", 16, pid, 0, 0),  # PTRACE_ATTACH
                "limit": failed(resource.prlimit, pid, resource.RLIMIT_NOFILE, (1, 1)),
                "affinity": failed(os.sched_setaffinity, pid, {0}),
                "nice": failed(os.setpriority, os.PRIO_PROCESS, pid, 19),
                "vm_read": failed(call, "process_vm_readv", pid, None, 0, None, 0, 0),
                "own_signal": failed(os.kill, os.getpid(), 0), "own_limit": failed(resource.setrlimit,
                resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))})
    """, VICTIM=str(worker.stand_in.pid), GROUP=str(os.getpgid(worker.stand_in.pid)))
    time.sleep(0.2)
    assert worker.stand_in.poll() is None, "the worker's process lives"
    assert os.sched_getaffinity(worker.stand_in.pid) == os.sched_getaffinity(0)
    assert os.getpriority(os.PRIO_PROCESS, worker.stand_in.pid) == os.getpriority(os.PRIO_PROCESS, 0)
    reached = {name: error for name, error in seen.items() if not name.startswith("own") and error is None}
    assert reached == {}, seen
    assert seen["own_signal"] is None and seen["own_limit"] is None, "its own process it may signal and limit"


def test_without_signal_scopes_signals_reach_only_the_program_itself(
        tmp_path: Path, worker: Worker, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a kernel whose Landlock has no signal scope (ABI < 6), without namespaces: the
    seccomp filter lets the program signal itself and its group, nothing else."""
    real = sandbox.mode(False)
    if real.missing:
        pytest.skip(real.missing)
    monkeypatch.setattr(sandbox, "mode", lambda namespaces=True: sandbox.Mode(False, min(real.landlock, 5), True))
    seen = attack(tmp_path, Case("no namespaces, Landlock 5", False), """
        import signal, time
        got = []
        signal.signal(signal.SIGUSR1, lambda *_: got.append("usr1"))
        os.kill(os.getpid(), signal.SIGUSR1)
        signal.raise_signal(signal.SIGUSR1)
        time.sleep(0.1)
        report({"victim": failed(os.kill, int(os.environ["VICTIM"]), signal.SIGTERM),
                "everyone": failed(os.kill, -1, 0), "got": got})
    """, VICTIM=str(worker.stand_in.pid))
    assert seen == {"victim": "PermissionError", "everyone": "PermissionError", "got": ["usr1", "usr1"]}
    assert worker.stand_in.poll() is None


def test_no_new_namespaces_io_uring_or_keyrings(tmp_path: Path, case: Case) -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("the program names x86_64's calls")
    seen = attack(tmp_path, case, """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)

        def call(*args):
            if libc.syscall(*args) < 0:
                raise OSError(ctypes.get_errno(), str(args[0]))

        # x86_64's unshare(CLONE_NEWUSER), io_uring_setup, keyctl(KEYCTL_GET_KEYRING_ID, session)
        report({"unshare": failed(call, 272, 0x10000000), "keyring": failed(call, 250, 0, -3, 0),
                "io_uring": failed(call, 425, 8, ctypes.create_string_buffer(128))})
    """)
    assert seen == {"unshare": "PermissionError", "io_uring": "PermissionError", "keyring": "PermissionError"}


# --- the network ---------------------------------------------------------------------------
class Origin(BaseHTTPRequestHandler):
    """A web server standing for a listed host."""

    def do_GET(self) -> None:
        body = b"data for the reducer"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def origin() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Origin)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()


FETCH = """
    import urllib.request

    def fetch(url):
        return urllib.request.urlopen(url, timeout=5).read().decode()

    def fetch_or_why(url):
        try:
            return fetch(url)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    report({url: fetch_or_why(url) for url in json.loads(os.environ["URLS"])})
"""


def with_network(namespaces: bool = True) -> None:
    mode = sandbox.mode(namespaces)
    if mode.missing or not mode.namespaces:
        pytest.skip(mode.missing or "this kernel gives no namespaces")


def test_a_listed_host_is_reached_through_the_proxy_and_nothing_else(
        tmp_path: Path, origin: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy relays to a listed host; here the host is this machine's loopback, which
    the proxy never reaches, so the test lets it (``proxy.public``) as it would let a public
    address: what is checked is the allow-list and that the proxy is the only way out."""
    with_network()
    monkeypatch.setattr(proxy, "public", lambda address: True)
    listed = f"127.0.0.1:{origin}"
    urls = [f"http://{listed}/data", f"http://127.0.0.2:{origin}/other", f"http://localhost:{origin}/named"]
    seen = attack(tmp_path, Case("hosts listed", True, (listed,)), FETCH, URLS=json.dumps(urls))
    assert seen[urls[0]] == "data for the reducer"
    assert "403" in seen[urls[1]] and "not among the hosts" in seen[urls[1]], seen
    assert "403" in seen[urls[2]], "a name is listed as itself, not as what it resolves to"


def test_a_listed_host_at_an_address_that_is_not_public_is_refused(tmp_path: Path, origin: int) -> None:
    with_network()
    listed = (f"127.0.0.1:{origin}", f"localhost:{origin}")
    urls = [f"http://{host}/data" for host in listed]
    seen = attack(tmp_path, Case("hosts listed", True, listed), FETCH, URLS=json.dumps(urls))
    assert all("403" in said and "not public" in said for said in seen.values()), seen


def test_a_tunnel_goes_only_to_a_listed_host(tmp_path: Path, origin: int, monkeypatch: pytest.MonkeyPatch) -> None:
    with_network()
    monkeypatch.setattr(proxy, "public", lambda address: True)
    listed = f"127.0.0.1:{origin}"
    seen = attack(tmp_path, Case("hosts listed", True, (listed,)), """
        proxy = os.environ["HTTPS_PROXY"].removeprefix("http://")
        host, port = proxy.rsplit(":", 1)

        def tunnel(target):
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode())
                answer = s.recv(200).decode()
                if answer.startswith("HTTP/1.1 200"):
                    s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
                    return s.recv(1000).decode().split("\\r\\n")[0]
                return answer.split("\\r\\n")[0]

        report({target: tunnel(target) for target in json.loads(os.environ["TARGETS"])})
    """, TARGETS=json.dumps([listed, f"127.0.0.1:{origin + 1}", "169.254.169.254:80"]))
    assert seen[listed] == "HTTP/1.0 200 OK"
    assert all(said.startswith("HTTP/1.1 403") for target, said in seen.items() if target != listed), seen


def test_without_namespaces_a_program_that_asks_for_the_network_is_not_run(tmp_path: Path) -> None:
    mode = sandbox.mode(False)
    if mode.missing:
        pytest.skip(mode.missing)
    ran = tmp_path / "ran"
    result = sandbox.run([sys.executable, "-c", f"open({str(ran)!r}, 'w')"], cwd=tmp_path, writable=[tmp_path],
                         stdout=tmp_path / "out.txt", stderr=tmp_path / "err.txt", limits=LIMITS, env={},
                         timeout_s=10, network=LISTED, namespaces=False)
    assert result.exit_code == 126 and "network" in result.why and "namespaces" in result.why
    assert not ran.exists()


def test_a_kernel_without_landlock_or_seccomp_runs_no_program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran = tmp_path / "ran"
    for lacking, named in ((sandbox.Mode(True, 0, True), "Landlock"), (sandbox.Mode(False, 7, False), "seccomp")):
        monkeypatch.setattr(sandbox, "mode", lambda namespaces=True, lacking=lacking: lacking)
        result = sandbox.run([sys.executable, "-c", f"open({str(ran)!r}, 'w')"], cwd=tmp_path, writable=[tmp_path],
                             stdout=tmp_path / "out.txt", stderr=tmp_path / "err.txt", limits=LIMITS, env={},
                             timeout_s=10)
        assert result.exit_code == 126 and named in result.why, result
        assert named in (tmp_path / "err.txt").read_text()
        assert lacking.describe().startswith("none: ") and "refused" in lacking.describe()
    assert not ran.exists()


# --- the same attack through a real worker -------------------------------------------------
HOSTILE = TOOLS.replace('OUT = os.environ["OUT"]',
                        'task = json.load(open(sys.argv[1]))\nOUT = task["outputs_dir"]') + r'''
targets, marker = json.loads(task["args"]["targets"]), task["args"]["marker"]
visible = visible_unix_sockets()
report({"visible": [t for t in targets if t in visible] if isinstance(visible, list) else visible,
        "sent": {t: failed(send_pickle, t, marker) for t in targets},
        "closed": {t: failed(connect_and_close, t) for t in targets}})
'''


@pytest.fixture(scope="module", params=["auto", "no-namespaces"])
def real_worker(request: pytest.FixtureRequest, azurite: Any, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[dict[str, Any]]:
    """A ``bagpipe worker`` process of one slot runs an uploaded bundle on two tiles, one
    after the other in its warm stage process; each sends its fork server a pickle and
    connects and closes, on every UNIX socket the worker's processes hold."""
    mode = sandbox.mode(request.param == "auto")
    if mode.missing:
        pytest.skip(mode.missing)
    tmp = tmp_path_factory.mktemp("escape")
    marker = tmp / "escaped"
    folder = tmp / "hostile"
    folder.mkdir()
    (folder / "hostile.py").write_text(HOSTILE)
    (folder / "reducer.json").write_text(json.dumps({"name": "escape", "argv": ["{python}", "{here}/hostile.py",
                                                                                 "{task}"], "outputs": ["*.json"]}))
    settings = Settings(storage_connection=azurite.connection_string, namespace=f"escape{request.param[:2]}",
                        lease_seconds=6, tile_stage="fault_tile", stage_modules="tests.harness.fault_stage",
                        bundle_cache=str(tmp / "cache"), sandbox=request.param)
    clients = Clients(settings)
    clients.ensure_resources()
    token = make_user(clients, "mallory")
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")} | settings.to_env() | {
        "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    process = subprocess.Popen([sys.executable, "-m", "bagpipe.cli", "worker", "--slots", "1"], env=env,
                               stdout=subprocess.DEVNULL, stderr=open(tmp / "worker.log", "wb"))
    seen: dict[str, Any] = {"marker": marker, "clients": clients, "worker": process}
    try:
        # (a ceiling: a worker's start imports and preloads its stages, a minute past at load 30)
        wait_for(lambda: b"ready" in (tmp / "worker.log").read_bytes(), 240, "the worker to be ready")
        seen["targets"] = unix_addresses([process.pid, *descendants(process.pid)])
        seen["stage_processes"] = sorted(descendants(process.pid))
        with TestClient(create_app(settings)) as api, running_control(settings):
            pushed = api.post("/api/reducers", content=pack(folder), headers=signed(token) | GZIP)
            assert pushed.status_code == 201, pushed.text
            body = {"region": {"bbox": [-109.0, 35.2, -107.5, 35.8]}, "grid": GRID, **SPAN, "products": ["MOD10A2"],
                    "reducer": {"name": "escape", "args": {"targets": json.dumps(seen["targets"]),
                                                               "marker": str(marker)}}}
            job = api.post("/api/jobs", json=body, headers=signed(token)).json()["job"]
            wait_for(lambda: jobs.get(clients, job).state.finished, 240, "the job to finish")
        seen["job"] = job
        seen["log"] = (tmp / "worker.log").read_text(errors="replace")
        seen["mode"] = mode.describe()
        seen["rows"] = [row.get("Sandbox") for row in clients.workers.list_entities()]
        yield seen
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def test_a_real_worker_s_fork_server_runs_no_pickle_and_its_stage_process_serves_on(
        real_worker: dict[str, Any]) -> None:
    clients, job = real_worker["clients"], real_worker["job"]
    time.sleep(1)
    assert not real_worker["marker"].exists(), "code ran in the worker's fork server"
    rows = [r for r in tasks.list_tasks(clients.tasks, parts(clients, job)) if r.stage == "reduce"]
    assert len(rows) == 2 and {r.status for r in rows} == {"SUCCEEDED"}, [(r.task, r.status) for r in rows]
    tried = [a for a in attempts.list_attempts(clients.tasks, parts(clients, job)) if a.task in {r.task for r in rows}]
    assert sorted(a.attempt for a in tried) == [1, 1], "each reduction ran once: no stage process died under it"
    for row in rows:
        (output,) = row.output_names()
        said = json.loads(clients.products.download_blob(output).readall())
        assert said["visible"] in ([], "PermissionError"), said
        assert all(said["sent"].values()) and all(said["closed"].values()), said
    assert real_worker["worker"].poll() is None, "the worker runs on"
    assert f"sandbox: {real_worker['mode']}" in real_worker["log"], "the worker says how it confines programs"
    assert real_worker["rows"] == [real_worker["mode"]], "and writes it in its health row"


def test_a_real_worker_holds_no_socket_a_program_could_reach(real_worker: dict[str, Any]) -> None:
    if not os.access(f"/proc/{real_worker['worker'].pid}/fd", os.R_OK):
        pytest.skip("reading the descriptors of a worker's processes needs root")
    assert len(real_worker["stage_processes"]) >= 2, "its fork server and its slot's stage process"
    assert real_worker["targets"] == []


def test_the_proxy_serves_and_relays_on_descriptors_past_1024() -> None:
    """The proxy waits on its listener and relays a connection's two sides with selectors:
    select() refuses a descriptor past 1,024, which a stage process holding many may give it."""
    with descriptors_past_select():
        listener = socket.create_server(("127.0.0.1", 0))
        assert listener.fileno() > 1024
        relay = proxy.Proxy(listener, ["listed.example.org:443"]).start()
        try:
            with socket.create_connection(listener.getsockname(), timeout=10) as client:
                client.sendall(b"CONNECT elsewhere.example.org:443 HTTP/1.1\r\n\r\n")
                assert client.recv(4096).startswith(b"HTTP/1.1 403 ")
        finally:
            relay.close()
        (a, near_a), (b, near_b) = socket.socketpair(), socket.socketpair()
        copying = threading.Thread(target=proxy._relay, args=(a, b), daemon=True)
        copying.start()
        near_a.sendall(b"to b")
        assert near_b.recv(16) == b"to b"
        near_b.sendall(b"to a")
        assert near_a.recv(16) == b"to a"
        near_a.close()
        copying.join(10)
        assert not copying.is_alive(), "one side closed ends the relay"
        for sock in (a, b, near_b):
            sock.close()

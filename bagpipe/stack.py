"""The embedded local stack: Azurite (disk mode), the API under uvicorn, the control loop,
N worker processes, an SMTP server, and imitations of the two places MODIS lives (Planetary
Computer's STAC API and SAS token endpoint; NASA's CMR, a DAAC archive and Earthdata Login)
— started together, stopped together. It signs its owner in as the admin user ``admin``,
whose personal API token it keeps in ``<home>/api-key`` (readable by its owner only): the
CLI finds it there."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from bagpipe import control
from bagpipe.azurite import Azurite
from bagpipe.client import STATE_FILE, TOKEN_FILE, token_in
from bagpipe.earthdata import Earthdata
from bagpipe.mailserver import MailServer
from bagpipe.planetary import Planetary
from bagpipe.serving import Served, bound
from pipeline.lifecycle.health import REPLACE_EXIT
from pipeline.settings import Settings, env_name
from pipeline.storage import names
from pipeline.storage.clients import clients_for
from pipeline.web import identity
from pipeline.web.api import create_app

log = logging.getLogger(__name__)

PORTS_FILE = "ports.json"  # the ports whose URLs task rows keep, the same at every start
READY = re.compile(r"worker \S+ ready")  # what a worker logs once its slots are warm
LOCK_FILE = "stack.lock"  # held while a stack runs in its home: one stack a home (the OS lets go if it dies)


class StackRunning(RuntimeError):
    """Another local stack runs in this home: two would share its Azurite's files and ports."""


@dataclass
class LocalStack:
    """Everything ``bagpipe up`` runs, with the settings of ``env`` (the process's environment,
    read as every entry point reads it: :meth:`Settings.from_env`) and ``overrides`` (any
    Settings field, by name) over them. The stack sets only what is its own: the storage
    (``connection`` reuses a running Azurite, as tests do), the SMTP server, and the catalogs'
    addresses — its imitations of Planetary Computer and NASA, unless the environment names a
    STAC API or a CMR of its own."""

    home: Path
    workers: int = 2
    slots: int = 2
    connection: str = ""
    namespace: str = ""
    token_minutes: float = 60.0  # the life of the Planetary Computer imitation's SAS tokens
    overrides: dict[str, object] = field(default_factory=dict)  # any Settings field
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    settings: Settings = field(init=False)
    token: str = field(init=False, default="")  # the admin's personal API token
    api_url: str = field(init=False, default="")
    azurite: Azurite | None = field(init=False, default=None)
    mail: MailServer = field(init=False)
    planetary: Planetary = field(init=False)
    nasa: Earthdata = field(init=False)
    _stop: threading.Event = field(init=False, default_factory=threading.Event)
    _threads: list[threading.Thread] = field(init=False, default_factory=list)
    _workers: list[subprocess.Popen[bytes]] = field(init=False, default_factory=list)
    _supervising: threading.Event = field(init=False, default_factory=threading.Event)
    replaced: int = field(init=False, default=0)  # workers that exited and were started again
    _api: Served | None = field(init=False, default=None)
    _api_socket: socket.socket | None = field(init=False, default=None)  # held from before the settings name it
    _lock: IO[bytes] | None = field(init=False, default=None)

    def start(self) -> LocalStack:
        self.home.mkdir(parents=True, exist_ok=True)
        self._hold_home()
        (self.home / "logs").mkdir(exist_ok=True)
        if not self.connection:
            self.azurite = Azurite(self.home / "azurite", hold=self._held()).start()
            self.connection = self.azurite.connection_string
        kept = self._kept_ports()  # bound before the mail server's any free port, which could be one of them
        self.planetary = Planetary(self.connection, self.token_minutes,
                                   storage_port=kept.get("planetary_storage", 0)).start()
        self.nasa = Earthdata(archive_port=kept.get("archive", 0)).start()
        (self.home / PORTS_FILE).write_text(json.dumps({"planetary_storage": self.planetary.storage.port,
                                                        "archive": self.nasa.archive.port}))
        self.mail = MailServer(self.home / "mail").start()
        self._api_socket = bound("127.0.0.1")  # its address is the portal's, which the emails link
        self.settings = self._settings()
        clients_for(self.settings).ensure_resources()
        self.token = identity.bootstrap_admin(clients_for(self.settings), token_in(self.home))
        path = self.home / TOKEN_FILE
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(self.token)
        self._start_api()
        thread = threading.Thread(target=control.run, args=(self.settings, self._stop),
                                  name="control", daemon=True)
        thread.start()
        self._threads.append(thread)
        for i in range(self.workers):
            self.start_worker(i)
        self._supervising.set()
        supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)
        supervisor.start()
        self._threads.append(supervisor)
        written = self.home / f"{STATE_FILE}.new"  # whole or not at all: the command line may read it now
        written.write_text(json.dumps(  # the catalogs the stack uses: its imitations', or those the environment names
            {"api": self.api_url, "pid": os.getpid(), "mail": str(self.mail.folder), "catalog": self.settings.catalog,
             "stac": self.settings.stac_url, "stac_sas": self.settings.stac_sas_url, "cmr": self.settings.cmr_url,
             "logs": str(self.home / "logs")}
        ))
        written.replace(self.home / STATE_FILE)
        return self

    def _settings(self) -> Settings:
        env = dict(self.env)
        env[env_name("storage_connection")] = self.connection
        own: dict[str, object] = {"storage_account": "", "mail_mode": "smtp", "smtp_host": "127.0.0.1",
                                  "smtp_port": self.mail.port}
        if self.namespace:
            own["namespace"] = self.namespace
        if not env.get(env_name("portal_url")) and self._api_socket is not None:  # its own page, at the API's root
            own["portal_url"] = "http://{}:{}/".format(*self._api_socket.getsockname()[:2])
        if not env.get(env_name("mail_allowed")):  # its SMTP server keeps what it receives: mail anyone
            own["mail_allowed"] = "*"
        if not env.get(env_name("stac_url")):
            own |= {"stac_url": self.planetary.stac_url, "stac_sas_url": self.planetary.sas_url}
        if not env.get(env_name("cmr_url")):
            own |= {"cmr_url": self.nasa.cmr_url, "earthdata_token": self.nasa.token,
                    "earthdata_hosts": self.nasa.hosts}
        return Settings.from_env(env).with_(**own, **self.overrides)

    def _kept_ports(self) -> dict[str, int]:
        """The ports of the imitations' storage and archive at the last start in this home:
        a granule's href, kept in the rows of the tasks planned before a restart, still
        names a file the stack serves (as Planetary Computer's and NASA's hrefs stay valid)."""
        try:
            return {k: int(v) for k, v in json.loads((self.home / PORTS_FILE).read_text()).items()}
        except (OSError, ValueError, TypeError, AttributeError):
            return {}

    def _start_api(self) -> None:
        self._api = Served(create_app(self.settings), name="api", sock=self._api_socket).start()
        self.api_url = self._api.url

    def worker_env(self) -> dict[str, str]:
        """A worker's environment: the deployment's settings, and none of the shell's secrets
        (nor the admin's token, which only the CLI reads, from its file)."""
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
        return keep | self.settings.with_(log_format="json").to_env()

    def start_worker(self, index: int) -> subprocess.Popen[bytes]:
        log_file = open(self.home / "logs" / f"worker-{index}.log", "ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "bagpipe.cli", "worker", "--slots", str(self.slots)],
            env=self.worker_env(), stdout=log_file, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=self._held(),
        )
        log_file.close()
        if index < len(self._workers):
            self._workers[index] = process
        else:
            self._workers.append(process)
        return process

    def _supervise(self) -> None:
        """Start a fresh worker for one that exits asking to be replaced (found slow, it
        drained: its machine is the problem, as a VM would be)."""
        while self._supervising.is_set():
            for index, process in enumerate(list(self._workers)):
                if process.poll() == REPLACE_EXIT and self._supervising.is_set():
                    log.info("worker %d exited (%s): starting a fresh one", index, process.returncode)
                    self.start_worker(index)
                    self.replaced += 1
            time.sleep(0.5)

    def wait_for_workers(self, timeout: float = 120) -> None:
        """Wait until every worker has its slots' stage processes running (its log says it
        is ready): a benchmark then measures tasks, not start-up."""
        deadline = time.monotonic() + timeout
        for index in range(len(self._workers)):
            log_file = self.home / "logs" / f"worker-{index}.log"
            while not READY.search(log_file.read_text(errors="replace")):
                if time.monotonic() > deadline or self._workers[index].poll() is not None:
                    raise RuntimeError(f"worker {index} did not get ready (see {log_file})")
                time.sleep(0.2)

    @property
    def headers(self) -> dict[str, str]:
        """The headers that sign a request in as the stack's admin."""
        return {names.TOKEN_HEADER: self.token}

    @property
    def worker_processes(self) -> list[subprocess.Popen[bytes]]:
        return list(self._workers)

    def stop(self) -> None:
        """Stop workers (SIGTERM: they finish what they hold), the loops, SMTP, Azurite."""
        started = time.monotonic()
        self._supervising.clear()
        for process in self._workers:
            if process.poll() is None:
                process.terminate()
        for process in self._workers:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._stop.set()
        if self._api is not None:
            self._api.stop()
        for thread in self._threads:
            thread.join(30)
        clients_for(self.settings).close()  # idle connections would hold Azurite's shutdown
        self.mail.stop()
        self.planetary.stop()
        self.nasa.stop()
        if self.azurite is not None:
            self.azurite.stop()
        (self.home / STATE_FILE).unlink(missing_ok=True)
        if self._lock is not None:
            self._lock.close()  # the home is free for the next start
            self._lock = None
        log.info("local stack stopped in %.1f s", time.monotonic() - started)

    def _hold_home(self) -> None:
        """Take the home's lock, or refuse to start: a second stack in a running one's home
        would start a second Azurite on its files, take new ports and, stopping, remove the
        first one's state file. Azurite and the workers inherit the lock, so that it is held
        while anything the stack started runs (its process killed, they may go on); a home
        whose file system has no locks is used without one, with a warning."""
        path = self.home / LOCK_FILE
        lock = path.open("ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            holders = ", ".join(map(str, _holders(path))) or "unknown"
            raise StackRunning(f"a local stack runs in {self.home} already, or what it started does (processes "
                               f"{holders}): stop it, or give this one another --home") from None
        except OSError as exc:
            log.warning("%s cannot be locked (%s): nothing stops a second stack in this home", path, exc)
        self._lock = lock

    def _held(self) -> tuple[int, ...]:
        """The descriptors the stack's processes inherit: its lock on the home."""
        return (self._lock.fileno(),) if self._lock is not None else ()


    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _holders(path: Path) -> list[int]:
    """The processes that have ``path`` open (Linux's /proc), this one aside."""
    found, named, mine = [], str(path.resolve()), os.getpid()
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            if os.readlink(fd) == named and int(fd.parts[2]) != mine:
                found.append(int(fd.parts[2]))
        except OSError:
            continue
    return sorted(set(found))

"""Azurite, the Azure Storage emulator, as a child process on free ports in disk mode."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# Azurite's well-known development account (public, documented by Microsoft).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
REPO = Path(__file__).resolve().parents[1]
LISTENING = re.compile(r"Azurite (Blob|Queue|Table) service is successfully listening at http://127\.0\.0\.1:(\d+)\r?\n")


def azurite_command() -> str:
    """The azurite launcher: BAGPIPE_AZURITE, the repo's npm install, or the PATH."""
    for candidate in (os.environ.get("BAGPIPE_AZURITE"), str(REPO / "node_modules/.bin/azurite"),
                      shutil.which("azurite")):
        if candidate and Path(candidate).exists():
            return candidate
    raise FileNotFoundError("azurite not found: run `make setup` (npm install) first")


@dataclass
class Azurite:
    """One Azurite process serving blob, queue and table storage from ``location``."""

    location: Path
    blob_port: int = 0
    queue_port: int = 0
    table_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    hold: tuple[int, ...] = ()  # descriptors it inherits (the local stack's lock on its home: held while it runs)
    access_log: bool = False  # every request it serves a line of its log (common log format), to count them

    @property
    def connection_string(self) -> str:
        base = "http://127.0.0.1"
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint={base}:{self.blob_port}/{ACCOUNT};"
            f"QueueEndpoint={base}:{self.queue_port}/{ACCOUNT};"
            f"TableEndpoint={base}:{self.table_port}/{ACCOUNT};"
        )

    def start(self, timeout: float = 60) -> Azurite:
        """Start Azurite on its ports; those still 0 it picks itself and names in its log, so
        that no other process can take one between its choice and its listening (as one
        could take a port found free and let go). A restart keeps the ports it had."""
        self.location.mkdir(parents=True, exist_ok=True)
        log_path = self.location / "azurite.log"
        log = open(log_path, "ab")
        written = log.tell()  # the log of this start begins here (a restart appends to it)
        self.process = subprocess.Popen(
            [
                azurite_command(), "--location", str(self.location),
                "--blobHost", "127.0.0.1", "--blobPort", str(self.blob_port),
                "--queueHost", "127.0.0.1", "--queuePort", str(self.queue_port),
                "--tableHost", "127.0.0.1", "--tablePort", str(self.table_port),
                "--skipApiVersionCheck", "--loose", "--disableProductStyleUrl", "--disableTelemetry",
                *(() if self.access_log else ("--silent",)),
            ],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, pass_fds=self.hold,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while len(ports := dict(LISTENING.findall(log_path.read_bytes()[written:].decode(errors="replace")))) < 3:
            if self.process.poll() is not None:
                raise RuntimeError(f"azurite exited early; see {log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"azurite did not listen; see {log_path}")
            time.sleep(0.05)
        self.blob_port, self.queue_port, self.table_port = (int(ports[s]) for s in ("Blob", "Queue", "Table"))
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

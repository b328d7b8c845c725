"""A real SMTP server for the local stack (aiosmtpd) that keeps every message it receives
as an ``.eml`` file."""

from __future__ import annotations

import email
import email.policy
import threading
from email.message import EmailMessage
from pathlib import Path

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from bagpipe.azurite import free_port


class _Store:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.lock = threading.Lock()
        self.count = len(list(folder.glob("*.eml")))

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        with self.lock:
            self.count += 1
            path = self.folder / f"{self.count:05d}.eml"
        path.write_bytes(envelope.original_content or envelope.content)  # type: ignore[arg-type]  # bytes: aiosmtpd decodes nothing by default
        return "250 Message accepted for delivery"


class MailServer:
    """SMTP on 127.0.0.1 (a free port unless given), storing messages in ``folder``."""

    def __init__(self, folder: Path, port: int = 0) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.port = port or free_port()
        self._controller = Controller(_Store(folder), hostname="127.0.0.1", port=self.port)

    def start(self) -> MailServer:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()

    def messages(self) -> list[tuple[Path, EmailMessage]]:
        """Every stored message, oldest first."""
        found = []
        for path in sorted(self.folder.glob("*.eml")):
            parsed = email.message_from_bytes(path.read_bytes(), policy=email.policy.default)
            found.append((path, parsed))  # type: ignore[arg-type]  # policy.default parses into EmailMessage
        return found

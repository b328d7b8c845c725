"""A real SMTP server for the local stack (aiosmtpd) that keeps every message it receives
as an ``.eml`` file."""

from __future__ import annotations

import asyncio
import email
import email.policy
import socket
import threading
from collections.abc import Awaitable
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from bagpipe.serving import bound


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


class _HeldPort(Controller):
    """aiosmtpd's threaded controller serving on a socket bound beforehand (``serving.bound``),
    through the hook aiosmtpd leaves for it (``_create_server``): its port is held from the
    moment the server is made, as the stack's other servers hold theirs."""

    def __init__(self, handler: Any, held: socket.socket) -> None:
        self.held = held
        host, port = held.getsockname()[:2]
        super().__init__(handler, hostname=host, port=port)

    def _create_server(self) -> Awaitable[asyncio.AbstractServer]:
        return self.loop.create_server(self._factory_invoker, sock=self.held, ssl=self.ssl_context)


class MailServer:
    """SMTP on a free port of 127.0.0.1, storing messages in ``folder``."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self._controller = _HeldPort(_Store(folder), bound("127.0.0.1"))
        self.port = self._controller.port

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

"""The fork server's stage processes start with every built-in stage imported: made once in
the server, not again in each process. (This module imports nothing of the stages itself:
a stage process unpickles its target from here.)"""

from __future__ import annotations

import socket
import sys
from multiprocessing.connection import Connection

from worker import child
from worker.forkserver import ForkServer


def modules_loaded(conn: Connection, names: list[str]) -> None:
    """A stage process's target: which of ``names`` it has imported when it starts."""
    conn.send([name for name in names if name in sys.modules])


def test_a_stage_process_starts_with_every_builtin_stage_imported() -> None:
    wanted = child.BUILTIN_STAGE_MODULES.split(",")
    server = ForkServer()
    try:
        mine, theirs = socket.socketpair()
        with theirs:
            process = server.spawn(modules_loaded, (wanted,), theirs)
        with Connection(mine.detach()) as conn:
            assert conn.poll(60), "the stage process said nothing"
            found = conn.recv()
        process.join(30)
        assert process.exitcode == 0
    finally:
        server.close()
    assert found == wanted

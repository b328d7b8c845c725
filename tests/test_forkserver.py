"""The fork server's stage processes start with every built-in stage imported: made once in
the server, not again in each process. (This module imports nothing of the stages itself:
a stage process unpickles its target from here.)"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from worker import child
from worker.forkserver import ForkServer


def modules_loaded(conn: Connection, names: list[str]) -> None:
    """A stage process's target: which of ``names`` it has imported when it starts."""
    conn.send([name for name in names if name in sys.modules])


def modules_a_table_imports(conn: Connection) -> None:
    """A stage process's target: the modules its first Arrow table imports."""
    import pyarrow as pa

    before = set(sys.modules)
    pa.table({"zone": ["a"], "sum_w": [1.0]})
    conn.send(sorted(set(sys.modules) - before))


def in_a_stage_process(target: Callable[..., None], *args: Any) -> Any:
    """What ``target`` sends from a stage process of a fork server of its own."""
    server = ForkServer()
    try:
        mine, theirs = socket.socketpair()
        with theirs:
            process = server.spawn(target, args, theirs)
        with Connection(mine.detach()) as conn:
            assert conn.poll(60), "the stage process said nothing"
            found = conn.recv()
        process.join(30)
        assert process.exitcode == 0
    finally:
        server.close()
    return found


def test_a_stage_process_starts_with_every_builtin_stage_imported() -> None:
    wanted = child.BUILTIN_STAGE_MODULES.split(",")
    assert in_a_stage_process(modules_loaded, wanted) == wanted


def test_a_stage_process_makes_its_first_table_with_no_import() -> None:
    """pyarrow imports pandas at its first array (to tell pandas' objects apart): 0.2 to 0.5
    s of a zonal, point or gather task in a new stage process, were it not made in the
    server."""
    assert in_a_stage_process(modules_a_table_imports) == []

"""Keep a worker's processes to themselves: not dumpable, so that no other process of the
same user can read their environment or memory through ``/proc`` (or attach a debugger).

The worker, its fork server (which imports this module first, see ``worker.forkserver``) and
its stage processes hold the storage identity; a scientist's program runs in a cell of its own
(``pipeline.reduction.jail``) that cannot see them at all where the kernel gives namespaces, and where it
does not, this is what keeps the worker's secrets from it.
"""

from __future__ import annotations

import ctypes

PR_SET_DUMPABLE, PR_GET_DUMPABLE = 4, 3
_libc = ctypes.CDLL(None, use_errno=True)


def make_private() -> None:
    """Make this process not dumpable (inherited by its forks, reset by ``execve``)."""
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def is_private() -> bool:
    return bool(_libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)


make_private()  # on import: the fork server's only hook is the modules it preloads

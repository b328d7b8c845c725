"""The first process of a sandboxed program: it builds the program's cell, then runs it.

Run as ``python -I -S jail.py CONFIG`` by :mod:`pipeline.reduction.sandbox` (the standard library only:
it must start fast and import nothing of the worker's). CONFIG is JSON: ``argv``,
``writable`` and ``readable`` folders, ``limits``, ``network``, ``parent`` (the pid whose death
kills the cell), ``cgroup``, ``nproc``.

The cell, where the kernel allows it (root, or unprivileged user namespaces):

- a PID namespace: the program is a child of a small init that forwards SIGTERM to it and
  reaps; when the program ends, or the init dies (the jail, the stage process, the worker:
  each dies with its parent), the kernel kills everything left in it — a ``setsid()`` or a
  double fork escapes nothing;
- a mount namespace with its own ``/proc``: the worker's processes, their environment and
  memory are not there to read;
- a network namespace with no interface up, unless the manifest asks for the network;
- Landlock: reads only of the system's folders, Python, the program's own folder and its
  inputs; writes only to its output and temporary folders; no TCP without the network;
- as root, no capabilities and no way to regain them (securebits), so uid 0 is only a
  number; the resource limits last, just before ``execve``.

Where namespaces are refused (a container without user namespaces) the program runs in the
jail's own process, with everything else but the PID, mount and network namespaces: it still
dies with its stage (parent-death signal) and the worker's processes are not dumpable.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
from typing import Any

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 1, 38, 24, 28
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
SECURE_ALL = 0xEF  # NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE with their locks; KEEP_CAPS locked off
LANDLOCK = (444, 445, 446)  # create_ruleset, add_rule, restrict_self (every architecture)
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
FS_WRITE = sum(1 << bit for bit in range(1, 13) if bit not in (2, 3)) | (1 << 13) | (1 << 14)  # + refer, truncate
NET_ALL = (1 << 0) | (1 << 1)  # bind and connect over TCP (Landlock ABI 4)
SYSTEM = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/opt", "/sys", "/dev", "/proc")

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        raise OSError(ctypes.get_errno(), what)
    return result


# --- Landlock --------------------------------------------------------------------------
class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 if it has none."""
    return max(0, int(libc.syscall(LANDLOCK[0], None, 0, 1)))


def landlock(readable: list[str], writable: list[str], network: bool) -> None:
    """Reads only beneath ``readable`` (and the system's folders), writes only beneath
    ``writable`` (and /dev/null), TCP only if ``network``: for this process and all it starts."""
    abi = landlock_abi()
    if abi == 0:
        return
    handled = FS_READ | (FS_WRITE if abi >= 3 else FS_WRITE & ~(1 << 14))
    if abi < 2:
        handled &= ~(1 << 13)
    net = NET_ALL if abi >= 4 and not network else 0
    attr = _RulesetAttr(handled, net)
    size = ctypes.sizeof(attr) if abi >= 4 else ctypes.sizeof(ctypes.c_uint64)
    ruleset = _check(libc.syscall(LANDLOCK[0], ctypes.byref(attr), size, 0), "landlock_create_ruleset")

    def allow(path: str, access: int) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return  # a system folder this machine does not have
        try:
            rule = _PathBeneath(access & handled, fd)
            _check(libc.syscall(LANDLOCK[1], ruleset, 1, ctypes.byref(rule), 0), f"landlock_add_rule {path}")
        finally:
            os.close(fd)

    for path in (*SYSTEM, *readable):
        allow(path, FS_READ)
    allow("/dev/null", FS_READ_FILE | FS_WRITE_FILE)
    for path in writable:
        allow(path, FS_READ | FS_WRITE)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc.syscall(LANDLOCK[2], ruleset, 0), "landlock_restrict_self")
    os.close(ruleset)


# --- the program's own process, just before execve ----------------------------------------
def _drop_capabilities() -> None:
    """As root: keep uid 0 but no capability, now or after execve (securebits)."""
    if os.geteuid() != 0:
        return
    _check(libc.prctl(PR_SET_SECUREBITS, SECURE_ALL, 0, 0, 0), "securebits")
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 and ctypes.get_errno() == 22:  # EINVAL: no such cap
            break
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3: all zero
    _check(libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")


def _exec(config: dict[str, Any]) -> None:
    """Become the program: limits, confinement, then execve (never returns)."""
    limits = config["limits"]
    if config.get("nproc"):
        resource.setrlimit(resource.RLIMIT_NPROC, (config["nproc"], config["nproc"]))
    landlock(config["readable"], config["writable"], config["network"])
    _drop_capabilities()
    mb = 1024 * 1024
    for which, value in ((resource.RLIMIT_CPU, limits["cpu_s"]), (resource.RLIMIT_FSIZE, limits["file_mb"] * mb),
                         (resource.RLIMIT_NOFILE, limits["open_files"]), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_AS, limits["memory_mb"] * mb)):
        resource.setrlimit(which, (value, value))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        os.execvp(config["argv"][0], config["argv"])
    except OSError as exc:
        os.write(2, f"could not start {config['argv'][0]!r}: {exc}\n".encode())
        os._exit(127)


# --- the cell ------------------------------------------------------------------------------
def _die_with_parent(parent: int) -> None:
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    if os.getppid() != parent:  # it died before the signal was asked for
        os._exit(137)


def _parent_gone(life: int) -> bool:
    """Whether the parent holding the write end of the pipe ``life`` has died (from inside a
    PID namespace, where the parent's pid cannot be seen)."""
    import select

    poller = select.poll()
    poller.register(life, select.POLLIN)
    return bool(poller.poll(0))  # only EOF (POLLHUP) can come: nobody writes


def _enter_namespaces(network: bool) -> bool:
    """A PID, mount and (unless ``network``) network namespace for the children of this
    process; through a user namespace when not root. False if the kernel refuses."""
    flags = CLONE_NEWPID | CLONE_NEWNS | (0 if network else CLONE_NEWNET)
    uid, gid = os.getuid(), os.getgid()
    if uid != 0:
        flags |= CLONE_NEWUSER
    if libc.unshare(flags) < 0:
        return False
    if uid != 0:  # the same ids inside: no one is root in there
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    return True


def _init(config: dict[str, Any], status_fd: int, life: int) -> None:
    """Pid 1 of the cell: a fresh /proc, then the program as its child; forward SIGTERM,
    reap, and report the program's wait status when it ends (the kernel then kills all
    that is left in the cell)."""
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    if _parent_gone(life):
        os._exit(137)
    os.close(life)
    try:
        _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount private")
        _check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
    except OSError as exc:  # /proc stays the host's: the worker is still not readable (not dumpable)
        os.write(2, f"jail: no private /proc ({exc})\n".encode())
    program = os.fork()
    if program == 0:
        os.close(status_fd)
        _exec(config)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(program, signal.SIGTERM))
    signal.signal(signal.SIGINT, lambda *_: os.kill(program, signal.SIGINT))
    while True:
        pid, status = os.wait()
        if pid == program:
            os.write(status_fd, str(status).encode())
            os._exit(0)


def main() -> None:
    config = json.loads(sys.argv[1])
    _die_with_parent(config["parent"])
    if config.get("cgroup"):
        with open(os.path.join(config["cgroup"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    if not _enter_namespaces(config["network"]):
        _exec(config)  # no cell: the program in this very process, which dies with its parent
    signal.signal(signal.SIGTERM, lambda *_: None)  # the init and the program get theirs from the group
    read_end, write_end = os.pipe()
    life, alive = os.pipe()  # held open by this process as long as it lives
    init = os.fork()
    if init == 0:
        os.close(read_end)
        os.close(alive)
        _init(config, write_end, life)
    os.close(write_end)
    os.close(life)
    os.waitpid(init, 0)
    reported = os.read(read_end, 64)
    status = int(reported) if reported else 9  # the init was killed: so was the program
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.WIFSIGNALED(status):  # end the same way, so that the sandbox sees how the program ended
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()

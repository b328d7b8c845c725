"""The first process of a sandboxed program: it builds the program's cell, then runs it.

Run as ``python -I -S jail.py CONFIG`` by :mod:`pipeline.reduction.sandbox` (the standard library only:
it must start fast and import nothing of the worker's). CONFIG is JSON: ``argv``,
``writable`` and ``readable`` paths, ``limits``, ``namespaces`` (whether to build the cell in
namespaces of its own, or without: the sandbox decides), ``landlock`` (the ABI to use),
``network`` (whether the program gets the sandbox's proxy; ``channel``: the socket to hand its
listening socket out on), ``parent`` (the pid whose death kills the cell), ``grace_s``
(between SIGTERM and SIGKILL, without namespaces), ``cgroup``, ``nproc``. ``python -I -S
jail.py --probe`` prints what this kernel gives instead: ``{"namespaces", "landlock",
"seccomp"}``.

Everywhere, just before ``execve``:

- Landlock: reads only of the program's own folders, its inputs, Python, the system's
  programs and libraries (``/usr``, ``/lib``, ``/bin``…), the few files of ``/etc`` a program
  needs (``ETC``: not ``/etc/shadow``), ``/dev/null`` and the random devices — not ``/sys``,
  not ``/dev/shm``, not another process's ``/proc``; writes only to its output and temporary
  folders; no TCP (with the network: a connection to the proxy's port only); where the
  kernel has them (ABI 6), no signal and no abstract UNIX socket outside its own domain;
- seccomp (``seccomp_filter``): no socket but TCP/UDP with the network (never a UNIX one: a
  socket of the host's, in its file system, is reached by its path whatever the
  namespaces), no ``connect`` without the network, no ``ptrace``, ``process_vm_readv`` and its
  kin, no io_uring (whose requests seccomp does not see), no new namespaces, no mounts, no
  keyrings, no System V IPC;
- as root, no capabilities and no way to regain them (securebits), so uid 0 is only a
  number; the resource limits last.

With ``namespaces`` (the kernel allows them: root, or unprivileged user namespaces):

- a PID namespace: the program is a child of a small init that forwards SIGTERM to it and
  reaps; when the program ends, or the init dies (the jail, the stage process, the worker:
  each dies with its parent), the kernel kills everything left in it — a ``setsid()`` or a
  double fork escapes nothing;
- a mount namespace with its own ``/proc``, which it may read: only its cell's processes;
- a network namespace of its own, and an IPC namespace: the host's loopback, its abstract
  sockets and shared memory are not there; with the network, its loopback is up and holds
  only the proxy's listening socket, made here and handed to the sandbox, which relays
  to the hosts the reducer lists (``pipeline.reduction.proxy``).

Without them (a container without user namespaces), the program sees the host's processes,
so it gets, on top of the above: no ``/proc`` at all but a few files of the machine's
(``PROC_FILES``), no way to change another process's limits, scheduling or priority
(``prlimit``, ``sched_setaffinity``, ``setpriority``… only its own), and where Landlock cannot
scope signals (ABI < 6), signals only to itself and its own process group; no network. It
runs as a child of this process, in a process group of its own; this process, the subreaper
of all it starts, kills every process left below it when the program ends, and ends it all
when SIGTERM comes or when the stage that started it dies (``_alone``). The worker's
processes are not dumpable (``worker/private.py``).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import platform
import resource
import signal
import socket
import stat
import struct
import sys
from typing import Any

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
CLONE_NEWIPC, CLONE_NEWUTS, CLONE_NEWCGROUP = 0x08000000, 0x04000000, 0x02000000
NEW_NAMESPACES = (CLONE_NEWNS | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
                  | CLONE_NEWCGROUP)
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_SECCOMP = 1, 38, 24, 28, 22
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, PR_SET_CHILD_SUBREAPER = 47, 4, 36
SECURE_ALL = 0xEF  # NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE with their locks; KEEP_CAPS locked off
LANDLOCK = (444, 445, 446)  # create_ruleset, add_rule, restrict_self (every architecture)
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
FS_WRITE = sum(1 << bit for bit in range(1, 13) if bit not in (2, 3)) | (1 << 13) | (1 << 14)  # + refer, truncate
FS_TRUNCATE = 1 << 14  # Landlock ABI 3
FS_FILE = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE  # the rights a rule on a file (not a folder) may hold
NET_BIND, NET_CONNECT = 1 << 0, 1 << 1  # TCP (Landlock ABI 4)
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1  # Landlock ABI 6
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
# what any program may read besides its own folders and Python: programs and libraries, and of
# /etc only what a program needs (the loader's cache, time zone, certificates, names of users)
SYSTEM = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/opt")
ETC = ("/etc/ld.so.cache", "/etc/localtime", "/etc/timezone", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf",
       "/etc/host.conf", "/etc/gai.conf", "/etc/mime.types", "/etc/os-release", "/etc/ssl/certs",
       "/etc/ssl/openssl.cnf", "/etc/ca-certificates", "/etc/pki/tls/certs", "/etc/pki/ca-trust", "/etc/fonts")
DEVICES = ("/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")  # and /dev/null, read and written
PROC_FILES = ("/proc/cpuinfo", "/proc/meminfo", "/proc/stat")  # of the host's /proc, without namespaces
LOOPBACK_UP = (1 | 8 | 0x40)  # IFF_UP | IFF_LOOPBACK | IFF_RUNNING
SIOCSIFFLAGS = 0x8914

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        raise OSError(ctypes.get_errno(), what)
    return result


# --- Landlock --------------------------------------------------------------------------
class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPort(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 if it has none."""
    return max(0, int(libc.syscall(LANDLOCK[0], None, 0, 1)))


def landlock(abi: int, readable: list[str], writable: list[str], port: int | None) -> None:
    """Reads only beneath ``readable``, writes only beneath ``writable`` (and /dev/null), TCP
    only to ``port`` (none if None), and from ABI 6 no signal or abstract UNIX socket out of
    the domain: for this process and all it starts. ``abi``: the Landlock ABI to use."""
    handled = FS_READ | (FS_WRITE if abi >= 3 else FS_WRITE & ~(1 << 14))
    if abi < 2:
        handled &= ~(1 << 13)
    attr = _RulesetAttr(handled, NET_BIND | NET_CONNECT if abi >= 4 else 0,
                        SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL if abi >= 6 else 0)
    size = ctypes.sizeof(attr) if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = _check(libc.syscall(LANDLOCK[0], ctypes.byref(attr), size, 0), "landlock_create_ruleset")

    def allow(path: str, access: int) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return  # a system path this machine does not have
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                access &= FS_FILE
            rule = _PathBeneath(access & handled, fd)
            _check(libc.syscall(LANDLOCK[1], ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), 0),
                   f"landlock_add_rule {path}")
        finally:
            os.close(fd)

    for path in readable:
        allow(path, FS_READ)
    allow("/dev/null", FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE)
    for path in writable:
        allow(path, FS_READ | FS_WRITE)
    if port is not None and abi >= 4:
        net = _NetPort(NET_CONNECT, port)
        _check(libc.syscall(LANDLOCK[1], ruleset, RULE_NET_PORT, ctypes.byref(net), 0), "landlock_add_rule port")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc.syscall(LANDLOCK[2], ruleset, 0), "landlock_restrict_self")
    os.close(ruleset)


# --- seccomp -------------------------------------------------------------------------------
# syscall numbers: x86_64 (arch/x86/entry/syscalls/syscall_64.tbl) and the generic table of arm64
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SYSCALLS = {
    "x86_64": {
        "socket": 41, "connect": 42, "clone": 56, "clone3": 435, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "process_madvise": 440, "kcmp": 312, "pidfd_getfd": 438, "pidfd_open": 434,
        "pidfd_send_signal": 424, "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129,
        "rt_tgsigqueueinfo": 297, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 321,
        "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249,
        "move_pages": 279, "migrate_pages": 256, "prlimit64": 302, "setpriority": 141, "sched_setaffinity": 203,
        "sched_setparam": 142, "sched_setscheduler": 144, "sched_setattr": 314, "ioprio_set": 251, "shmget": 29,
        "shmat": 30, "shmctl": 31, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "semget": 64,
        "semop": 65, "semctl": 66, "semtimedop": 220,
    },
    "aarch64": {
        "socket": 198, "connect": 203, "clone": 220, "clone3": 435, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "process_madvise": 440, "kcmp": 272, "pidfd_getfd": 438, "pidfd_open": 434,
        "pidfd_send_signal": 424, "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138,
        "rt_tgsigqueueinfo": 240, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 280,
        "perf_event_open": 241, "userfaultfd": 282, "keyctl": 219, "add_key": 217, "request_key": 218,
        "move_pages": 239, "migrate_pages": 238, "prlimit64": 261, "setpriority": 140, "sched_setaffinity": 122,
        "sched_setparam": 118, "sched_setscheduler": 119, "sched_setattr": 274, "ioprio_set": 30, "shmget": 194,
        "shmat": 196, "shmctl": 195, "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "semget": 190,
        "semop": 193, "semctl": 191, "semtimedop": 192,
    },
}
REFUSED = ("ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "kcmp", "pidfd_getfd", "unshare",
           "setns", "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount",
           "fspick", "mount_setattr", "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf",
           "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "move_pages", "migrate_pages",
           "shmget", "shmat", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semctl",
           "semtimedop")
OWN_PROCESS_FIRST = ("prlimit64", "sched_setaffinity", "sched_setparam", "sched_setscheduler", "sched_setattr")
SIGNALS = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")  # ... to itself only, without namespaces
SIGNALS_REFUSED = ("tkill", "pidfd_open", "pidfd_send_signal")  # ... and these not at all
AF_INET, AF_INET6 = 2, 10
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1
SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ERRNO, SECCOMP_RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
NR, ARCH = 0, 4
X32_BIT = 0x40000000  # x86_64's x32 ABI: the same calls under other numbers


def _arg(index: int) -> int:
    """Offset in ``struct seccomp_data`` of an argument's low 32 bits (both architectures are
    little-endian; every argument checked here is an int, a pid or flags that fit in them)."""
    return 16 + 8 * index


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


# ("ld", offset) | ("jeq" / "jge" / "jset", k, label if true, label if false) | ("ret", k) | ("label", name)
Instruction = tuple[Any, ...]


def seccomp_program(machine: str, network: bool, own_pid: int | None, signals: bool) -> list[tuple[int, int, int, int]]:
    """The BPF program (code, jt, jf, k) of the filter: refuse (EPERM) what ``REFUSED`` names,
    clone3 (ENOSYS: the C library then uses clone, whose flags can be read), clone into new
    namespaces, every socket but TCP/UDP over IPv4/IPv6 when ``network`` (none otherwise),
    connect without ``network``. With ``own_pid`` (no PID namespace): the calls that act on
    another process by its pid only on 0 or ``own_pid``; with ``signals`` too, signals only to
    ``own_pid`` and its process group. Any other architecture is killed."""
    calls = SYSCALLS[machine]
    program: list[Instruction] = [("ld", ARCH), ("jeq", AUDIT_ARCH[machine], None, "foreign"), ("ld", NR)]
    if machine == "x86_64":
        program.append(("jge", X32_BIT, "deny", None))
    refused = [*REFUSED, *([] if network else ["connect"]), *(SIGNALS_REFUSED if signals else ())]
    program += [("jeq", calls[name], "deny", None) for name in refused]
    program += [("jeq", calls["clone3"], "nosys", None), ("jeq", calls["clone"], "clone", None),
                ("jeq", calls["socket"], "socket", None)]
    checked: list[tuple[str, list[Instruction]]] = []
    if own_pid is not None:
        this = own_pid & 0xFFFFFFFF
        for name in OWN_PROCESS_FIRST:
            checked.append((name, [("ld", _arg(0)), ("jeq", 0, "allow", None), ("jeq", this, "allow", "deny")]))
        for name, which in (("setpriority", PRIO_PROCESS), ("ioprio_set", IOPRIO_WHO_PROCESS)):
            checked.append((name, [("ld", _arg(0)), ("jeq", which, None, "deny"), ("ld", _arg(1)),
                                   ("jeq", 0, "allow", None), ("jeq", this, "allow", "deny")]))
        if signals:
            checked.append(("kill", [("ld", _arg(0)), ("jeq", 0, "allow", None), ("jeq", this, "allow", None),
                                     ("jeq", -own_pid & 0xFFFFFFFF, "allow", "deny")]))
            for name in ("tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
                checked.append((name, [("ld", _arg(0)), ("jeq", this, "allow", "deny")]))
    program += [("jeq", calls[name], name, None) for name, _ in checked]
    program.append(("ret", SECCOMP_RET_ALLOW))
    for name, body in checked:
        program += [("label", name), *body]
    program += [("label", "clone"), ("ld", _arg(0)), ("jset", NEW_NAMESPACES, "deny", "allow"),
                ("label", "socket")]
    if network:
        program += [("ld", _arg(0)), ("jeq", AF_INET, "allow", None), ("jeq", AF_INET6, "allow", "deny")]
    program += [("label", "deny"), ("ret", SECCOMP_RET_ERRNO | errno.EPERM),
                ("label", "nosys"), ("ret", SECCOMP_RET_ERRNO | errno.ENOSYS),
                ("label", "foreign"), ("ret", SECCOMP_RET_KILL_PROCESS),
                ("label", "allow"), ("ret", SECCOMP_RET_ALLOW)]
    return _assemble(program)


def _assemble(program: list[Instruction]) -> list[tuple[int, int, int, int]]:
    """Instructions with labels to BPF: a jump's target, a label or None (the next
    instruction), becomes its forward offset."""
    labels, index = {}, 0
    for instruction in program:
        if instruction[0] == "label":
            assert instruction[1] not in labels, f"label {instruction[1]} twice"
            labels[instruction[1]] = index
        else:
            index += 1
    code: list[tuple[int, int, int, int]] = []
    for instruction in program:
        kind = instruction[0]
        if kind == "label":
            continue
        if kind == "ld":
            code.append((LD_W_ABS, 0, 0, instruction[1]))
        elif kind == "ret":
            code.append((RET_K, 0, 0, instruction[1]))
        else:
            here = len(code) + 1
            jumps = [0 if target is None else labels[target] - here for target in instruction[2:]]
            assert all(0 <= jump < 256 for jump in jumps), "a jump too far for BPF"
            code.append(({"jeq": JEQ_K, "jge": JGE_K, "jset": JSET_K}[kind], jumps[0], jumps[1], instruction[1]))
    return code


def seccomp(program: list[tuple[int, int, int, int]]) -> None:
    """Install the filter for this process and all it starts (no_new_privs is set first)."""
    filters = (_SockFilter * len(program))(*(_SockFilter(*instruction) for instruction in program))
    fprog = _SockFprog(len(program), filters)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc.prctl(PR_SET_SECCOMP, 2, ctypes.byref(fprog), 0, 0), "seccomp")  # SECCOMP_MODE_FILTER


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


def _exec(config: dict[str, Any], own_proc: bool) -> None:
    """Become the program: limits, confinement, then execve (never returns). ``own_proc``:
    /proc is the cell's own (else none of it is read but ``PROC_FILES``)."""
    limits, port = config["limits"], config.get("port")
    env = dict(os.environ)
    if port is not None:
        proxy = f"http://127.0.0.1:{port}"
        env |= {"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "http_proxy": proxy, "https_proxy": proxy}
    try:
        if config.get("nproc"):
            resource.setrlimit(resource.RLIMIT_NPROC, (config["nproc"], config["nproc"]))
        readable = [*SYSTEM, *ETC, *DEVICES, *(["/proc"] if own_proc else PROC_FILES), *config["readable"]]
        landlock(config["landlock"], readable, config["writable"], port)
        _drop_capabilities()
        mb = 1024 * 1024
        for which, value in ((resource.RLIMIT_CPU, limits["cpu_s"]), (resource.RLIMIT_FSIZE, limits["file_mb"] * mb),
                             (resource.RLIMIT_NOFILE, limits["open_files"]), (resource.RLIMIT_CORE, 0),
                             (resource.RLIMIT_AS, limits["memory_mb"] * mb)):
            resource.setrlimit(which, (value, value))
        alone = not config["namespaces"]
        seccomp(seccomp_program(platform.machine(), port is not None, os.getpid() if alone else None,
                                alone and config["landlock"] < 6))
    except OSError as exc:  # never run unconfined
        os.write(2, f"jail: could not confine the program ({exc})\n".encode())
        os._exit(126)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        os.execvpe(config["argv"][0], config["argv"], env)
    except OSError as exc:
        os.write(2, f"could not start {config['argv'][0]!r}: {exc}\n".encode())
        os._exit(127)


# --- the cell ------------------------------------------------------------------------------
def _die_with_parent(parent: int, sig: int) -> None:
    """``sig`` to this process when its parent dies."""
    _check(libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0), "pdeathsig")
    if os.getppid() != parent:  # it died before the signal was asked for
        os._exit(137)


def _parent_gone(life: int) -> bool:
    """Whether the parent holding the write end of the pipe ``life`` has died (from inside a
    PID namespace, where the parent's pid cannot be seen)."""
    import select

    poller = select.poll()
    poller.register(life, select.POLLIN)
    return bool(poller.poll(0))  # only EOF (POLLHUP) can come: nobody writes


def _enter_namespaces() -> bool:
    """A PID namespace for the children of this process; a mount, network and IPC namespace
    for it and them; through a user namespace when not root (or when root may not make them
    without one: a container without CAP_SYS_ADMIN). False if the kernel refuses."""
    flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC
    uid, gid = os.getuid(), os.getgid()
    if uid == 0 and libc.unshare(flags) == 0:
        return True
    if libc.unshare(flags | CLONE_NEWUSER) < 0:
        return False
    # the same ids inside: no one is root in there who was not outside
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    return True


def _proxy_port(channel: int) -> int:
    """In the cell's network namespace: bring its loopback up, listen on it, hand the
    listening socket to the sandbox over ``channel`` (which relays what it accepts to the
    listed hosts) and return its port."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as control:
        fcntl.ioctl(control, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", LOOPBACK_UP))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener, socket.socket(fileno=channel) as out:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        socket.send_fds(out, [b"listening"], [listener.fileno()])
        return int(listener.getsockname()[1])


def _init(config: dict[str, Any], status_fd: int, life: int) -> None:
    """Pid 1 of the cell: a fresh /proc, then the program as its child; forward SIGTERM,
    reap, and report the program's wait status when it ends (the kernel then kills all
    that is left in the cell)."""
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    if _parent_gone(life):
        os._exit(137)
    os.close(life)
    own_proc = True
    try:
        _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount private")
        _check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
    except OSError as exc:  # /proc stays the host's: the program reads none of it
        os.write(2, f"jail: no private /proc ({exc})\n".encode())
        own_proc = False
    program = os.fork()
    if program == 0:
        os.close(status_fd)
        _exec(config, own_proc)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(program, signal.SIGTERM))
    signal.signal(signal.SIGINT, lambda *_: os.kill(program, signal.SIGINT))
    while True:
        pid, status = os.wait()
        if pid == program:
            os.write(status_fd, str(status).encode())
            os._exit(0)


def probe() -> dict[str, Any]:
    """What this kernel gives a cell: namespaces (tried here, in this process, which then
    exits), the Landlock ABI, and seccomp filters (one that allows all, installed here)."""
    found: dict[str, Any] = {"namespaces": _enter_namespaces(), "landlock": landlock_abi()}
    try:
        seccomp([(RET_K, 0, 0, SECCOMP_RET_ALLOW)])
        found["seccomp"] = platform.machine() in SYSCALLS
    except OSError:
        found["seccomp"] = False
    return found


def _cell(config: dict[str, Any]) -> int:
    """The program in namespaces of its own, under their init; its wait status."""
    if not _enter_namespaces():
        os.write(2, b"jail: the kernel refused the cell's namespaces\n")
        os._exit(126)
    if config["network"]:
        config["port"] = _proxy_port(config["channel"])
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
    return int(reported) if reported else 9  # the init was killed: so was the program


def _alone(config: dict[str, Any]) -> int:
    """Without namespaces: the program as a child of this process, in a process group of its
    own, and this process the subreaper of all it starts (whatever leaves the program's
    session, or is orphaned, comes back to it), which is not confined but holds nothing.
    When the program ends, every process left below this one is killed. SIGTERM (the
    sandbox's timeout, or the death of the stage that started this process: its
    parent-death signal here) goes to the program's group, and the grace later, SIGKILL to
    all below. Its wait status."""
    _check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "subreaper")
    _die_with_parent(config["parent"], signal.SIGTERM)
    program = os.fork()
    if program == 0:
        os.setpgid(0, 0)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # were this process killed outright
        _exec(config, own_proc=False)
    try:
        os.setpgid(program, program)  # whichever of the two comes first
    except OSError:
        pass

    def stop(*_: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _signal_below(program, signal.SIGTERM)
        signal.alarm(max(1, int(config["grace_s"]) - 1))  # before the sandbox's SIGKILL, which would end only this

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGALRM, lambda *_: _signal_below(None, signal.SIGKILL))
    while True:
        pid, status = os.wait()  # the program, and the orphans that come back
        if pid == program:
            break
    while True:  # what it left: until none is left (each orphan comes back here as its parent dies)
        _signal_below(None, signal.SIGKILL)
        try:
            os.wait()
        except ChildProcessError:
            return status


def _signal_below(group: int | None, sig: int) -> None:
    """Send ``sig`` to the process group ``group``, or (None) to every process below this one,
    each through a pidfd taken while it still was (a pid freed meanwhile names nothing)."""
    if group is not None:
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            pass
        return
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parents[int(entry)] = _parent_of(int(entry))
    below, todo = [], [os.getpid()]
    while todo:
        parent = todo.pop()
        children = [pid for pid, of in parents.items() if of == parent]
        below += [(pid, parent) for pid in children]
        todo += children
    for pid, parent in below:
        try:
            handle = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if _parent_of(pid) == parent:
                signal.pidfd_send_signal(handle, sig)
        except OSError:
            pass
        finally:
            os.close(handle)


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def main() -> None:
    if sys.argv[1] == "--probe":
        print(json.dumps(probe()))
        return
    config = json.loads(sys.argv[1])
    _die_with_parent(config["parent"], signal.SIGKILL)
    if config.get("cgroup"):
        with open(os.path.join(config["cgroup"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    status = _cell(config) if config["namespaces"] else _alone(config)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.WIFSIGNALED(status):  # end the same way, so that the sandbox sees how the program ended
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()

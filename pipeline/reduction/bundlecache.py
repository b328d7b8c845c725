"""A worker's local cache of uploaded reducer bundles: each fetched once by its digest,
checked (the digest of what arrived, and every check an upload gets), unpacked read-only
into ``<cache>/<digest>/`` and reused by every later task — then run exactly as an
installed reducer is, with that folder as its ``{here}``.

Safe against concurrent slots (separate processes): one holds an exclusive ``flock`` on the
digest's lock file while it fetches, and a bundle appears in its final folder by one
``rename`` of a complete private copy, so no slot ever sees half a bundle. Each use checks the
folder's digest again (a bundle runs for other users too: a copy one program changed must
never run for the next), and one that changed is fetched anew. The cache root is
private to the worker's user (mode 700, owned by it, else refused): nobody else can plant a
folder under a digest's name. Folders unused for ``KEEP_S`` are removed when a new bundle
arrives (longer than any reduction may run, so none is removed under a running program).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import stat
import tempfile
import time
from pathlib import Path

from azure.core.exceptions import ResourceNotFoundError

from pipeline.failures import FailureClass, StageFailure
from pipeline.reduction import bundles, reducers
from pipeline.storage import names
from pipeline.storage.clients import Clients

KEEP_S = 2 * 86_400  # a reducer's timeout is at most a day


def root_of(setting: str) -> Path:
    """The cache root, made private if new; refused if another user could write in it."""
    root = Path(setting) if setting else Path(tempfile.gettempdir()) / f"bagpipe-bundles-{os.getuid()}"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = root.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise RuntimeError(f"{root}: the bundle cache must be a folder of this user's, writable by it alone")
    return root


def folder_for(clients: Clients, digest: str) -> Path:
    """The unpacked bundle of this digest, fetched and checked on first use."""
    root = root_of(clients.settings.bundle_cache)
    final = root / digest
    if final.is_dir() and _intact(final, digest):
        os.utime(final)  # the last use, for eviction
        return final
    with open(root / f"{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir() and not _intact(final, digest):
            _remove(final)  # changed since it was unpacked: fetched again, never run
        if not final.is_dir():
            _fetch(clients, digest, root, final)
    _evict(root, keep=final)
    return final


def _intact(folder: Path, digest: str) -> bool:
    """Whether the unpacked bundle is still exactly what was fetched (a program that ran from
    it may not write there, but where Landlock is missing nothing else stops it)."""
    try:
        return bundles.digest_of(folder) == digest
    except OSError:
        return False


def _fetch(clients: Clients, digest: str, root: Path, final: Path) -> None:
    try:
        data = fetch(clients, digest)
    except ResourceNotFoundError:
        raise StageFailure(FailureClass.USER_CODE, f"reducer bundle {digest[:12]} is no longer stored "
                           "(deleted after this job was submitted)") from None
    try:
        bundle = bundles.from_tar(data)
    except bundles.BundleError as exc:
        raise StageFailure(FailureClass.CORRUPT_BLOB, f"stored bundle {digest[:12]} is not valid: {exc}") from None
    if bundle.digest != digest:
        raise StageFailure(FailureClass.CORRUPT_BLOB, f"stored bundle {digest[:12]} has digest {bundle.digest[:12]}")
    private = root / f".{digest}.{secrets.token_hex(4)}"
    try:
        bundle.unpack(private)
        private.rename(final)
    finally:
        if private.exists():
            _remove(private)


def _evict(root: Path, keep: Path) -> None:
    cutoff = time.time() - KEEP_S
    for folder in root.iterdir():
        if folder.is_dir() and not folder.name.startswith(".") and folder != keep:
            try:
                if folder.stat().st_mtime < cutoff:
                    _remove(folder)
            except OSError:
                continue  # another slot removed it first


def _remove(folder: Path) -> None:
    """Remove an unpacked (read-only) bundle."""
    for path in [folder, *folder.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o700)
    shutil.rmtree(folder, ignore_errors=True)


def reducer_for(clients: Clients, digest: str) -> reducers.Reducer:
    """The reducer of an uploaded bundle, its ``{here}`` the bundle's cached folder."""
    return reducers.load(folder_for(clients, digest) / bundles.MANIFEST)


def fetch(clients: Clients, digest: str) -> bytes:
    """A stored bundle's archive (its MD5 checked on the way; its digest is the caller's to check)."""
    return clients.transfers.download(clients.bundles, names.bundle_blob(digest))[0]

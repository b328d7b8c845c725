"""A reducer bundle: a scientist's ``reducer.json`` and the program's files, uploaded as a
tar.gz (``bagpipe reducers push``) or as multipart form files (the portal).

Everything is checked before anything is stored, and a refusal names the problem: the
archive's unpacked size (a gzip bomb is stopped at the cap, never unpacked whole), each
member's type (regular files and folders only: no symbolic or hard links, devices or
FIFOs), its path (relative, no ``..``, no control characters), its size and the total, the
manifest (the same pydantic model as an installed reducer's, which refuses secret-looking
environment names; and no ``network``: an uploaded program never reaches the network), and
that the files the ``argv`` names under ``{here}`` are there.

The bundle's identity is the SHA-256 of its canonical form: the sorted list of (path,
executable bit, SHA-256 of the content). The same files give the same digest however they
were archived, uploaded or timestamped. What is stored is a canonical tar.gz of them (owner
root, time 0, mode 755 or 644), and a worker that fetches it checks the digest again.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import posixpath
import tarfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from pipeline.reduction import reducers

MANIFEST = "reducer.json"
MAX_MEMBER = 32 * 1024 * 1024  # one file
MAX_TOTAL = 64 * 1024 * 1024  # all files together
MAX_FILES = 512
MAX_PATH = 240
MAX_UNPACKED = MAX_TOTAL + (MAX_FILES + 16) * 2048  # the tar stream: the files, their headers, padding
MAX_UPLOAD = MAX_TOTAL + 1024 * 1024  # the request body of an upload (compressed, or multipart)
HERE = "{here}/"


class BundleError(ValueError):
    """A bundle refused before anything was stored: ``field`` is the member or manifest
    field at fault (for the API's answer)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


@dataclass(frozen=True)
class Bundle:
    """A validated bundle: its files by relative path (content, executable) and its reducer
    (``here`` is a placeholder until a worker unpacks it)."""

    files: dict[str, tuple[bytes, bool]]
    reducer: reducers.Reducer = field(compare=False)

    @cached_property
    def digest(self) -> str:
        return _digest((path, exe, data) for path, (data, exe) in self.files.items())

    @property
    def size(self) -> int:
        return sum(len(data) for data, _ in self.files.values())

    def archive(self) -> bytes:
        """The canonical tar.gz: sorted members, no owner, no time."""
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path, (data, exe) in sorted(self.files.items()):
                info = tarfile.TarInfo(path)
                info.size, info.mode, info.mtime = len(data), 0o755 if exe else 0o644, 0
                tar.addfile(info, io.BytesIO(data))
        return gzip.compress(raw.getvalue(), compresslevel=6, mtime=0)

    def unpack(self, folder: Path) -> None:
        """Write the files under ``folder`` (which must not exist), read-only."""
        folder.mkdir(mode=0o755)
        for path, (data, exe) in sorted(self.files.items()):
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(0o555 if exe else 0o444)
        for directory in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
            directory.chmod(0o555)
        folder.chmod(0o555)


def _digest(files: Iterable[tuple[str, bool, bytes]]) -> str:
    """The SHA-256 of the canonical form: the sorted (path, executable bit, SHA-256 of content)."""
    listing = "".join(f"{path}\0{'x' if exe else '-'}\0{hashlib.sha256(data).hexdigest()}\n"
                      for path, exe, data in sorted(files, key=lambda f: f[0]))
    return hashlib.sha256(listing.encode()).hexdigest()


def digest_of(folder: Path) -> str:
    """The digest of an unpacked bundle as it is now on disk (a worker checks its cache with it)."""
    files = [(p.relative_to(folder).as_posix(), bool(p.stat().st_mode & 0o111), p.read_bytes())
             for p in folder.rglob("*") if p.is_file() or p.is_symlink()]
    return _digest(files)


def _unpacked(data: bytes) -> bytes:
    """The tar stream of an upload: gunzipped (at most MAX_UNPACKED bytes of it), or as is."""
    if data[:2] != b"\x1f\x8b":
        if len(data) > MAX_UNPACKED:
            raise BundleError("archive", f"the archive is larger than {MAX_UNPACKED} bytes")
        return data
    inflate = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
    try:
        out = inflate.decompress(data, MAX_UNPACKED + 1)
    except zlib.error as exc:
        raise BundleError("archive", f"not a readable gzip stream ({exc})") from None
    if len(out) > MAX_UNPACKED or inflate.unconsumed_tail:
        raise BundleError("archive", f"the archive unpacks to more than {MAX_UNPACKED} bytes")
    if not inflate.eof:
        raise BundleError("archive", "a truncated gzip stream")
    return out


def clean_path(name: str) -> str:
    """A member's path, normalized (``./`` and empty parts dropped); BundleError if it is
    absolute, climbs out with ``..``, or holds control characters or backslashes."""
    if not name or name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise BundleError(name or "archive", f"{name!r}: an absolute path; members must be relative")
    if any(ord(c) < 32 or c in "\\\x7f" for c in name) or any(0xD800 <= ord(c) <= 0xDFFF for c in name):
        raise BundleError(name, f"{name!r}: control characters or backslashes in a path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BundleError(name, f"{name!r}: '..' would leave the bundle")
    path = "/".join(parts)
    if len(path) > MAX_PATH or len(parts) > 16:
        raise BundleError(name, f"{name!r}: paths are at most {MAX_PATH} characters and 16 levels deep")
    return path


def from_tar(data: bytes) -> Bundle:
    """A bundle from a tar or tar.gz; BundleError naming the first problem."""
    try:
        tar = tarfile.open(fileobj=io.BytesIO(_unpacked(data)), mode="r:")
    except tarfile.TarError as exc:
        raise BundleError("archive", f"not a tar archive ({exc})") from None
    files: list[tuple[str, bytes, bool]] = []
    total = 0
    with tar:
        try:
            for member in tar:
                if len(files) >= MAX_FILES:
                    raise BundleError("archive", f"more than {MAX_FILES} members")
                kind = _kind(member)
                if kind == "directory":
                    clean_path(member.name)
                    continue
                if kind != "file":
                    raise BundleError(member.name, f"{member.name!r} is a {kind}: only regular files and "
                                      "folders may be in a bundle")
                total += _size_ok(member.name, member.size, total)
                reader = tar.extractfile(member)
                content = reader.read() if reader else b""
                files.append((member.name, content, bool(member.mode & 0o111)))
        except tarfile.TarError as exc:
            raise BundleError("archive", f"a broken tar archive ({exc})") from None
    return from_files(files)


def _kind(member: tarfile.TarInfo) -> str:
    if member.isreg():
        return "file"
    if member.isdir():
        return "directory"
    for test, kind in ((member.issym, "symbolic link"), (member.islnk, "hard link"), (member.ischr, "device"),
                       (member.isblk, "device"), (member.isfifo, "FIFO")):
        if test():
            return kind
    return "special file"


def _size_ok(name: str, size: int, total: int) -> int:
    if size > MAX_MEMBER:
        raise BundleError(name, f"{name!r} is {size} bytes, more than {MAX_MEMBER} per file")
    if total + size > MAX_TOTAL:
        raise BundleError(name, f"the files add up to more than {MAX_TOTAL} bytes")
    return size


def from_files(members: Iterable[tuple[str, bytes, bool]]) -> Bundle:
    """A bundle from (path, content, executable) triples (a multipart upload, an unpacked
    tar); BundleError naming the first problem."""
    files: dict[str, tuple[bytes, bool]] = {}
    total = 0
    for name, data, exe in members:
        path = clean_path(name)
        if path in files:
            raise BundleError(name, f"{path!r} appears twice")
        total += _size_ok(name, len(data), total)
        files[path] = (data, exe)
        if len(files) > MAX_FILES:
            raise BundleError("archive", f"more than {MAX_FILES} files")
    files = _one_top_folder_dropped(files)
    for path in files:
        parent = posixpath.dirname(path)
        while parent:
            if parent in files:
                raise BundleError(path, f"{parent!r} is both a file and a folder")
            parent = posixpath.dirname(parent)
    return _with_manifest(files)


def _one_top_folder_dropped(files: dict[str, tuple[bytes, bool]]) -> dict[str, tuple[bytes, bool]]:
    """``tar czf x.tar.gz myreducer/`` puts everything under one folder: look inside it."""
    tops = {path.split("/", 1)[0] for path in files}
    if MANIFEST in files or len(tops) != 1 or f"{next(iter(tops))}/{MANIFEST}" not in files:
        return files
    top = next(iter(tops))
    return {path.removeprefix(f"{top}/"): value for path, value in files.items()}


def _no_network(manifest: bytes) -> None:
    """BundleError naming ``network`` if the manifest asks for any (a manifest that is not
    a JSON object is left to the parser, which says what is wrong with it)."""
    try:
        asked = json.loads(manifest)
    except ValueError:
        return
    if isinstance(asked, dict) and asked.get("network", False) is not False:
        raise BundleError("network", f"{MANIFEST}: network: an uploaded reducer gets no network; remove the "
                          "field (only a reducer installed on the workers may list the hosts it reaches)")


def _with_manifest(files: dict[str, tuple[bytes, bool]]) -> Bundle:
    if MANIFEST not in files:
        raise BundleError(MANIFEST, f"no {MANIFEST} at the top of the bundle")
    _no_network(files[MANIFEST][0])
    try:
        reducer = reducers.parse(files[MANIFEST][0], Path("/bundle"), MANIFEST)
    except ValueError as exc:  # "reducer.json: <field>: <what is wrong>"
        raise BundleError(MANIFEST, str(exc)) from None
    for part in reducer.argv:
        if part.startswith(HERE):
            path = posixpath.normpath(part.removeprefix(HERE))
            if path not in files:
                raise BundleError("argv", f"{MANIFEST}: argv names {part!r}, which is not in the bundle")
    first = reducer.argv[0]
    if first.startswith(HERE):  # the program itself: executable, whatever the upload said
        path = posixpath.normpath(first.removeprefix(HERE))
        files[path] = (files[path][0], True)
    elif first != "{python}" and not os.path.isabs(first):
        raise BundleError("argv", f"{MANIFEST}: argv[0] is {first!r}; give {{here}}/PROGRAM, {{python}} "
                          "or an absolute path")
    return Bundle(files, reducer)

"""A remote COG read by byte ranges, through rasterio's Python file opener: GDAL reads the
file's header and the blocks a reader's windows fall in, nothing else.

GDAL asks its file for many small pieces (a tag here, a count there) and then each block's
bytes at once. A :class:`Remote` keeps what it has fetched: a miss fetches at least
:data:`READ_AHEAD` bytes (the header, its IFDs and its tile tables in one request), and
:func:`prefetch` asks for the blocks a list of windows touch before they are read, their
byte ranges (from the TIFF's own tables, ``BLOCK_OFFSET_x_y``) merged where they lie within
:data:`GAP` of each other — a COG lays a level's blocks row by row, so windows spread over a
whole tile are one request, and a few sites are a few blocks.

Storage is not known here: a :class:`Remote` reads through the ``read`` it is given (an
offset and a length to bytes), and a failure of that read (missing, busy, refused) is
raised as it was raised, not as GDAL's "read failed"; a failure of GDAL's own (a block that
does not decode) is the source's: ``bad_source``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import rasterio
from rasterio.errors import RasterioError

from pipeline.failures import FailureClass, StageFailure

READ_AHEAD = 16 * 1024  # the least a miss fetches: a COG's header and tile tables at once (as GDAL's /vsicurl/)
GAP = 256 * 1024  # wanted ranges closer than this are fetched as one (a request costs more than the bytes)

Window = tuple[int, int, int, int]  # (row, col, rows, cols)


class Remote:
    """One remote file GDAL reads by ranges: its name (``url``, unsigned, as errors show it),
    its size, and the bytes fetched so far (bounded by the file: a reader wants a few of its
    blocks, at most all)."""

    def __init__(self, url: str, size: int, read: Callable[[int, int], bytes]) -> None:
        self.url = url
        self.size = size
        self.name = "remote.tif"  # the name GDAL opens it by (its sidecars are not there)
        self._read = read
        self._starts: list[int] = []  # the fetched spans' first bytes, sorted (a few: the header, merged blocks)
        self._spans: dict[int, bytes] = {}
        self.failure: StageFailure | None = None  # the first failure of a fetch, raised again past GDAL
        self.fetched = 0  # bytes fetched

    def fetch(self, offset: int, length: int) -> None:
        """Fetch ``length`` bytes from ``offset`` (within the file) and keep them."""
        length = min(length, self.size - offset)
        if length <= 0:
            return
        try:
            data = self._read(offset, length)
        except StageFailure as exc:
            self.failure = self.failure or exc
            raise
        self.fetched += len(data)
        if offset not in self._spans:
            bisect.insort(self._starts, offset)
        self._spans[offset] = data

    def bytes_at(self, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (fewer at the end of the file), fetched if no
        span kept holds them."""
        length = max(0, min(length, self.size - offset))
        found = self.kept(offset, length)
        if found is None:
            self.fetch(offset, max(length, READ_AHEAD))
            found = self.kept(offset, length)
        return found or b""

    def kept(self, offset: int, length: int) -> bytes | None:
        """The bytes if a span fetched holds them all, else None."""
        index = bisect.bisect_right(self._starts, offset) - 1
        while index >= 0:
            start = self._starts[index]
            span = self._spans[start]
            if start + len(span) >= offset + length:
                return span[offset - start:offset - start + length]
            index -= 1
        return None


class _Reader:
    """A file-like view of a :class:`Remote` (GDAL may open it more than once)."""

    def __init__(self, remote: Remote) -> None:
        self._remote = remote
        self._position = 0

    def read(self, size: int = -1) -> bytes:
        left = self._remote.size - self._position
        data = self._remote.bytes_at(self._position, left if size < 0 else min(size, left))
        self._position += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._position, self._remote.size)[whence]
        self._position = base + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def close(self) -> None:
        pass

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Container:
    """rasterio's file container (its ``opener``) holding the one remote file, nothing
    beside it (GDAL looks for sidecars: there are none)."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote

    def open(self, path: str, mode: str = "rb", **_: Any) -> _Reader:
        if path != self.remote.name or "w" in mode:
            raise FileNotFoundError(path)
        return _Reader(self.remote)

    def isfile(self, path: str) -> bool:
        return path == self.remote.name

    def isdir(self, path: str) -> bool:
        return False

    def ls(self, path: str) -> list[str]:
        return []

    def mtime(self, path: str) -> int:
        return 0

    def size(self, path: str) -> int:
        return self.remote.size

    def rm(self, path: str) -> None:
        raise PermissionError(path)


@contextmanager
def opened(remote: Remote) -> Iterator[Any]:
    """The remote file as a rasterio dataset; a failure while it is open (GDAL's, or a fetch
    under it) raised as the fetch's own, else as the source's (``bad_source``)."""
    try:
        with rasterio.open(remote.name, opener=_Container(remote)) as dataset:
            yield dataset
    except RasterioError as exc:
        if remote.failure is not None:
            raise remote.failure from None
        raise StageFailure(FailureClass.BAD_SOURCE, f"{remote.url}: not a raster GDAL can read ({exc})") from None


def prefetch(remote: Remote, dataset: Any, windows: list[Window]) -> None:
    """Fetch the blocks of band 1 that ``windows`` touch, in as few requests as their byte
    ranges allow (merged across gaps under :data:`GAP`); a block the tables do not place (a
    sparse file's empty block) is read by GDAL as it would be."""
    height, width = dataset.block_shapes[0]
    blocks = set()
    for row, col, rows, cols in windows:
        for block_row in range(row // height, math.ceil((row + rows) / height)):
            for block_col in range(col // width, math.ceil((col + cols) / width)):
                blocks.add((block_row, block_col))
    ranges = []
    for block_row, block_col in blocks:
        offset = dataset.get_tag_item(f"BLOCK_OFFSET_{block_col}_{block_row}", "TIFF", bidx=1)
        size = dataset.get_tag_item(f"BLOCK_SIZE_{block_col}_{block_row}", "TIFF", bidx=1)
        if offset and size and int(size) > 0:
            ranges.append((int(offset), int(offset) + int(size)))
    for start, end in _merged(sorted(ranges)):
        if remote.kept(start, end - start) is None:
            remote.fetch(start, end - start)


def _merged(ranges: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """Sorted byte ranges, those within :data:`GAP` of the last joined to it."""
    current: tuple[int, int] | None = None
    for start, end in ranges:
        if current is not None and start - current[1] <= GAP:
            current = (current[0], max(current[1], end))
            continue
        if current is not None:
            yield current
        current = (start, end)
    if current is not None:
        yield current

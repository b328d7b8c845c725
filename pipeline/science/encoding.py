"""Values in and out: a layer's stored values decoded into physical ones, and physical values
encoded into an output's stored ones.

An :class:`Encoding` says how a raster stores its values: data type, fill value (nodata),
scale and offset (physical = stored × scale + offset), unit, the valid range of the stored
values, whether its values are class codes (and, optionally, the classes' names). The MODIS
side builds one from its catalog's ``Layer``; this package knows nothing of MODIS.

Decoded values are floats with NaN wherever there is no value: the fill value, a value
outside the valid range, a non-finite stored float. NaN is the mask: one array instead of two
(a boolean mask beside a year of daily 2400 × 2400 values is 2 GB more), numpy's arithmetic
carries it, and its sort puts it last, which the order statistics use.

Float outputs are float32 with NaN as nodata (:func:`float32`): GDAL writes NaN as the
``GDAL_NODATA`` tag and reads it back, ``rasterio`` reports it as the band's nodata,
``rioxarray`` and ``odc-stac`` load a float band's NaN as missing with no ``mask_and_scale``
step, and a tool that ignores the nodata tag (plain numpy, an xarray opened without masking)
still cannot mistake a missing pixel for a value, as it would a -9999 (which would enter
every mean that forgot to mask it).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

Range = tuple[float, float]


@dataclass(frozen=True)
class Encoding:
    """How a raster stores its values. ``nodata`` None: the layer has no fill value (a bit
    field using every value); NaN: a float layer's missing values are NaN. ``valid``: the
    range of stored values that are values (None: every value of the type)."""

    dtype: str
    nodata: float | None
    scale: float = 1.0
    offset: float = 0.0
    unit: str = ""
    valid: Range | None = None
    categorical: bool = False
    classes: tuple[tuple[int, str], ...] = ()  # (code, name) of a categorical layer's classes

    def __post_init__(self) -> None:
        kind = np.dtype(self.dtype).kind
        if kind not in "iuf":
            raise ValueError(f"an encoding's data type is a number type, not {self.dtype}")
        if not (math.isfinite(self.scale) and self.scale != 0 and math.isfinite(self.offset)):
            raise ValueError(f"scale {self.scale} and offset {self.offset}: a finite, non-zero scale and finite offset")
        if self.valid is not None and not self.valid[0] <= self.valid[1]:
            raise ValueError(f"valid range {self.valid}: its low end is above its high end")
        if self.nodata is not None and kind != "f":
            info = np.iinfo(self.dtype)
            if not (float(self.nodata).is_integer() and info.min <= self.nodata <= info.max):
                raise ValueError(f"nodata {self.nodata} is not a value of {self.dtype}")

    @property
    def is_float(self) -> bool:
        return np.dtype(self.dtype).kind == "f"

    @property
    def fill(self) -> float:
        """What a masked pixel is written as: the nodata value; with none, NaN for a float
        type, else the type's largest value (as the MODIS catalog writes such a layer's
        empty pixels)."""
        if self.nodata is not None:
            return self.nodata
        return math.nan if self.is_float else float(np.iinfo(self.dtype).max)

    def bounds(self) -> Range:
        """The stored values an encoded value may take: the valid range, within the type's."""
        info = np.finfo(self.dtype) if self.is_float else np.iinfo(self.dtype)
        low, high = float(info.min), float(info.max)
        if self.valid is not None:
            low, high = max(low, self.valid[0]), min(high, self.valid[1])
        return low, high


def float32(unit: str = "") -> Encoding:
    """The encoding of a computed float output: float32, NaN where there is no value."""
    return Encoding("float32", math.nan, unit=unit)


def usable(stored: np.ndarray, encoding: Encoding) -> np.ndarray:
    """Where the stored values are values: not the fill, within the valid range, finite."""
    good = np.isfinite(stored) if encoding.is_float else np.ones(stored.shape, bool)
    # each comparison made only where it can be false for a value of the stored type
    low, high = ((np.iinfo(stored.dtype).min, np.iinfo(stored.dtype).max) if stored.dtype.kind in "iu"
                 else (-math.inf, math.inf))
    if encoding.valid is not None:
        with np.errstate(invalid="ignore"):
            if encoding.valid[0] > low:
                good &= stored >= encoding.valid[0]
            if encoding.valid[1] < high:
                good &= stored <= encoding.valid[1]
        low, high = max(low, encoding.valid[0]), min(high, encoding.valid[1])
    if encoding.nodata is not None and not math.isnan(encoding.nodata) and low <= encoding.nodata <= high:
        good &= stored != encoding.nodata
    return good


def decoded_type(encoding: Encoding) -> type[np.floating]:
    """The float type a layer's values decode to: float32, exact for every stored value of a
    type of up to 16 bits; float64 for wider ones (a 32-bit QC bit field's 4294966531 is
    4294966528 in float32, and would encode back as other bits)."""
    return np.float32 if np.dtype(encoding.dtype).itemsize <= 2 else np.float64


def decode(stored: np.ndarray, encoding: Encoding, dtype: type[np.floating] | None = None) -> np.ndarray:
    """The physical values of stored ones (stored × scale + offset), as ``dtype`` (by default
    :func:`decoded_type`), NaN wherever :func:`usable` says there is no value."""
    dtype = decoded_type(encoding) if dtype is None else dtype
    good = usable(stored, encoding)
    values = stored.astype(dtype)
    if encoding.scale != 1.0:
        values *= dtype(encoding.scale)
    if encoding.offset != 0.0:
        values += dtype(encoding.offset)
    values[~good] = np.nan
    return values


def encode(values: np.ndarray, encoding: Encoding) -> np.ndarray:
    """Physical values (NaN: none) as ``encoding`` stores them: (value − offset) / scale,
    rounded to the nearest integer for an integer type (halves to even), clipped to the valid
    range within the type's (so that every written value reads back as a value), and the fill
    (:attr:`Encoding.fill`) wherever there is no value."""
    with np.errstate(invalid="ignore", over="ignore"):
        stored = np.asarray(values, np.float64)
        if encoding.offset != 0.0:
            stored = stored - encoding.offset
        if encoding.scale != 1.0:
            stored = stored / encoding.scale
        missing = ~np.isfinite(stored)
        if not encoding.is_float:
            stored = np.rint(stored)
        low, high = encoding.bounds()
        stored = np.clip(stored, low, high)
        stored[missing] = encoding.fill
        return stored.astype(encoding.dtype)


@functools.lru_cache(maxsize=256)
def exact(encoding: Encoding) -> bool:
    """Whether an integer layer's stored values can be reduced as they are stored: a type of
    up to 16 bits (every value checked, at most 65,536) whose every usable value decodes and
    encodes back to itself (:func:`decode`, then :func:`encode` in the same encoding). Then
    decoding is one to one and keeps order (reverses it if the scale is negative), so that a
    pixel's extreme, first or last value, or its count of values, found among the stored
    values is the one found among the decoded ones — with no float array made."""
    if encoding.is_float or np.dtype(encoding.dtype).itemsize > 2:
        return False
    low, high = encoding.bounds()
    stored = np.arange(int(low), int(high) + 1).astype(encoding.dtype)
    stored = stored[usable(stored, encoding)]
    return bool(np.array_equal(encode(decode(stored, encoding), encoding), stored))

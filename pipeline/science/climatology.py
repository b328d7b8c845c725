"""Climatologies: per pixel, the mean, standard deviation, minimum, maximum and count of the
valid observations of a baseline's stack — what anomalies, z-scores and the percent-of-range
indices (VCI, TCI) compare a group's value against.

A climatology is computed once over a baseline (every July of 2001–2020, say) and kept: it is
written to and read from a multi-band GeoTIFF (float32, NaN nodata, a band per statistic
named by its description), so that a job can cache it and the next job that asks for the same
baseline reads it instead of the baseline's tiles.

The standard deviation is the sample one (ddof 1): the baseline's years are a sample of the
climate, and openEO's ``sd`` (the process graphs this core will serve) is defined so. A pixel
with one valid observation has a mean, a minimum and a maximum but no standard deviation.

It is computed a date at a time (:class:`ClimatologyAccumulator`: Welford's update for the
mean and the squared deviations, a running minimum and maximum), so that its memory is a few
arrays of one date's shape whatever the baseline's length; :func:`climatology` feeds it a
whole stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rasterio
from affine import Affine
from rasterio.crs import CRS
from rasterio.io import MemoryFile

DDOF = 1
STATISTICS = ("mean", "std", "min", "max", "count")
VERSION = "climatology-1"  # change when the statistics of the same inputs would change


@dataclass(frozen=True)
class Climatology:
    """Per-pixel statistics of a baseline (float32; NaN where the baseline has no valid
    observation, and ``std`` also where it has one); ``count`` (int32) is 0 there."""

    mean: np.ndarray
    std: np.ndarray
    min: np.ndarray
    max: np.ndarray
    count: np.ndarray

    def __post_init__(self) -> None:
        if len({getattr(self, name).shape for name in STATISTICS}) != 1:
            raise ValueError("a climatology's statistics have one shape")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.mean.shape)


def ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator (float64), NaN where the denominator is 0 or either is NaN:
    never a warning, never an infinity."""
    out = np.full(np.broadcast_shapes(numerator.shape, denominator.shape), np.nan)
    np.divide(numerator, denominator, out=out, where=denominator != 0)
    return out


class Moments:
    """Welford's running count, mean and sum of squared deviations, per pixel, over dates fed
    one at a time (float64; a NaN is no observation)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.count = np.zeros(shape, np.int32)
        self._mean = np.zeros(shape, np.float64)
        self._m2 = np.zeros(shape, np.float64)

    def add(self, values: np.ndarray) -> None:
        valid = ~np.isnan(values)
        self.count += valid
        x = np.where(valid, values, self._mean)  # no observation: no change
        delta = x - self._mean
        self._mean += delta / np.maximum(self.count, 1)
        self._m2 += delta * (x - self._mean)

    def mean(self) -> np.ndarray:
        """The mean; NaN where there is no observation."""
        return np.where(self.count > 0, self._mean, np.nan)

    def std(self) -> np.ndarray:
        """The sample standard deviation (ddof 1); NaN with fewer than two observations."""
        return np.asarray(np.sqrt(ratio(self._m2, np.maximum(self.count - DDOF, 0).astype(np.float64))))


class ClimatologyAccumulator:
    """A climatology over dates fed one at a time (:meth:`add` each date's decoded values,
    NaN where there is none; then :meth:`result`)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self._moments = Moments(shape)
        self._min = np.full(shape, np.nan, np.float32)
        self._max = np.full(shape, np.nan, np.float32)

    def add(self, values: np.ndarray) -> None:
        self._moments.add(values)
        np.fmin(self._min, values, out=self._min)  # fmin, fmax: a NaN loses to a value
        np.fmax(self._max, values, out=self._max)

    def result(self) -> Climatology:
        moments = self._moments
        return Climatology(moments.mean().astype(np.float32), moments.std().astype(np.float32), self._min.copy(),
                           self._max.copy(), moments.count.copy())


def climatology(values: np.ndarray) -> Climatology:
    """The climatology of a whole stack (time, y, x) of decoded values (NaN: none), its
    dates fed to a :class:`ClimatologyAccumulator` (faster on numpy than reductions over the
    time axis, and with no copy of the stack)."""
    fed = ClimatologyAccumulator(values.shape[1:])
    for layer in values:
        fed.add(layer)
    return fed.result()


def to_geotiff(stats: Climatology, crs: str, transform: Affine, unit: str = "",
               tags: dict[str, str] | None = None) -> bytes:
    """The climatology as a GeoTIFF: a float32 band per statistic (nodata NaN; ``count`` 0
    where there is no observation), each named by its description and carrying the unit
    (``count``: observations); tags say the statistics, the ddof and ``tags`` (the caller's:
    which baseline, which group, which inputs)."""
    height, width = stats.shape
    profile = {"driver": "GTiff", "width": width, "height": height, "count": len(STATISTICS), "dtype": "float32",
               "crs": CRS.from_user_input(crs), "transform": transform, "nodata": np.nan, "compress": "deflate",
               "tiled": True, "blockxsize": 256, "blockysize": 256}
    with MemoryFile() as memory:
        with memory.open(**profile) as dst:
            for band, name in enumerate(STATISTICS, start=1):
                dst.write(getattr(stats, name).astype(np.float32), band)
                dst.set_band_description(band, name)
            dst.units = tuple("observations" if name == "count" else unit for name in STATISTICS)
            dst.update_tags(STATISTICS=",".join(STATISTICS), DDOF=str(DDOF), BAGPIPE_STAGE=VERSION, **(tags or {}))
        return bytes(memory.read())


@dataclass(frozen=True)
class StoredClimatology:
    """A climatology read from its GeoTIFF, with the grid, unit and tags it was written with."""

    climatology: Climatology
    crs: str
    transform: Affine
    unit: str
    tags: dict[str, str]


def from_geotiff(source: bytes | Path) -> StoredClimatology:
    """A climatology written by :func:`to_geotiff`, from its bytes or its file (its bands
    found by their descriptions); ValueError if a statistic is missing."""
    if isinstance(source, bytes):
        with MemoryFile(source) as memory, memory.open() as src:
            return _read(src)
    with rasterio.open(source) as src:
        return _read(src)


def _read(src: rasterio.DatasetReader) -> StoredClimatology:
    bands = {name: index for index, name in enumerate(src.descriptions, start=1)}
    absent = [name for name in STATISTICS if name not in bands]
    if absent:
        raise ValueError(f"not a climatology: no band named {', '.join(absent)}")
    read = {name: src.read(bands[name]) for name in STATISTICS}
    read["count"] = read["count"].astype(np.int32)
    return StoredClimatology(Climatology(**read), src.crs.to_string(), src.transform,
                             src.units[bands["mean"] - 1] or "", src.tags())

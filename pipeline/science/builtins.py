"""Built-in reducers: a group's stack of one input's decoded values (time, y, x; NaN where
there is no value — see ``encoding``) reduced per pixel to one value, with no program to run.

``mean``, ``sum``, ``std``, ``min``, ``max``, ``median``, ``percentile`` (p from 0 to 100),
``count`` (valid observations), ``first`` and ``last`` (the first and last valid observation
in time), ``argmax_date`` and ``argmin_date`` (the day of the year of the peak and the trough:
the simplest phenology; a tie goes to the earliest date), and, against a baseline's
:class:`~pipeline.science.climatology.Climatology` of the same group, ``anomaly`` (the
group's mean minus the baseline's mean), ``zscore`` (that over the baseline's standard
deviation), ``vci`` (vegetation condition: 100 × (mean − baseline min) / (baseline max −
baseline min)) and ``tci`` (temperature condition: 100 × (baseline max − mean) / (baseline max
− baseline min)). VCI and TCI are not clipped to 0–100: a group beyond its baseline's record
shows as such (``clip(vci, 0, 100)`` in an expression clips it).

Definitions: ``std`` is the sample standard deviation (ddof 1, as openEO's ``sd``; one
observation has none); ``median`` and ``percentile`` interpolate linearly between the order
statistics (numpy's default, Hyndman and Fan's type 7, as openEO's ``quantiles``); a day of
the year is the date's own, so over a group that crosses a year's end (a winter, a span) it
is of whichever year the peak fell in; with a composite input a date is its period's first
day. A pixel with no valid observation is nodata for every reducer — not 0, not a warning —
except ``count``, whose answer there is 0.

Each reducer says its output's encoding given its input's (:meth:`Reducer.output_encoding`):
``min``, ``max``, ``first``, ``last`` keep the input's encoding (their values are the input's:
an integer layer stays integer, with its scale); ``median`` and ``percentile`` keep a float
input's and make an integer input's float32 (an interpolated value is between two stored
values), NaN nodata, the input's unit; ``mean``, ``std``, ``sum`` and ``anomaly`` are float32,
NaN nodata, in the input's unit; ``zscore`` is unitless; ``vci`` and ``tci`` in %; ``count``
is uint16, nodata 65535 (a mosaic fills beyond its tiles with it, never with a false 0), unit
observations; ``argmax_date`` and ``argmin_date`` int16 day of year, nodata -1 (as MODIS's
own ``composite_day_of_the_year``). Of a categorical layer (class codes) only ``count``,
``first``, ``last``, ``min`` and ``max`` have a meaning; the others are refused.

Those whose output is one of a pixel's stored values or its count (``min``, ``max``,
``first``, ``last``, ``count``) run, on an integer layer whose values decode exactly
(:func:`~pipeline.science.encoding.exact`: every layer of up to 16 bits in the catalog), on
the stored values themselves (:func:`reduce_stored`), and give the stored output that
encoding the decoded answer would: a byte a pixel where the decoded stack is 4 and the
answer 8, and no decoding or encoding at all.

Two forms give the same answers: :func:`reduce` on a whole stack in memory, and
:func:`reduce_stream`, which reads the stack through a function a date or a block of rows at
a time, so that memory is bounded (a year of daily 2400 × 2400 float32 values is 8 GB). An
:class:`Accumulator` fed one date at a time keeps running sums, Welford's moments, running
extremes, or the first and last values seen: a few arrays of one date's shape. The order
statistics (``median``, ``percentile``) need a pixel's every date at once: they sort the
stack along time, and streamed they read every date a block of rows at a time, as many rows
as fit in ``max_bytes``.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date

import numpy as np

from pipeline.science.climatology import Climatology, Moments, ratio
from pipeline.science.encoding import Encoding, exact, float32, usable

NAMES = ("mean", "median", "min", "max", "sum", "count", "std", "percentile", "first", "last", "argmax_date",
         "argmin_date", "anomaly", "zscore", "vci", "tci")
BASELINED = ("anomaly", "zscore", "vci", "tci")
ORDER_STATISTICS = ("median", "percentile")
CATEGORICAL = ("count", "first", "last", "min", "max")
STORED = ("count", "first", "last", "min", "max")  # may run on an exact integer layer's stored values
COUNT = Encoding("uint16", 65535, unit="observations", valid=(0, 65534))
DAY_OF_YEAR = Encoding("int16", -1, unit="day of year", valid=(1, 366))
VERSION = "builtins-1"  # change when a reducer's output of the same inputs would change (its outputs' cache keys)
MAX_BYTES = 512 * 1024 * 1024  # the order statistics' block of rows (all dates), its sorted copy and mask
PER_PIXEL = 96  # bytes of the order statistics' per-pixel arrays (counts, positions, indices, values)


class ReducerError(ValueError):
    """A built-in reducer that does not exist, a percentile out of range, or a reducer that
    has no meaning for its input."""


@dataclass(frozen=True)
class Reducer:
    """A built-in reducer by name (one of :data:`NAMES`); ``p``, the percentile's, 0–100."""

    name: str
    p: float | None = None

    def __post_init__(self) -> None:
        if self.name not in NAMES:
            shown = self.name if len(self.name) <= 40 else self.name[:40] + "…"
            raise ReducerError(f"unknown built-in reducer {shown!r}: one of {', '.join(NAMES)}")
        if (self.name == "percentile") != (self.p is not None):
            raise ReducerError("percentile takes p (0 to 100); no other reducer does")
        if self.p is not None and not (math.isfinite(self.p) and 0 <= self.p <= 100):
            raise ReducerError(f"percentile p is {self.p}: it is from 0 to 100")

    def __str__(self) -> str:
        return f"percentile({self.p:g})" if self.p is not None else self.name

    @property
    def needs_baseline(self) -> bool:
        return self.name in BASELINED

    @property
    def by_blocks(self) -> bool:
        """Whether it needs a pixel's every date at once (streamed a block of rows at a time)."""
        return self.name in ORDER_STATISTICS

    def output_encoding(self, encoding: Encoding) -> Encoding:
        """The encoding of its output given its input's (see the module's text)."""
        if encoding.categorical and self.name not in CATEGORICAL:
            raise ReducerError(f"{self} of a categorical layer (class codes) has no meaning; "
                               f"{', '.join(CATEGORICAL)} take one")
        match self.name:
            case "min" | "max" | "first" | "last":
                return encoding
            case "median" | "percentile":
                return encoding if encoding.is_float else float32(encoding.unit)
            case "count":
                return COUNT
            case "argmax_date" | "argmin_date":
                return DAY_OF_YEAR
            case "zscore":
                return float32()
            case "vci" | "tci":
                return float32("%")
            case _:  # mean, std, sum, anomaly
                return float32(encoding.unit)


def _check_dates(dates: Sequence[date], count: int) -> None:
    if len(dates) != count:
        raise ValueError(f"{len(dates)} dates for a stack of {count}")
    if any(b <= a for a, b in itertools.pairwise(dates)):
        raise ValueError("dates are in increasing order, each once")


def _check_baseline(reducer: Reducer, baseline: Climatology | None, shape: tuple[int, ...]) -> None:
    if reducer.needs_baseline and baseline is None:
        raise ValueError(f"{reducer} needs a baseline climatology")
    if reducer.needs_baseline and baseline is not None and baseline.shape != shape:
        raise ValueError(f"the baseline is {baseline.shape}, the stack's dates {shape}")


def _against(name: str, mean: np.ndarray, baseline: Climatology) -> np.ndarray:
    """A group's mean against its baseline: anomaly, zscore, vci or tci."""
    low, high = baseline.min.astype(np.float64), baseline.max.astype(np.float64)
    match name:
        case "anomaly":
            return np.asarray(mean - baseline.mean)
        case "zscore":
            return ratio(mean - baseline.mean, baseline.std.astype(np.float64))
        case "vci":
            return 100 * ratio(mean - low, high - low)
        case _:  # tci
            return 100 * ratio(high - mean, high - low)


def _percentile(values: np.ndarray, p: float) -> np.ndarray:
    """The p-th percentile over axis 0, NaN ignored, linear between the order statistics."""
    ordered = np.sort(values, axis=0).reshape(values.shape[0], -1)  # NaN sorts last
    count = values.shape[0] - np.count_nonzero(np.isnan(ordered), axis=0)
    position = p / 100 * np.maximum(count - 1, 0)
    below = np.floor(position).astype(np.intp)
    above = np.minimum(below + 1, np.maximum(count - 1, 0))
    pixels = np.arange(ordered.shape[1])
    low, high = ordered[below, pixels].astype(np.float64), ordered[above, pixels].astype(np.float64)
    result: np.ndarray = low + (high - low) * (position - below)  # (no value at all: the first, NaN)
    return result.reshape(values.shape[1:])


def weighted_quantile(x: np.ndarray, w: np.ndarray, q: float) -> float:
    """The weighted quantile ``q`` of values ``x`` weighted ``w`` (the zones' percentiles,
    ``pipeline.reduction.zonal``), by exactextract's rule
    (https://stats.stackexchange.com/a/13223: sorted by value, s_i = i·w_i + (n − 1)·Σ_{j<i} w_j,
    interpolated where s reaches q·(n − 1)·Σ w); with every weight 1, s_i = n·i and the
    quantile is at q·(n − 1): Hyndman and Fan's type 7 (numpy's default)."""
    order = np.argsort(x, kind="stable")
    x, w = x[order], w[order]
    n = len(x)
    before = np.concatenate([[0.0], np.cumsum(w)[:-1]])
    s = np.arange(n) * w + (n - 1) * before
    s[0] = 0.0
    target = q * float(np.sum(w)) * (n - 1)
    right = int(np.searchsorted(s, target, side="right"))
    left = right - 1
    if right >= n:
        return float(x[left])
    return float(x[left] + (target - s[left]) * (x[right] - x[left]) / (s[right] - s[left]))


def reduce(reducer: Reducer, values: np.ndarray, dates: Sequence[date],
           baseline: Climatology | None = None) -> np.ndarray:
    """The reducer over a whole stack (time, y, x) of decoded values (NaN: no value) with
    its dates, in increasing order: float64 (y, x) physical values, NaN where there is none
    (``encoding.encode`` writes them in :meth:`Reducer.output_encoding`). Except for the
    order statistics, the stack's dates are fed one at a time to the reducer's
    :class:`Accumulator`, as :func:`reduce_stream` feeds them: numpy runs a date at a time
    faster than a reduction over the time axis of a float32 stack into float64 (the mean of
    23 dates of 1000 × 1000: 44 against 26 megapixels a second), and with no copy of the
    stack."""
    if values.ndim != 3:
        raise ValueError(f"a stack is (time, y, x), not of shape {values.shape}")
    _check_dates(dates, values.shape[0])
    if reducer.by_blocks:
        return _percentile(values, 50.0 if reducer.p is None else reducer.p)
    fed = accumulator(reducer, values.shape[1:], baseline)
    for day, layer in zip(dates, values, strict=True):
        fed.add(day, layer)
    return fed.result()


class Accumulator(ABC):
    """A reducer's streaming form: :meth:`add` each date's decoded values (y, x) in
    increasing order of dates, then :meth:`result` (as :func:`reduce`'s)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self._last: date | None = None

    def add(self, day: date, values: np.ndarray) -> None:
        if values.shape != self.shape:
            raise ValueError(f"values of shape {values.shape} for a reduction of {self.shape}")
        if self._last is not None and day <= self._last:
            raise ValueError(f"{day} after {self._last}: dates are in increasing order, each once")
        self._last = day
        self._add(day, values)

    @abstractmethod
    def _add(self, day: date, values: np.ndarray) -> None: ...

    @abstractmethod
    def result(self) -> np.ndarray: ...


class _Sums(Accumulator):
    """count, sum, mean, and the baselined reducers (which compare the mean)."""

    def __init__(self, reducer: Reducer, shape: tuple[int, ...], baseline: Climatology | None) -> None:
        super().__init__(shape)
        self._name, self._baseline = reducer.name, baseline
        self._count = np.zeros(shape, np.int32)
        self._total = np.zeros(shape, np.float64)

    def _add(self, day: date, values: np.ndarray) -> None:
        valid = ~np.isnan(values)
        self._count += valid
        if self._name != "count":
            self._total += np.where(valid, values, 0.0)

    def result(self) -> np.ndarray:
        if self._name == "count":
            return self._count.astype(np.float64)
        if self._name == "sum":
            return np.where(self._count > 0, self._total, np.nan)
        mean = ratio(self._total, self._count.astype(np.float64))
        if self._name == "mean":
            return mean
        assert self._baseline is not None
        return _against(self._name, mean, self._baseline)


class _Std(Accumulator):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__(shape)
        self._moments = Moments(shape)

    def _add(self, day: date, values: np.ndarray) -> None:
        self._moments.add(values)

    def result(self) -> np.ndarray:
        return self._moments.std()


class _Extreme(Accumulator):
    """min, max: a running fmin/fmax, for which a NaN loses to any value."""

    def __init__(self, shape: tuple[int, ...], highest: bool) -> None:
        super().__init__(shape)
        self._ufunc = np.fmax if highest else np.fmin
        self._best = np.full(shape, np.nan)

    def _add(self, day: date, values: np.ndarray) -> None:
        self._ufunc(self._best, values, out=self._best)

    def result(self) -> np.ndarray:
        return self._best.copy()


class _Edge(Accumulator):
    """first: a pixel's value kept from the first date it has one; last: replaced at each."""

    def __init__(self, shape: tuple[int, ...], first: bool) -> None:
        super().__init__(shape)
        self._first = first
        self._value = np.full(shape, np.nan)

    def _add(self, day: date, values: np.ndarray) -> None:
        take = ~np.isnan(values)
        if self._first:
            take &= np.isnan(self._value)
        np.copyto(self._value, values, where=take)

    def result(self) -> np.ndarray:
        return self._value.copy()


class _Peak(Accumulator):
    """argmax_date, argmin_date: the running best value and the day of the year it came on
    (replaced only by a strictly better one: a tie keeps the earliest date)."""

    def __init__(self, shape: tuple[int, ...], highest: bool) -> None:
        super().__init__(shape)
        self._highest = highest
        self._best = np.full(shape, -np.inf if highest else np.inf)
        self._doy = np.full(shape, np.nan)

    def _add(self, day: date, values: np.ndarray) -> None:
        with np.errstate(invalid="ignore"):
            better = values > self._best if self._highest else values < self._best  # NaN: False
        np.copyto(self._best, values, where=better)
        np.putmask(self._doy, better, day.timetuple().tm_yday)

    def result(self) -> np.ndarray:
        return self._doy.copy()


def accumulator(reducer: Reducer, shape: tuple[int, ...], baseline: Climatology | None = None) -> Accumulator:
    """The streaming form of a reducer over dates of ``shape`` (not the order statistics:
    :func:`reduce_stream` reads those by blocks of rows)."""
    if reducer.by_blocks:
        raise ValueError(f"{reducer} needs every date of a pixel at once: reduce_stream reads it by blocks of rows")
    _check_baseline(reducer, baseline, shape)
    match reducer.name:
        case "std":
            return _Std(shape)
        case "min" | "max":
            return _Extreme(shape, highest=reducer.name == "max")
        case "first" | "last":
            return _Edge(shape, first=reducer.name == "first")
        case "argmax_date" | "argmin_date":
            return _Peak(shape, highest=reducer.name == "argmax_date")
        case _:
            return _Sums(reducer, shape, baseline)


Read = Callable[[int, slice], np.ndarray]  # (index of a date, rows) -> its decoded values there


def reduce_stream(reducer: Reducer, read: Read, dates: Sequence[date], shape: tuple[int, int],
                  baseline: Climatology | None = None, max_bytes: int = MAX_BYTES) -> np.ndarray:
    """The reducer over the dates (increasing) of a stack read through ``read(i, rows)`` (the
    decoded float32 values of date ``i`` in a slice of rows), as :func:`reduce` would answer
    on the whole stack. Most reducers read each date whole, once, into an
    :class:`Accumulator`; the order statistics read every date a block of rows at a time,
    as many rows as let the block, its sorted copy, its mask and the per-pixel arrays of the
    interpolation fit in ``max_bytes`` (at least one row)."""
    height, width = shape
    if not reducer.by_blocks:
        fed = accumulator(reducer, shape, baseline)
        for index, day in enumerate(dates):
            fed.add(day, read(index, slice(0, height)))
        return fed.result()
    _check_dates(dates, len(dates))
    rows = max(1, max_bytes // (width * (len(dates) * (4 + 4 + 1) + PER_PIXEL)))
    result = np.empty(shape)
    block = np.empty((len(dates), min(rows, height), width), np.float32)
    for top in range(0, height, rows):
        part = slice(top, min(top + rows, height))
        stack = block[:, : part.stop - part.start]
        for index in range(len(dates)):
            stack[index] = read(index, part)
        result[part] = reduce(reducer, stack, dates)
    return result


ReadStored = Callable[[int], np.ndarray]  # (index of a date) -> its stored values, whole


def on_stored(reducer: Reducer, encoding: Encoding) -> bool:
    """Whether :func:`reduce_stored` computes ``reducer`` over a layer of ``encoding``."""
    return reducer.name in STORED and exact(encoding)


def reduce_stored(reducer: Reducer, read: ReadStored, dates: Sequence[date], shape: tuple[int, int],
                  encoding: Encoding) -> np.ndarray:
    """The reducer over the dates (increasing) of a stack of stored values read through
    ``read(i)`` (date ``i``'s, whole), as its output encoding stores it (:meth:`Reducer.output_encoding`):
    equal to ``encode(reduce_stream(...), output encoding)`` on the decoded values, computed
    on the stored values a date at a time with a mask of the pixels seen. For
    :func:`on_stored`'s reducers and encodings only."""
    if not on_stored(reducer, encoding):
        raise ValueError(f"{reducer} over {encoding.dtype} values that do not decode exactly: reduce_stream")
    _check_dates(dates, len(dates))
    if reducer.name == "count":
        count = np.zeros(shape, np.int32)
        for index in range(len(dates)):
            count += usable(read(index), encoding)
        low, high = COUNT.bounds()
        return np.clip(count, low, high).astype(COUNT.dtype)
    info = np.iinfo(encoding.dtype)
    # a negative scale reverses the order of the values: the physical maximum is the stored minimum
    highest = (reducer.name == "max") == (encoding.scale > 0)
    worst = info.min if highest else info.max  # no value is worse: a pixel's unusable ones count as it
    seen = np.zeros(shape, bool)
    kept = np.full(shape, worst, encoding.dtype)
    for index in range(len(dates)):
        stored = read(index)
        if stored.shape != shape:
            raise ValueError(f"values of shape {stored.shape} for a reduction of {shape}")
        good = usable(stored, encoding)
        match reducer.name:
            case "first":
                np.copyto(kept, stored, where=good & ~seen)
            case "last":
                np.copyto(kept, stored, where=good)
            case _:  # min, max: over every pixel at once (its unusable values as the worst), seen kept apart
                (np.maximum if highest else np.minimum)(kept, np.where(good, stored, worst), out=kept)
        seen |= good
    kept[~seen] = encoding.fill
    return kept

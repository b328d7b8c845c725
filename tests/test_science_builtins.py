"""Built-in reducers and climatologies against a reference written pixel by pixel from the
stored values (stored × scale + offset of the values that are values), on random stacks
with fill, out-of-range values, pixels with no, one and two valid observations and ties;
the streaming form against the whole-stack one, and its memory; output encodings."""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pytest
from affine import Affine

from pipeline.science.builtins import (
    COUNT,
    DAY_OF_YEAR,
    NAMES,
    STORED,
    Reducer,
    ReducerError,
    accumulator,
    on_stored,
    reduce,
    reduce_stored,
    reduce_stream,
)
from pipeline.science.climatology import STATISTICS, Climatology, climatology, from_geotiff, to_geotiff
from pipeline.science.encoding import Encoding, decode, encode, exact

pytestmark = pytest.mark.filterwarnings("error")  # a warning on the console is a failure

NDVI = Encoding("int16", -3000, 0.0001, 0.0, "NDVI", (-2000, 10000))
LST = Encoding("uint16", 0, 0.02, 0.0, "Kelvin", (7500, 65535))
ANGLE = Encoding("uint8", 255, 1.0, -65.0, "Degree", (0, 130))  # an offset
SNOW = Encoding("uint8", 255, unit="", valid=(0, 254), categorical=True)
DEPTH = Encoding("int16", -32768, -0.01, 5.0, "m", (-1000, 1000))  # a negative scale: order reversed
PS = {"percentile": 90.0}


def reducer(name: str, p: float | None = None) -> Reducer:
    return Reducer(name, p if p is not None else PS.get(name))


def dates_of(count: int, start: date = date(2022, 1, 1), step: int = 8) -> list[date]:
    return [start + timedelta(days=step * k) for k in range(count)]


def stack(encoding: Encoding, count: int, shape: tuple[int, int] = (6, 9), seed: int = 0) -> np.ndarray:
    """Stored values: mostly valid, some fill, some outside the valid range; pixel (0, 0)
    has no valid value, (0, 1) one, (0, 2) two equal ones (a tie), (0, 3) all valid."""
    rng = np.random.default_rng(seed)
    low, high = encoding.valid
    stored = rng.integers(low, high + 1, size=(count, *shape)).astype(encoding.dtype)
    draw = rng.random(stored.shape)
    stored[draw < 0.2] = encoding.nodata
    if low > np.iinfo(encoding.dtype).min:
        stored[(draw >= 0.2) & (draw < 0.3)] = low - 1
    stored[:, 0, 0] = encoding.nodata
    stored[:, 0, 1] = encoding.nodata
    stored[count // 2, 0, 1] = (low + high) // 2
    stored[:, 0, 2] = encoding.nodata
    if count >= 3:
        stored[[0, count - 1], 0, 2] = high
    stored[:, 0, 3] = rng.integers(low, high + 1, size=count)
    return stored


def physical(stored: np.ndarray, encoding: Encoding) -> list[list[list[tuple[int, float, int]]]]:
    """Per pixel, its (index of the date, physical value, stored value) of each value."""
    low, high = encoding.valid
    out: list[list[list[tuple[int, float, int]]]] = []
    for y in range(stored.shape[1]):
        out.append([])
        for x in range(stored.shape[2]):
            out[-1].append([(t, int(v) * encoding.scale + encoding.offset, int(v))
                            for t, v in enumerate(stored[:, y, x]) if v != encoding.nodata and low <= v <= high])
    return out


def reference(name: str, pixel: list[tuple[int, float, int]], dates: list[date], p: float,
              base: dict[str, float] | None) -> float:
    """The reducer over one pixel's values, from the definitions."""
    if name == "count":
        return float(len(pixel))
    if not pixel:
        return math.nan
    values = np.array([v for _, v, _ in pixel])
    mean = float(values.mean())
    peak = {"argmax_date": max(pixel, key=lambda e: e[1]), "argmin_date": min(pixel, key=lambda e: e[1])}
    answers: dict[str, Callable[[], float]] = {
        "mean": lambda: mean,
        "sum": lambda: float(values.sum()),
        "min": lambda: float(values.min()),
        "max": lambda: float(values.max()),
        "median": lambda: float(np.median(values)),
        "percentile": lambda: float(np.percentile(values, p)),
        "std": lambda: float(np.std(values, ddof=1)) if len(values) > 1 else math.nan,
        "first": lambda: pixel[0][1],
        "last": lambda: pixel[-1][1],
        "argmax_date": lambda: float(dates[peak["argmax_date"][0]].timetuple().tm_yday),
        "argmin_date": lambda: float(dates[peak["argmin_date"][0]].timetuple().tm_yday),
    }
    if name in answers:
        return answers[name]()
    assert base is not None
    spread = base["max"] - base["min"]
    return {
        "anomaly": mean - base["mean"],
        "zscore": (mean - base["mean"]) / base["std"] if base["std"] > 0 else math.nan,
        "vci": 100 * (mean - base["min"]) / spread if spread > 0 else math.nan,
        "tci": 100 * (base["max"] - mean) / spread if spread > 0 else math.nan,
    }[name]


def reference_climatology(pixels: list[list[list[tuple[int, float, int]]]]) -> list[list[dict[str, float]]]:
    out = []
    for row in pixels:
        out.append([])
        for pixel in row:
            values = np.array([v for _, v, _ in pixel])
            out[-1].append({
                "count": float(len(values)),
                "mean": float(values.mean()) if len(values) else math.nan,
                "std": float(np.std(values, ddof=1)) if len(values) > 1 else math.nan,
                "min": float(values.min()) if len(values) else math.nan,
                "max": float(values.max()) if len(values) else math.nan,
            })
    return out


def close(got: np.ndarray, expected: np.ndarray, rtol: float = 2e-6, atol: float = 1e-9) -> None:
    assert np.array_equal(np.isnan(got), np.isnan(expected)), (got, expected)
    assert np.allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True), np.nanmax(abs(got - expected))


BASELINE_STORED = stack(NDVI, 12, seed=99)


def baseline_for(encoding: Encoding) -> tuple[Climatology, list[list[dict[str, float]]]]:
    stored = stack(encoding, 12, seed=99)
    return climatology(decode(stored, encoding)), reference_climatology(physical(stored, encoding))


@pytest.mark.parametrize("encoding", [NDVI, LST, ANGLE], ids=["int16-scaled", "uint16-scaled", "uint8-offset"])
@pytest.mark.parametrize("count", [1, 2, 7])
@pytest.mark.parametrize("name", NAMES)
def test_every_reducer_against_its_definition(name: str, count: int, encoding: Encoding) -> None:
    stored = stack(encoding, count)
    dates = dates_of(count)
    base, base_reference = baseline_for(encoding)
    got = reduce(reducer(name), decode(stored, encoding), dates, base)
    pixels = physical(stored, encoding)
    expected = np.array([[reference(name, pixels[y][x], dates, PS.get(name, 0.0), base_reference[y][x])
                          for x in range(stored.shape[2])] for y in range(stored.shape[1])])
    assert got.shape == stored.shape[1:] and got.dtype == np.float64
    magnitude = max(abs(v) for row in pixels for pixel in row for _, v, _ in pixel)
    error = 8 * float(np.finfo(np.float32).eps) * magnitude  # float32's, decoding values of that size
    close(got, expected, rtol=1e-5, atol=error * (100 if name in ("vci", "tci") else 1))
    if name != "count":
        assert np.isnan(got[0, 0])  # no valid observation: no value, not 0
    out = reducer(name).output_encoding(encoding)
    written = encode(got, out)
    assert written.dtype == np.dtype(out.dtype)
    if name in ("min", "max", "first", "last"):  # the input's own stored values, exactly
        pick = {"min": min, "max": max}.get(name)
        want = [[(pick(pixels[y][x], key=lambda e: e[1]) if pick else pixels[y][x][0 if name == "first" else -1])[2]
                 if pixels[y][x] else encoding.nodata for x in range(stored.shape[2])] for y in range(stored.shape[1])]
        assert written.tolist() == want


def test_percentiles_across_p() -> None:
    stored = stack(NDVI, 9)
    values, pixels = decode(stored, NDVI), physical(stored, NDVI)
    for p in (0.0, 1.0, 25.0, 50.0, 62.5, 99.0, 100.0):
        expected = np.array([[reference("percentile", px, [], p, None) for px in row] for row in pixels])
        close(reduce(Reducer("percentile", p), values, dates_of(9)), expected)
    close(reduce(Reducer("median"), values, dates_of(9)), reduce(Reducer("percentile", 50.0), values, dates_of(9)))
    assert reduce(Reducer("percentile", 0.0), values, dates_of(9))[0, 3] == pytest.approx(
        min(v for _, v, _ in pixels[0][3]))


def test_ties_go_to_the_earliest_date() -> None:
    values = np.array([[[1.0]], [[3.0]], [[np.nan]], [[3.0]], [[1.0]]], np.float32)
    dates = [date(2021, 12, 27), date(2022, 1, 4), date(2022, 1, 12), date(2022, 1, 20), date(2022, 1, 28)]
    assert reduce(Reducer("argmax_date"), values, dates)[0, 0] == 4  # 4 January, not 20 January
    assert reduce(Reducer("argmin_date"), values, dates)[0, 0] == 361  # 27 December: of its own year
    assert reduce(Reducer("first"), values, dates)[0, 0] == 1 and reduce(Reducer("last"), values, dates)[0, 0] == 1


def test_a_pixel_without_observations_is_nodata_in_every_output_encoding() -> None:
    values = np.full((3, 2, 2), np.nan, np.float32)
    values[:, 1, 1] = [1.0, 2.0, 4.0]
    base = climatology(np.array([[[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 5.0]]], np.float32))
    for name in NAMES:
        out = reducer(name).output_encoding(NDVI)
        written = encode(reduce(reducer(name), values, dates_of(3), base), out)
        if name == "count":
            assert written.tolist() == [[0, 0], [0, 3]] and written.dtype == np.uint16
        else:
            assert written[0, 0] == out.fill or (math.isnan(out.fill) and np.isnan(written[0, 0])), name
            assert not (written[1, 1] == out.fill or np.isnan(written[1, 1])), name


def test_a_baseline_without_spread_gives_no_value() -> None:
    values = np.array([[[0.5, 0.5, 0.5]]], np.float32)
    flat = climatology(np.array([[[0.2, 0.2, np.nan]], [[0.2, 0.4, np.nan]]], np.float32))
    assert flat.std[0, 0] == 0 and flat.max[0, 0] == flat.min[0, 0] and np.isnan(flat.mean[0, 2])
    for name in ("zscore", "vci", "tci"):
        result = reduce(Reducer(name), values, dates_of(1), flat)
        assert np.isnan(result[0, 0]) and not np.isnan(result[0, 1]) and np.isnan(result[0, 2]), name
    assert reduce(Reducer("anomaly"), values, dates_of(1), flat)[0, 0] == pytest.approx(0.3)


@pytest.mark.parametrize("name", NAMES)
def test_streaming_equals_the_whole_stack(name: str) -> None:
    """Read a date at a time, or (the order statistics) by blocks of rows: 9 rows in blocks
    of 4, 4 and 1, or of 1."""
    stored = stack(NDVI, 7, shape=(9, 11), seed=5)
    values, dates = decode(stored, NDVI), dates_of(7)
    base = climatology(decode(stack(NDVI, 5, shape=(9, 11), seed=6), NDVI))
    whole = reduce(reducer(name), values, dates, base)
    for rows in (4, 1):
        reads: list[tuple[int, slice]] = []

        def read(index: int, part: slice, reads: list[tuple[int, slice]] = reads) -> np.ndarray:
            reads.append((index, part))
            return values[index, part].copy()

        streamed = reduce_stream(reducer(name), read, dates, (9, 11), base, max_bytes=rows * 11 * (7 * 9 + 96))
        close(streamed, whole, rtol=1e-12)
        if reducer(name).by_blocks:
            assert len(reads) == 7 * math.ceil(9 / rows) and {p.stop - p.start for _, p in reads} <= {rows, 9 % rows}
        else:
            assert reads == [(i, slice(0, 9)) for i in range(7)]
    fed = accumulator(reducer(name), (9, 11), base) if not reducer(name).by_blocks else None
    if fed is not None:
        for day, layer in zip(dates, values, strict=True):
            fed.add(day, layer)
        close(fed.result(), whole, rtol=1e-12)


def generated(index: int, rows: slice, width: int = 300) -> np.ndarray:
    """A date's values made on demand (so that no stack is held): a smooth field, NaN where
    a pattern says."""
    y = np.arange(rows.start, rows.stop, dtype=np.float32)[:, None]
    x = np.arange(width, dtype=np.float32)[None, :]
    values = np.sin(0.05 * x + 0.03 * y + 0.7 * index).astype(np.float32)
    values[((x + 2 * y + index) % 7 == 0)] = np.nan
    return values


@pytest.mark.parametrize("name", ["median", "mean", "std", "argmax_date"])
def test_streaming_memory_is_bounded_by_a_block_or_a_date(name: str) -> None:
    """80 dates of 120 × 300 (a stack of 11.5 MB): the median by blocks of 1 MiB, the others
    a date at a time (a few arrays of 0.3 MB), each at a third of the stack at most."""
    count, shape = 80, (120, 300)
    dates = dates_of(count, step=1)
    tracemalloc.start()
    try:
        result = reduce_stream(reducer(name), generated, dates, shape, max_bytes=1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    stack_bytes = count * shape[0] * shape[1] * 4
    assert peak < 4 * (1 << 20) < stack_bytes / 2.5, peak
    whole = np.stack([generated(i, slice(0, shape[0])) for i in range(count)])
    close(result, reduce(reducer(name), whole, dates), rtol=1e-9)


def test_the_climatology_against_its_definition_and_its_streaming_form() -> None:
    stored = stack(LST, 11, seed=3)
    got = climatology(decode(stored, LST))
    expected = reference_climatology(physical(stored, LST))
    for statistic in STATISTICS:
        want = np.array([[pixel[statistic] for pixel in row] for row in expected])
        close(getattr(got, statistic).astype(np.float64), want, rtol=1e-6)
    assert got.count.dtype == np.int32 and got.mean.dtype == np.float32
    assert got.count[0, 0] == 0 and np.isnan(got.std[0, 1]) and not np.isnan(got.mean[0, 1])


def test_a_climatology_as_a_geotiff(tmp_path: Path) -> None:
    got = climatology(decode(stack(NDVI, 11, shape=(30, 40), seed=4), NDVI))
    data = to_geotiff(got, "EPSG:4326", Affine(0.005, 0, -109.0, 0, -0.005, 38.0), "NDVI",
                      {"BASELINE": "2001-01-01/2020-12-31", "GROUP": "month-07"})
    path = tmp_path / "climatology.tif"
    path.write_bytes(data)
    for source in (data, path):
        stored = from_geotiff(source)
        for statistic in STATISTICS:
            assert np.array_equal(getattr(stored.climatology, statistic), getattr(got, statistic), equal_nan=True)
        assert stored.crs == "EPSG:4326" and stored.transform == Affine(0.005, 0, -109.0, 0, -0.005, 38.0)
        assert stored.unit == "NDVI" and stored.tags["GROUP"] == "month-07" and stored.tags["DDOF"] == "1"
    import rasterio

    with rasterio.open(path) as raster:
        assert raster.descriptions == STATISTICS and math.isnan(raster.nodata) and raster.dtypes[0] == "float32"
        assert raster.units == ("NDVI", "NDVI", "NDVI", "NDVI", "observations")
    with rasterio.open(path, "r+") as raster:
        raster.set_band_description(2, "spread")
    with pytest.raises(ValueError, match="no band named std"):
        from_geotiff(path)


def test_output_encodings() -> None:
    def out(name: str, encoding: Encoding) -> Encoding:
        return reducer(name).output_encoding(encoding)

    for name in ("min", "max", "first", "last"):
        assert out(name, NDVI) is NDVI and out(name, SNOW) is SNOW
    float_input = Encoding("float32", math.nan, unit="K")
    assert out("median", float_input) is float_input and out("percentile", float_input) is float_input
    for name, unit in (("median", "NDVI"), ("percentile", "NDVI"), ("mean", "NDVI"), ("std", "NDVI"),
                       ("sum", "NDVI"), ("anomaly", "NDVI"), ("zscore", ""), ("vci", "%"), ("tci", "%")):
        made = out(name, NDVI)
        assert (made.dtype, made.scale, made.offset, made.unit) == ("float32", 1.0, 0.0, unit), name
        assert made.nodata is not None and math.isnan(made.nodata)
    assert out("count", NDVI) == COUNT and (COUNT.dtype, COUNT.nodata, COUNT.unit) == ("uint16", 65535, "observations")
    assert out("count", SNOW) == COUNT
    assert out("argmax_date", NDVI) == DAY_OF_YEAR and (DAY_OF_YEAR.dtype, DAY_OF_YEAR.nodata) == ("int16", -1)
    for name in ("mean", "median", "std", "sum", "percentile", "argmax_date", "anomaly", "vci"):
        with pytest.raises(ReducerError, match="categorical"):
            out(name, SNOW)
    assert encode(np.array([0.0, 65534.0, 70000.0, np.nan]), COUNT).tolist() == [0, 65534, 65534, 65535]


@pytest.mark.parametrize(("name", "p", "message"), [
    ("average", None, "unknown built-in reducer 'average'"), ("percentile", None, "takes p"),
    ("mean", 50.0, "takes p"), ("percentile", 101.0, "from 0 to 100"), ("percentile", -1.0, "from 0 to 100"),
    ("percentile", math.nan, "from 0 to 100"), ("x" * 1000, None, "…"),
])
def test_a_reducer_that_is_not_one_is_refused(name: str, p: float | None, message: str) -> None:
    with pytest.raises(ReducerError, match=message):
        Reducer(name, p)


def test_dates_stacks_and_baselines_are_checked() -> None:
    values = np.zeros((3, 2, 2), np.float32)
    for name in ("first", "median"):
        with pytest.raises(ValueError, match="increasing"):
            reduce(Reducer(name), values, [date(2022, 1, 1), date(2022, 1, 1), date(2022, 1, 9)])
    with pytest.raises(ValueError, match="2 dates for a stack of 3"):
        reduce(Reducer("mean"), values, dates_of(2))
    with pytest.raises(ValueError, match="time, y, x"):
        reduce(Reducer("mean"), values[0], dates_of(2))
    with pytest.raises(ValueError, match="needs a baseline"):
        reduce(Reducer("anomaly"), values, dates_of(3))
    with pytest.raises(ValueError, match="baseline is"):
        reduce(Reducer("zscore"), values, dates_of(3), climatology(np.zeros((2, 3, 3), np.float32)))
    fed = accumulator(Reducer("last"), (2, 2))
    fed.add(date(2022, 1, 9), values[0])
    for day in (date(2022, 1, 1), date(2022, 1, 9)):
        with pytest.raises(ValueError, match="increasing"):
            fed.add(day, values[1])
    with pytest.raises(ValueError, match="shape"):
        fed.add(date(2022, 1, 17), np.zeros((3, 3), np.float32))
    with pytest.raises(ValueError, match="blocks of rows"):
        accumulator(Reducer("median"), (2, 2))
    with pytest.raises(ValueError, match="increasing"):
        reduce_stream(Reducer("median"), lambda i, rows: values[i, rows], dates_of(3)[::-1], (2, 2))


@pytest.mark.parametrize("encoding", [NDVI, LST, ANGLE, SNOW, DEPTH],
                         ids=["int16-scaled", "uint16-scaled", "uint8-offset", "categorical", "negative-scale"])
@pytest.mark.parametrize("count", [1, 2, 7])
@pytest.mark.parametrize("name", STORED)
def test_on_stored_values_as_on_decoded_ones(name: str, count: int, encoding: Encoding) -> None:
    """Reduced on the stored values, the stored answer is the decoded answer encoded, to
    the value, nodata where no date had a value; no float array is read."""
    stored = stack(encoding, count, seed=count)
    dates = dates_of(count)
    assert exact(encoding) and on_stored(reducer(name), encoding)
    reads: list[int] = []

    def read(index: int) -> np.ndarray:
        reads.append(index)
        return stored[index].copy()

    got = reduce_stored(reducer(name), read, dates, stored.shape[1:], encoding)
    out = reducer(name).output_encoding(encoding)
    expected = encode(reduce(reducer(name), decode(stored, encoding), dates), out)
    assert got.dtype == np.dtype(out.dtype) and got.tolist() == expected.tolist()
    assert reads == list(range(count))
    if name != "count":
        assert got[0, 0] == encoding.nodata


def test_on_stored_values_without_nodata_or_valid_range() -> None:
    """A layer whose every value is one (no fill, no range): the type's own extremes are
    values, a pixel is nodata only where no date was read."""
    flags = Encoding("uint8", None)
    stored = np.array([[[0, 255, 7]], [[0, 3, 255]]], np.uint8)
    for name in STORED:
        out = Reducer(name).output_encoding(flags)
        expected = encode(reduce(Reducer(name), decode(stored, flags), dates_of(2)), out)
        got = reduce_stored(Reducer(name), lambda i: stored[i], dates_of(2), (1, 3), flags)
        assert got.tolist() == expected.tolist()
    assert reduce_stored(Reducer("max"), lambda i: stored[i], dates_of(2), (1, 3), flags).tolist() == [[0, 255, 255]]
    assert reduce_stored(Reducer("min"), lambda i: stored[i], dates_of(2), (1, 3), flags).tolist() == [[0, 3, 7]]


def test_what_runs_on_stored_values() -> None:
    """Only the reducers answering with a stored value or a count, and only over integer
    layers of up to 16 bits whose values decode one to one; the others are refused."""
    lossy = Encoding("uint16", None, 1e-7, 1000.0)  # float32 cannot tell 1000.0000001 from 1000.0000002
    assert not exact(lossy) and not exact(Encoding("float32", math.nan)) and not exact(Encoding("int32", -1))
    assert not on_stored(Reducer("max"), lossy) and not on_stored(Reducer("mean"), NDVI)
    with pytest.raises(ValueError, match="reduce_stream"):
        reduce_stored(Reducer("max"), lambda i: np.zeros((1, 1), np.uint16), dates_of(1), (1, 1), lossy)
    with pytest.raises(ValueError, match="reduce_stream"):
        reduce_stored(Reducer("median"), lambda i: np.zeros((1, 1), np.int16), dates_of(1), (1, 1), NDVI)
    with pytest.raises(ValueError, match="increasing"):
        reduce_stored(Reducer("max"), lambda i: np.zeros((1, 1), np.int16), dates_of(2)[::-1], (1, 1), NDVI)
    with pytest.raises(ValueError, match="shape"):
        reduce_stored(Reducer("max"), lambda i: np.zeros((2, 1), np.int16), dates_of(1), (1, 1), NDVI)

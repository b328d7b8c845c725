"""Values in and out: every stored value of every layer of the MODIS catalog decodes to
stored × scale + offset and encodes back to itself; the fill, values outside the valid range
and non-finite floats decode to NaN and encode to the fill; rounding, clipping and NaN
nodata."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.modis.products import CATALOG, Layer
from pipeline.science.encoding import Encoding, decode, encode, float32, usable

pytestmark = pytest.mark.filterwarnings("error")  # a warning on the console is a failure


def of(layer: Layer) -> Encoding:
    """The encoding the MODIS side builds from its catalog's layer."""
    return Encoding(layer.dtype, layer.nodata, layer.scale, layer.offset, layer.unit, layer.valid, layer.categorical)


LAYERS = {f"{p.name}.{layer.name}": layer for p in CATALOG.values() for layer in p.layers}


def every_value_or_those_that_decide(layer: Layer) -> np.ndarray:
    """Every value a layer's type can store, or for a 32-bit type (QC bit fields), the
    values around each bound that decides (the type's, the valid range's, nodata's, fill's)
    and a million others drawn at random."""
    info = np.iinfo(layer.dtype)
    if info.bits <= 16:
        return np.arange(info.min, info.max + 1, dtype=np.int64).astype(layer.dtype)
    bounds = [info.min, info.max, *layer.valid, layer.fill, *([] if layer.nodata is None else [layer.nodata])]
    near = np.concatenate([np.arange(int(b) - 1024, int(b) + 1025, dtype=np.int64) for b in bounds])
    drawn = np.random.default_rng(0).integers(info.min, info.max, 1_000_000, dtype=np.int64, endpoint=True)
    values = np.unique(np.concatenate([near, drawn]))
    return values[(values >= info.min) & (values <= info.max)].astype(layer.dtype)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_every_stored_value_of_every_catalog_layer_decodes_and_encodes_back(name: str) -> None:
    layer = LAYERS[name]
    stored = every_value_or_those_that_decide(layer)
    encoding = of(layer)
    values = decode(stored, encoding)
    assert values.dtype == (np.float32 if np.dtype(layer.dtype).itemsize <= 2 else np.float64)
    is_value = (stored >= layer.valid[0]) & (stored <= layer.valid[1])
    if layer.nodata is not None:
        is_value &= stored != layer.nodata
    assert np.array_equal(~np.isnan(values), is_value)
    assert np.array_equal(usable(stored, encoding), is_value)
    expected = stored[is_value].astype(np.float64) * layer.scale + layer.offset
    assert np.allclose(values[is_value], expected, rtol=1e-6, atol=1e-6 * layer.scale)
    back = encode(values, encoding)
    assert back.dtype == np.dtype(layer.dtype)
    assert np.array_equal(back[is_value], stored[is_value])
    assert np.all(back[~is_value] == layer.fill)


def test_scale_and_offset() -> None:
    angle = of(CATALOG["MOD11A1"].layer("Day_view_angl"))  # uint8, 1 × stored − 65, fill 255, valid 0–130
    assert decode(np.array([0, 65, 130, 131, 255], np.uint8), angle).tolist()[:3] == [-65.0, 0.0, 65.0]
    assert np.isnan(decode(np.array([131, 255], np.uint8), angle)).all()
    lst = of(CATALOG["MOD11A1"].layer("LST_Day_1km"))  # uint16 × 0.02 K, fill 0, valid 7500–65535
    assert decode(np.array([15000], np.uint16), lst, np.float64)[0] == 300.0
    assert encode(np.array([300.0, 299.99, np.nan, 100.0, 2000.0]), lst).tolist() == [15000, 15000, 0, 7500, 65535]
    ndvi = of(CATALOG["MOD13A1"].layer("500m_16_days_NDVI"))
    assert encode(np.array([0.81234, -0.5, 1.5, np.nan]), ndvi).tolist() == [8123, -2000, 10000, -3000]


def test_rounding_is_to_the_nearest_halves_to_even() -> None:
    counts = Encoding("int16", -1, valid=(0, 100))
    assert encode(np.array([0.5, 1.5, 2.4999, 2.5, 2.5001, -0.2]), counts).tolist() == [0, 2, 2, 2, 3, 0]


def test_clipping_to_the_type_where_there_is_no_valid_range() -> None:
    raw = Encoding("uint8", 255)
    assert encode(np.array([-3.0, 254.0, 300.0, np.inf, -np.inf]), raw).tolist() == [0, 254, 255, 255, 255]
    # (an infinity is no value: the fill, as NaN is)


def test_a_layer_without_a_fill_is_masked_by_its_range_alone_and_written_with_its_types_largest() -> None:
    qc = of(CATALOG["MOD11A1"].layer("QC_Day"))  # a bit field: every value means something
    stored = np.arange(256, dtype=np.uint8)
    assert not np.isnan(decode(stored, qc)).any()
    assert encode(np.array([np.nan, 3.0]), qc).tolist() == [255, 3]


def test_float_layers_nan_nodata_and_non_finite_values() -> None:
    nan_nodata = float32("K")
    assert math.isnan(nan_nodata.nodata) and nan_nodata.unit == "K" and nan_nodata.is_float
    stored = np.array([1.5, np.nan, np.inf, -np.inf, -9999.0], np.float32)
    assert np.array_equal(decode(stored, nan_nodata), [1.5, np.nan, np.nan, np.nan, -9999.0], equal_nan=True)
    fill = Encoding("float32", -9999.0, valid=(-100.0, 100.0))
    assert np.array_equal(decode(stored, fill), [1.5, np.nan, np.nan, np.nan, np.nan], equal_nan=True)
    assert encode(np.array([1.25, np.nan, 1e39]), fill).tolist() == [1.25, -9999.0, 100.0]
    written = encode(np.array([1.25, np.nan, 1e39, -np.inf]), nan_nodata)
    assert written.dtype == np.float32 and written[0] == 1.25 and np.isnan(written[[1, 3]]).all()
    assert written[2] == np.finfo(np.float32).max  # clipped to the type, as an integer type's values are
    scaled = Encoding("float32", math.nan, scale=0.5, offset=10.0)
    assert decode(np.array([4.0], np.float32), scaled)[0] == 12.0
    assert encode(np.array([12.0]), scaled)[0] == 4.0


def test_decode_as_float64() -> None:
    wide = Encoding("int32", -1, scale=1e-3)
    values = decode(np.array([123456789, -1], np.int32), wide, np.float64)
    assert values.dtype == np.float64 and values[0] == pytest.approx(123456.789, abs=1e-9) and np.isnan(values[1])
    assert encode(values, wide).tolist() == [123456789, -1]


@pytest.mark.parametrize("arguments", [
    ("bool", None), ("str", None), ("int16", 1.5), ("uint8", 256), ("uint8", -1), ("int16", math.nan),
])
def test_an_impossible_encoding_is_refused(arguments: tuple[str, float | None]) -> None:
    with pytest.raises(ValueError):
        Encoding(*arguments)


def test_an_impossible_scale_or_range_is_refused() -> None:
    for changes in ({"scale": 0.0}, {"scale": math.inf}, {"offset": math.nan}, {"valid": (5.0, 1.0)}):
        with pytest.raises(ValueError):
            Encoding("int16", -1, **changes)

"""The product catalog against the real world: every layer's encoding as Planetary Computer's
19 recorded MODIS collections and the real granules' own attributes give it, the compositing
periods as real granules' names and metadata date them, and the quality layers decoded and
applied as the user guides say."""

from __future__ import annotations

import json
import re
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pytest
from pyhdf.SD import SD, SDC

from bagpipe import modis_world as world
from pipeline.modis import quality
from pipeline.modis.products import CATALOG, last_day, period_count, periods

RECORDED = json.loads((world.STAC_DATA / "pc-modis-061-collections.json").read_text())["collections"]
RESOLUTION = {4800: 250, 2400: 500, 1200: 1000}  # metres, by pixels a tile side
REAL = {path.stem: path for path in world.REAL_DATA.rglob("*.hdf")}
# Real granules' names and the period their ECS metadata gives (RangeBeginningDate,
# RangeEndingDate), from the .hdf.xml files of stactools-packages/modis, tests/data-files,
# commit 8854ceb (the granules themselves are not in this repository).
RECORDED_PERIODS = [
    ("MCD15A2H.A2022025.h01v11.061.2022035062702", "2022-01-25", "2022-02-01"),
    ("MCD64A1.A2021335.h10v06.061.2022035055453", "2021-12-01", "2021-12-31"),
    ("MOD09A1.A2022033.h19v10.061.2022042043514", "2022-02-02", "2022-02-09"),
    ("MOD11A1.A2022041.h19v02.061.2022042095544", "2022-02-10", "2022-02-10"),
    ("MOD11A2.A2022033.h19v10.061.2022042044121", "2022-02-02", "2022-02-09"),
    ("MOD13A1.A2022017.h12v11.061.2022034232214", "2022-01-17", "2022-02-01"),
    ("MOD13Q1.A2022017.h12v11.061.2022034232400", "2022-01-17", "2022-02-01"),
    ("MOD15A2H.A2022033.h13v10.061.2022042045937", "2022-02-02", "2022-02-09"),
    ("MOD17A2H.A2022025.h08v05.061.2022035065002", "2022-01-25", "2022-02-01"),
    ("MYD09A1.A2022025.h09v08.061.2022035070021", "2022-01-25", "2022-02-01"),
    ("MYD10A2.A2022025.h10v05.061.2022035071201", "2022-01-25", "2022-02-01"),
    ("MYD11A1.A2022039.h21v07.061.2022040192419", "2022-02-08", "2022-02-08"),
    ("MYD11A2.A2022025.h17v00.061.2022035054130", "2022-01-25", "2022-02-01"),
    ("MYD13A1.A2022009.h25v02.061.2022028071925", "2022-01-09", "2022-01-24"),  # Aqua: 8 days after Terra
    ("MYD13Q1.A2022009.h09v06.061.2022028072010", "2022-01-09", "2022-01-24"),
    ("MYD15A2H.A2022025.h22v08.061.2022035072026", "2022-01-25", "2022-02-01"),
    ("MYD17A2H.A2022025.h22v08.061.2022035120601", "2022-01-25", "2022-02-01"),
    # the gap-filled MOD17A2HGF (same 8-day periods): the year's last composite ends on 31 December
    ("MOD17A2H.A2021361.h10v06.061.2022020134637", "2021-12-27", "2021-12-31"),
]


def test_the_catalog_is_planetary_computers_collections() -> None:
    """Data type, scale, unit and resolution of every layer of every product on Planetary
    Computer are those of its recorded collection's raster:bands; the products it lacks
    (MOD13A2, MCD12Q1) are marked as not there."""
    collections = {c["id"]: c for c in RECORDED}
    assert len(collections) == 19 and all(c.startswith("modis-") for c in collections)
    checked = set()
    for product in CATALOG.values():
        if product.stac_collection is None:
            continue
        collection = collections[product.stac_collection]
        bands = {k: v["raster:bands"] for k, v in collection["item_assets"].items() if "raster:bands" in v}
        assert set(product.layer_names) == set(bands), product.name
        for layer in product.layers:
            (band,) = bands[layer.name]
            assert layer.dtype == band["data_type"], (product.name, layer.name)
            assert layer.scale == band.get("scale", 1.0), (product.name, layer.name)
            assert layer.unit == band.get("unit", ""), (product.name, layer.name)
            assert RESOLUTION[product.pixels] == band["spatial_resolution"], (product.name, layer.name)
        assert set(product.platform.split(",")) <= set(collection["summaries"]["platform"]), product.name
        checked.add(product.name)
    assert len(checked) == 19  # 09A1, 10A2, 11A1, 11A2, 13Q1, 13A1, 15A2H, 17A2H (Terra, Aqua), MCD15A2H, 43A4, 64A1
    assert {p.name for p in CATALOG.values() if p.stac_collection is None} == {"MOD13A2", "MYD13A2", "MCD12Q1"}
    assert all(f"modis-{p.name[3:]}-061" not in collections for p in CATALOG.values() if p.stac_collection is None)


@pytest.mark.parametrize("name", ["MOD13A2.A2025001.h18v09.061.2025022080611",
                                  "MCD12Q1.A2001001.h00v08.006.2018142182903",
                                  "MOD10A2.A2022033.h09v05.061.2022042050729"])
def test_the_catalog_is_the_real_granules_encoding(name: str) -> None:
    """Each layer's SDS (found by its NASA name) has the catalog's data type, fill value,
    valid range and scale (either convention); a class layer's attributes name its classes
    as the catalog does."""
    product = CATALOG[name.split(".")[0]]
    sd = SD(str(REAL[name]), SDC.READ)
    try:
        assert set(sd.datasets()) == {layer.sds for layer in product.layers}
        for layer in product.layers:
            sds = sd.select(layer.sds)
            attributes = sds.attributes()
            assert sds.get(start=(0, 0), count=(1, 1)).dtype == np.dtype(layer.dtype), layer.name
            assert attributes.get("_FillValue") == layer.nodata, layer.name
            assert tuple(attributes["valid_range"]) == layer.valid, layer.name
            scale = attributes.get("scale_factor", 1.0)
            assert layer.scale in (pytest.approx(scale), pytest.approx(1 / scale)), layer.name
            named = {v: k for k, v in attributes.items() if isinstance(v, int) and k not in ("_FillValue",)}
            if layer.name in ("LC_Type1", "LC_Type2", "LC_Type3", "LC_Type4", "LC_Type5", "LC_Prop1"):
                assert dict(layer.classes) == {v: k for v, k in named.items() if v != 255}, layer.name
    finally:
        sd.end()


def _range_of(path: Path) -> tuple[date, date]:
    core = SD(str(path), SDC.READ).attributes()["CoreMetadata.0"]
    pattern = r'OBJECT\s*=\s*(RANGEBEGINNINGDATE|RANGEENDINGDATE)\s+NUM_VAL\s*=\s*1\s+VALUE\s*=\s*"([^"]+)"'
    found = dict(re.findall(pattern, core))
    return date.fromisoformat(found["RANGEBEGINNINGDATE"]), date.fromisoformat(found["RANGEENDINGDATE"])


def test_periods_are_those_real_granules_are_named_and_dated_by() -> None:
    """A real granule's name's date starts one of its product's periods, and the period ends
    when the granule's metadata says: 8-day and 16-day composites from 1 January (Aqua's
    16-day ones 8 days later, Terra's last cut at the year's end), calendar months (MCD64A1),
    calendar years dated 1 January (MCD12Q1), single days."""
    cases = [(name, date.fromisoformat(first), date.fromisoformat(last)) for name, first, last in RECORDED_PERIODS]
    cases += [(name, *_range_of(path)) for name, path in REAL.items()]  # MOD13A2 (ten), MCD12Q1, MOD10A2
    assert len(cases) == len(RECORDED_PERIODS) + 12
    for name, first, last in cases:
        product = CATALOG[name.split(".")[0]]
        day = date(int(name.split(".")[1][1:5]), 1, 1) + timedelta(days=int(name.split(".")[1][5:]) - 1)
        assert day == first, name
        assert first in periods(product, first, last), name
        assert last_day(product, first) == last, name
        assert first not in periods(product, last + timedelta(days=1), last + timedelta(days=1)), name


@pytest.mark.parametrize("short", ["MOD10A2", "MYD13A1", "MOD13Q1", "MCD64A1", "MCD12Q1", "MOD11A1"])
def test_period_count_is_the_number_of_periods(short: str) -> None:
    product = CATALOG[short]
    rng = np.random.default_rng(7)
    for _ in range(60):
        start = date(2001, 1, 1) + timedelta(days=int(rng.integers(0, 8000)))
        end = start + timedelta(days=int(rng.integers(-3, 900)))
        assert period_count(product, start, end) == len(periods(product, start, end)), (start, end)
    assert periods(CATALOG["MCD64A1"], date(2024, 1, 31), date(2024, 3, 1)) == [date(2024, m, 1) for m in (1, 2, 3)]
    assert last_day(CATALOG["MCD64A1"], date(2024, 2, 1)) == date(2024, 2, 29)
    assert periods(CATALOG["MCD12Q1"], date(2019, 6, 1), date(2020, 2, 1)) == [date(2019, 1, 1), date(2020, 1, 1)]


def test_the_new_quality_layers_decode_and_mask_as_the_guides_say() -> None:
    # MOD09 state: 8 = land, clear; 9 = cloudy; 12 = cloud shadow; 1024 + 8 = internal cloud flag;
    # 11 = "not set, assumed clear"; 56 = deep ocean, clear (water is masked by the reflectance's fill)
    state = np.array([8, 9, 12, 1032, 11, 56, 8 | 1 << 12 | 1 << 15], dtype="uint16")
    assert quality.usable("sur_refl_state_500m", state).tolist() == [True, False, False, False, True, True, True]
    decoded = quality.decode("sur_refl_state_500m", state)
    assert decoded["land_water"].tolist() == [1, 1, 1, 1, 1, 7, 1] and decoded["internal_snow"][-1] == 1
    # MOD09 QC: MODLAND 00 and every band's quality 0000 (corrections made) vs not processed
    qc = quality.decode("sur_refl_qc_500m", np.array([3 << 30, 0x3FFFFFFF], dtype="uint32"))
    assert qc["band1_quality"].tolist() == [0, 15] and qc["band7_quality"].tolist() == [0, 15]
    assert qc["modland_qa"].tolist() == [0, 3] and qc["atmospheric_correction"].tolist() == [1, 0]
    with pytest.raises(KeyError, match="no masking rule"):
        quality.usable("sur_refl_qc_500m", np.array([0], dtype="uint32"))
    # MOD15 FparLai_QC / MOD17 Psn_QC: main algorithm clear (0), saturated (32), back-up (96),
    # clouds present (8), not produced (128), fill (255); the Aqua bit does not matter
    codes = np.array([0, 32, 96, 8, 128, 255, 2], dtype="uint8")
    for layer in ("FparLai_QC", "Psn_QC_500m"):
        assert quality.usable(layer, codes).tolist() == [True, True, False, False, False, False, True]
    assert quality.decode("FparLai_QC", np.array([2 | 1 << 3 | 3 << 5]))["scf_qc"].tolist() == [3]
    # MCD64 QA: land with valid data (3), land without (1), water (0)
    assert quality.usable("QA", np.array([3, 1, 0, 3 | 1 << 2], dtype="uint8")).tolist() == [True, False, False, True]
    # MCD12 QC: values, not bits
    assert quality.decode("QC", np.array([3], dtype="uint8"))["qc"].tolist() == [3]
    assert quality.fields_of("QC")[0].meanings[3] == "unclassified water"
    # the 1 km and 250 m MOD13 layers decode as the 500 m ones
    assert quality.usable("1_km_16_days_pixel_reliability", np.array([0, 1, 2, 3, -1], dtype="int8")).tolist() == [
        True, True, False, False, False]
    assert quality.decode("250m_16_days_VI_Quality", np.array([2116]))["land_water"].tolist() == [1]


def test_every_quality_mask_the_catalog_names_has_a_rule_and_classes_are_named() -> None:
    for product in CATALOG.values():
        for layer in product.layers:
            if layer.masked_by:
                mask = product.layer(layer.masked_by)
                assert mask.categorical, (product.name, layer.name)
                quality.usable(mask.name, np.zeros(3, dtype=mask.dtype))  # no KeyError: a rule exists
            for code, name in layer.classes:
                assert layer.valid[0] <= code <= layer.valid[1] and name, (product.name, layer.name, code)
    land_cover = CATALOG["MCD12Q1"]
    assert len(land_cover.layer("LC_Type1").classes) == 17
    assert dict(land_cover.layer("LC_Type1").classes)[17] == "Water Bodies"
    assert dict(land_cover.layer("LC_Type2").classes)[0] == "Water Bodies"

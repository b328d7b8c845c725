"""Quality layers decoded as the user guides' tables say, and the rule by which each masks the
data layers it describes (at native resolution, before the warp: a quality code is never
interpolated).

Sources, bit 0 the least significant: the MOD13 user guide (C6/6.1) for ``VI_Quality`` and
``pixel_reliability``; the MOD11 user guide (C6, with its 6.1 note), Table 13, for
``QC_Day``/``QC_Night``; the MCD43 user guide (v6.1) for
``BRDF_Albedo_Band_Mandatory_Quality_BandN``; the MOD09 user guide (C6.1) for
``sur_refl_qc_500m`` and ``sur_refl_state_500m`` (whose bit tables the granules repeat in
their ``QA bitmap index`` attribute); the MOD15 file specification for ``FparLai_QC``, which
MOD17 carries as ``Psn_QC_500m``; the MCD64 user guide (C6.1) for ``QA``; the MCD12 user guide
(C6) for land cover ``QC``, whose codes are values, not bits.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Field:
    """A run of bits of a quality code and what its values mean."""

    name: str
    first_bit: int
    bits: int
    meanings: dict[int, str]

    def of(self, codes: np.ndarray) -> np.ndarray:
        return (codes.astype(np.int64) >> self.first_bit) & ((1 << self.bits) - 1)


Decoded = dict[str, np.ndarray]


@dataclass(frozen=True)
class Table:
    """A quality layer's fields and, if it masks a data layer, the rule that says where the
    data it describes is usable (in words, as the user guide advises, and as code)."""

    fields: tuple[Field, ...]
    rule: str = ""
    usable: Callable[[Decoded], np.ndarray] | None = None


_YES = {0: "no", 1: "yes"}
_USEFULNESS = {0: "highest quality", 1: "lower quality", **{v: "decreasing quality" for v in range(2, 12)},
               12: "lowest quality", 13: "quality so low that it is not useful", 14: "L1B data faulty",
               15: "not useful for any other reason / not processed"}
_LAND_WATER = {0: "shallow ocean", 1: "land", 2: "ocean coastlines and lake shorelines", 3: "shallow inland water",
               4: "ephemeral water", 5: "deep inland water", 6: "moderate or continental ocean", 7: "deep ocean"}
VI_QUALITY = (
    Field("modland_qa", 0, 2, {0: "VI produced with good quality", 1: "VI produced, but check other QA",
                               2: "pixel produced, but most probably cloudy",
                               3: "pixel not produced due to other reasons than clouds"}),
    Field("vi_usefulness", 2, 4, _USEFULNESS),
    Field("aerosol_quantity", 6, 2, {0: "climatology", 1: "low", 2: "intermediate", 3: "high"}),
    Field("adjacent_cloud", 8, 1, _YES),
    Field("atmosphere_brdf_correction", 9, 1, _YES),
    Field("mixed_clouds", 10, 1, _YES),
    Field("land_water", 11, 3, _LAND_WATER),
    Field("possible_snow_ice", 14, 1, _YES),
    Field("possible_shadow", 15, 1, _YES),
)
PIXEL_RELIABILITY = (
    Field("rank", 0, 8, {0: "good data, use with confidence", 1: "marginal data, useful but look at other QA",
                         2: "snow/ice: target covered with snow/ice",
                         3: "cloudy: target not visible, covered with cloud",
                         255: "fill/no data"}),  # -1 as int8
)
LST_QC = (
    Field("mandatory_qa", 0, 2, {0: "LST produced, good quality", 1: "LST produced, other quality",
                                 2: "LST not produced due to cloud effects",
                                 3: "LST not produced primarily due to reasons other than cloud"}),
    Field("data_quality", 2, 2, {0: "good data quality", 1: "other quality data", 2: "TBD", 3: "TBD"}),
    Field("emissivity_error", 4, 2, {0: "average emissivity error <= 0.01", 1: "<= 0.02", 2: "<= 0.04",
                                     3: "> 0.04"}),
    Field("lst_error", 6, 2, {0: "average LST error <= 1 K", 1: "<= 2 K", 2: "<= 3 K", 3: "> 3 K"}),
)
BRDF_MANDATORY = (
    Field("mandatory_qa", 0, 8, {0: "processed, good quality (full BRDF inversions)",
                                 1: "processed, see other QA (magnitude BRDF inversions)", 255: "fill"}),
)
_BAND_QUALITY = {0: "highest quality", 7: "noisy detector", 8: "dead detector, data interpolated in L1B",
                 9: "solar zenith >= 86 degrees", 10: "solar zenith >= 85 and < 86 degrees", 11: "missing input",
                 12: "internal constant used in place of climatological data for at least one atmospheric constant",
                 13: "correction out of bounds, pixel constrained to extreme allowable value",
                 14: "L1B data faulty", 15: "not processed due to deep ocean or clouds"}
SURFACE_REFLECTANCE_QC = (
    Field("modland_qa", 0, 2, {0: "corrected product produced at ideal quality, all bands",
                               1: "corrected product produced at less than ideal quality, some or all bands",
                               2: "corrected product not produced due to cloud effects, all bands",
                               3: "corrected product not produced due to other reasons, some or all bands"}),
    *(Field(f"band{band}_quality", 2 + 4 * (band - 1), 4, _BAND_QUALITY) for band in range(1, 8)),
    Field("atmospheric_correction", 30, 1, _YES),
    Field("adjacency_correction", 31, 1, _YES),
)
SURFACE_REFLECTANCE_STATE = (
    Field("cloud_state", 0, 2, {0: "clear", 1: "cloudy", 2: "mixed", 3: "not set, assumed clear"}),
    Field("cloud_shadow", 2, 1, _YES),
    Field("land_water", 3, 3, {**_LAND_WATER, 6: "continental/moderate ocean"}),
    Field("aerosol_quantity", 6, 2, {0: "climatology", 1: "low", 2: "average", 3: "high"}),
    Field("cirrus", 8, 2, {0: "none", 1: "small", 2: "average", 3: "high"}),
    Field("internal_cloud", 10, 1, _YES),
    Field("internal_fire", 11, 1, _YES),
    Field("mod35_snow_ice", 12, 1, _YES),
    Field("adjacent_cloud", 13, 1, _YES),
    Field("salt_pan", 14, 1, _YES),
    Field("internal_snow", 15, 1, _YES),
)
FPAR_LAI_QC = (
    Field("modland_qc", 0, 1, {0: "good quality (main algorithm with or without saturation)",
                               1: "other quality (back-up algorithm or fill values)"}),
    Field("sensor", 1, 1, {0: "Terra", 1: "Aqua"}),
    Field("dead_detector", 2, 1, {0: "detectors apparently fine for up to 50% of channels 1, 2",
                                  1: "dead detectors caused >50% adjacent detector retrieval"}),
    Field("cloud_state", 3, 2, {0: "significant clouds not present (clear)", 1: "significant clouds were present",
                                2: "mixed cloud present on pixel", 3: "cloud state not defined, assumed clear"}),
    Field("scf_qc", 5, 3, {0: "main (RT) method used, best result possible (no saturation)",
                           1: "main (RT) method used with saturation; good, very usable",
                           2: "main (RT) method failed due to bad geometry, empirical algorithm used",
                           3: "main (RT) method failed due to problems other than geometry, empirical algorithm used",
                           4: "pixel not produced at all, value could not be retrieved"}),
)
BURNED_AREA_QA = (
    Field("land_water", 0, 1, {0: "water grid cell", 1: "land grid cell"}),
    Field("valid_data", 1, 1, {0: "insufficient valid data", 1: "sufficient valid data"}),
    Field("shortened_mapping_period", 2, 1, {0: "mapping period not shortened", 1: "mapping period shortened"}),
    Field("relabeled", 3, 1, {0: "grid cell was not relabeled", 1: "grid cell was relabeled"}),
    Field("spare", 4, 1, {0: "n/a"}),
    Field("special_condition", 5, 3, {0: "none or burned", 1: "too few training observations or burned pixels",
                                      2: "apparent burn date at limits of time series",
                                      3: "apparent water contamination", 4: "persistent hot spot",
                                      5: "reserved", 6: "reserved", 7: "reserved"}),
)
LAND_COVER_QC = (
    Field("qc", 0, 8, {0: "classified land", 1: "unclassified land", 2: "classified water", 3: "unclassified water",
                       4: "classified sea ice", 5: "misclassified water", 6: "omitted snow/ice",
                       7: "misclassified snow/ice", 8: "backfilled label", 9: "forest type changed", 10: "no data",
                       255: "fill"}),
)


def _clear(cloud_state: np.ndarray) -> np.ndarray:
    return np.asarray((cloud_state == 0) | (cloud_state == 3))


TABLES: dict[re.Pattern[str], Table] = {
    re.compile(r"^(\d+m|1_km)_16_days_VI_Quality$"): Table(VI_QUALITY),  # pixel reliability masks MOD13's layers
    re.compile(r"^(\d+m|1_km)_16_days_pixel_reliability$"): Table(
        PIXEL_RELIABILITY, "pixel reliability 0 (good) or 1 (marginal, useful)",
        lambda d: d["rank"] <= 1),
    re.compile(r"^QC_(Day|Night)$"): Table(
        LST_QC, "LST produced (mandatory QA 00 or 01) with an average LST error of at most 2 K",
        lambda d: (d["mandatory_qa"] <= 1) & (d["lst_error"] <= 1)),
    re.compile(r"^BRDF_Albedo_Band_Mandatory_Quality_Band\d$"): Table(
        BRDF_MANDATORY, "mandatory QA 0: processed with full BRDF inversions",
        lambda d: d["mandatory_qa"] == 0),
    re.compile(r"^sur_refl_qc_500m$"): Table(SURFACE_REFLECTANCE_QC),  # the state flags mask MOD09's
    re.compile(r"^sur_refl_state_500m$"): Table(
        SURFACE_REFLECTANCE_STATE, "clear (cloud state 00, or 11: assumed clear), no cloud shadow, "
                                   "no internal cloud flag",
        lambda d: _clear(d["cloud_state"]) & (d["cloud_shadow"] == 0) & (d["internal_cloud"] == 0)),
    re.compile(r"^(FparLai_QC|Psn_QC_500m)$"): Table(
        FPAR_LAI_QC, "the main (radiative transfer) algorithm's retrieval (SCF_QC 000 or 001) under a clear "
                     "sky (cloud state 00 or 11)",
        lambda d: (d["scf_qc"] <= 1) & _clear(d["cloud_state"])),
    re.compile(r"^QA$"): Table(
        BURNED_AREA_QA, "a land grid cell with sufficient valid data",
        lambda d: (d["land_water"] == 1) & (d["valid_data"] == 1)),
    re.compile(r"^QC$"): Table(LAND_COVER_QC),  # a land cover label is the answer whatever its QC
}


def table_of(layer: str) -> Table:
    for pattern, table in TABLES.items():
        if pattern.match(layer):
            return table
    raise KeyError(f"{layer} is not a quality layer bagpipe decodes")


def fields_of(layer: str) -> tuple[Field, ...]:
    return table_of(layer).fields


def decode(layer: str, codes: np.ndarray) -> dict[str, np.ndarray]:
    """Each field of a quality layer's codes, as the user guide numbers its values."""
    return {field.name: field.of(codes) for field in fields_of(layer)}


def usable(layer: str, codes: np.ndarray) -> np.ndarray:
    """Where the data a quality layer describes may be used, by its table's rule:

    - MOD13 pixel reliability 0 (good) or 1 (marginal, "useful");
    - MOD11 QC: LST produced (mandatory QA 00 or 01) with an average LST error of at most 2 K;
    - MCD43 mandatory QA 0: processed with full BRDF inversions;
    - MOD09 state flags: clear, no cloud shadow, no internal cloud flag;
    - MOD15 FparLai_QC and MOD17 Psn_QC: the main algorithm's retrieval under a clear sky;
    - MCD64 QA: a land grid cell with sufficient valid data.
    """
    table = table_of(layer)
    if table.usable is None:
        raise KeyError(f"no masking rule for {layer}")
    return np.asarray(table.usable(decode(layer, codes)), dtype=bool)

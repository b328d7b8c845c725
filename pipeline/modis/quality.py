"""Quality layers decoded as the user guides' tables say, and the rule each product's data
layers are masked by (at native resolution, before the warp: a quality code is never
interpolated).

Sources: the MOD13 user guide (C6/6.1) for ``VI_Quality`` and ``pixel_reliability``; the MOD11
user guide (C6, with its 6.1 note), Table 13, for ``QC_Day``/``QC_Night``; the MCD43 user guide
(v6.1) for ``BRDF_Albedo_Band_Mandatory_Quality_BandN``. Bit 0 is the least significant.
"""

from __future__ import annotations

import re
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


_USEFULNESS = {0: "highest quality", 1: "lower quality", **{v: "decreasing quality" for v in range(2, 12)},
               12: "lowest quality", 13: "quality so low that it is not useful", 14: "L1B data faulty",
               15: "not useful for any other reason / not processed"}
VI_QUALITY = (
    Field("modland_qa", 0, 2, {0: "VI produced with good quality", 1: "VI produced, but check other QA",
                               2: "pixel produced, but most probably cloudy",
                               3: "pixel not produced due to other reasons than clouds"}),
    Field("vi_usefulness", 2, 4, _USEFULNESS),
    Field("aerosol_quantity", 6, 2, {0: "climatology", 1: "low", 2: "intermediate", 3: "high"}),
    Field("adjacent_cloud", 8, 1, {0: "no", 1: "yes"}),
    Field("atmosphere_brdf_correction", 9, 1, {0: "no", 1: "yes"}),
    Field("mixed_clouds", 10, 1, {0: "no", 1: "yes"}),
    Field("land_water", 11, 3, {0: "shallow ocean", 1: "land", 2: "ocean coastlines and lake shorelines",
                                3: "shallow inland water", 4: "ephemeral water", 5: "deep inland water",
                                6: "moderate or continental ocean", 7: "deep ocean"}),
    Field("possible_snow_ice", 14, 1, {0: "no", 1: "yes"}),
    Field("possible_shadow", 15, 1, {0: "no", 1: "yes"}),
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

TABLES: dict[re.Pattern[str], tuple[Field, ...]] = {
    re.compile(r"^\d+m_16_days_VI_Quality$"): VI_QUALITY,
    re.compile(r"^\d+m_16_days_pixel_reliability$"): PIXEL_RELIABILITY,
    re.compile(r"^QC_(Day|Night)$"): LST_QC,
    re.compile(r"^BRDF_Albedo_Band_Mandatory_Quality_Band\d$"): BRDF_MANDATORY,
}


def fields_of(layer: str) -> tuple[Field, ...]:
    for pattern, fields in TABLES.items():
        if pattern.match(layer):
            return fields
    raise KeyError(f"{layer} is not a quality layer bagpipe decodes")


def decode(layer: str, codes: np.ndarray) -> dict[str, np.ndarray]:
    """Each field of a quality layer's codes, as the user guide numbers its values."""
    return {field.name: field.of(codes) for field in fields_of(layer)}


def usable(layer: str, codes: np.ndarray) -> np.ndarray:
    """Where the data a quality layer describes may be used:

    - MOD13 pixel reliability 0 (good) or 1 (marginal, "useful");
    - MOD11 QC: LST produced (mandatory QA 00 or 01) with an average LST error of at most 2 K;
    - MCD43 mandatory QA 0: processed with full BRDF inversions.
    """
    found = decode(layer, codes)
    if "rank" in found:
        return np.asarray((codes == 0) | (codes == 1))
    if "lst_error" in found:
        return (found["mandatory_qa"] <= 1) & (found["lst_error"] <= 1)
    if layer.startswith("BRDF_Albedo"):
        return np.asarray(codes == 0)
    raise KeyError(f"no masking rule for {layer}")

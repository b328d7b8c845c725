"""The MODIS products bagpipe knows: every layer of each with its encoding (data type, fill
value, scale and offset, valid range, unit, class names), which layer quality-masks which,
where each product lives (its Planetary Computer collection if it has one, its CMR short name,
version and DAAC), and the compositing periods a time span covers.

The catalog, not the file, owns the encoding. Data types, scales, units and resolutions are
those of Planetary Computer's STAC collections' ``item_assets`` / ``raster:bands``
(``data/modis/stac/pc-modis-061-collections.json``, its 19 ``modis-*-061`` collections as
recorded; a test checks this table against them); ``raster:bands`` gives no fill value,
valid range or offset, so those come from the user guides' layer tables (MOD09 C6.1, MOD10
v61, MOD11, MOD13, MOD15, MOD17 C6.1, MCD12 C6, MCD43 v6.1, MCD64 C6.1), which the granules'
own HDF attributes repeat (tests read them from the real granules of ``data/modis``: MOD10A2,
MOD13A2, MCD12Q1). Scale follows the multiply convention: value = stored × scale + offset
(HDF's MOD13 files say ``scale_factor 10000``, meaning divide by it).

Layer names are Planetary Computer's asset keys (``500m_16_days_NDVI``); NASA's HDF files
name some SDS with spaces (``500m 16 days NDVI``, ``Burn Date``), which ``hdf_name`` keeps.
MOD13A2 and MCD12Q1 are not on Planetary Computer (``stac_collection`` None): NASA serves
them, and a deployment searching Planetary Computer finds them through CMR
(:func:`pipeline.modis.catalogs.catalog_for`).
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Literal

import numpy as np

from pipeline.science.encoding import Encoding

Range = tuple[float, float]
Classes = tuple[tuple[int, str], ...]
Cadence = Literal["daily", "8-day", "16-day", "monthly", "yearly"]
STEP_DAYS: dict[str, int] = {"daily": 1, "8-day": 8, "16-day": 16}  # the cadences of fixed length
LP_DAAC, NSIDC = "LPCLOUD", "NSIDC_ECS"  # CMR's names of the DAACs that hold MODIS land products


@dataclass(frozen=True)
class Layer:
    """One science dataset of a product, as its granules encode it."""

    name: str  # the STAC asset key and the layer file's suffix
    dtype: str
    nodata: float | None  # _FillValue; None: the layer has none (a bit field using every value)
    valid: Range  # valid_range of the stored values; others are masked
    scale: float = 1.0  # physical value = stored × scale + offset
    offset: float = 0.0
    unit: str = ""
    categorical: bool = False  # class codes or bit fields: nearest resampling; else bilinear
    masked_by: str = ""  # the quality layer that decides which pixels are usable
    hdf_name: str = ""  # the SDS's name in NASA's HDF4 file, where it is not ``name``
    classes: Classes = ()  # (code, name) of a class layer's values, as the user guide names them

    @property
    def encoding(self) -> Encoding:
        """Its encoding, as the built-in work decodes and encodes values
        (``pipeline.science.encoding``)."""
        return Encoding(self.dtype, self.nodata, self.scale, self.offset, self.unit, self.valid, self.categorical,
                        self.classes)

    @property
    def resampling(self) -> str:
        return "nearest" if self.categorical else "bilinear"

    @property
    def sds(self) -> str:
        """The layer's SDS name in the granule's HDF4 file."""
        return self.hdf_name or self.name

    @property
    def fill(self) -> float:
        """The value an output carries where there is no data: the layer's fill value, else
        (a bit field with none, such as MOD11's QC) its type's largest value, whose mandatory
        bits say "not produced"."""
        return self.nodata if self.nodata is not None else float(np.iinfo(self.dtype).max)


@dataclass(frozen=True)
class Product:
    name: str  # the granules' short name: MOD (Terra), MYD (Aqua), MCD (both)
    title: str
    platform: str  # STAC "platform": terra, aqua, or terra,aqua
    cadence: Cadence  # fixed-length composites start on day 1 (+ phase) of each year
    pixels: int  # per tile side: 4800 at 250 m, 2400 at 500 m, 1200 at 1 km
    layers: tuple[Layer, ...]
    stac_collection: str | None  # Planetary Computer's collection id; None: not on Planetary Computer
    cmr_version: str  # the CMR collection's version (NSIDC: "61", LP DAAC: "061")
    daac: str = LP_DAAC  # the DAAC that holds it, as CMR names its data centre
    phase_days: int = 0  # Aqua's 16-day composites start 8 days after Terra's
    collection: str = "061"  # the MODIS collection in granule names

    @property
    def default(self) -> Layer:
        """The layer a request gets when it names the product alone."""
        return self.layers[0]

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(f"{self.name} has no layer {name!r} (it has: {', '.join(self.layer_names)})")

    @property
    def layer_names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    @property
    def period_days(self) -> int:
        """How many days its compositing periods last (a calendar month's or year's longest)."""
        return STEP_DAYS.get(self.cadence) or (31 if self.cadence == "monthly" else 366)


def _vi(prefix: str, words: str, angles: tuple[Range, Range, Range]) -> tuple[Layer, ...]:
    """MOD13's layers at one resolution: ``{prefix}_16_days_NDVI`` on Planetary Computer,
    ``{words} 16 days NDVI`` in NASA's file. ``angles``: the valid ranges of the view zenith,
    sun zenith and relative azimuth angles (MOD13A2's files say 0–18000 for zeniths where the
    user guide gives MOD13A1/Q1 −9000–9000)."""
    reliable = f"{prefix}_16_days_pixel_reliability"

    def layer(key: str, dtype: str, nodata: float, valid: Range, scale: float = 1.0, unit: str = "",
              categorical: bool = False, masked: bool = False, classes: Classes = ()) -> Layer:
        return Layer(f"{prefix}_16_days_{key}", dtype, nodata, valid, scale, unit=unit, categorical=categorical,
                     masked_by=reliable if masked else "", classes=classes,
                     hdf_name=f"{words} 16 days {key.replace('_', ' ')}")

    view, sun, azimuth = angles
    return (
        layer("NDVI", "int16", -3000, (-2000, 10000), 0.0001, "NDVI", masked=True),
        layer("EVI", "int16", -3000, (-2000, 10000), 0.0001, "EVI", masked=True),
        layer("VI_Quality", "uint16", 65535, (0, 65534), categorical=True),
        *(layer(f"{band}_reflectance", "int16", -1000, (0, 10000), 0.0001, masked=True)
          for band in ("red", "NIR", "blue", "MIR")),
        layer("view_zenith_angle", "int16", -10000, view, 0.01, "Degree"),
        layer("sun_zenith_angle", "int16", -10000, sun, 0.01, "Degree"),
        layer("relative_azimuth_angle", "int16", -4000, azimuth, 0.01, "Degree"),
        layer("composite_day_of_the_year", "int16", -1, (1, 366), unit="Julian Day", categorical=True),
        layer("pixel_reliability", "int8", -1, (0, 3), unit="Rank", categorical=True,
              classes=((0, "Good data"), (1, "Marginal data"), (2, "Snow/ice"), (3, "Cloudy"))),
    )


_MOD10A2 = (
    Layer("Maximum_Snow_Extent", "uint8", 255, (0, 254), categorical=True, classes=(
        (0, "Missing data"), (1, "No decision"), (11, "Night"), (25, "No snow"), (37, "Lake"), (39, "Ocean"),
        (50, "Cloud"), (100, "Lake ice"), (200, "Snow"), (254, "Detector saturated"))),
    Layer("Eight_Day_Snow_Cover", "uint8", 0, (0, 255), categorical=True),  # a bit per day of the period
)
_MOD13A1 = _vi("500m", "500m", ((-9000, 9000), (-9000, 9000), (-3600, 3600)))
_MOD13Q1 = _vi("250m", "250m", ((-9000, 9000), (-9000, 9000), (-3600, 3600)))
_MOD13A2 = _vi("1_km", "1 km", ((0, 18000), (0, 18000), (-18000, 18000)))


def _lst(clear: tuple[Layer, Layer]) -> tuple[Layer, ...]:
    """MOD11's layers (daily and 8-day alike but for their clear-sky layers)."""
    return (*(
        layer
        for time in ("Day", "Night")
        for layer in (
            Layer(f"LST_{time}_1km", "uint16", 0, (7500, 65535), 0.02, unit="Kelvin", masked_by=f"QC_{time}"),
            Layer(f"QC_{time}", "uint8", None, (0, 255), categorical=True),
            Layer(f"{time}_view_time", "uint8", 255, (0, 240), 0.1, unit="Hours"),
            Layer(f"{time}_view_angl", "uint8", 255, (0, 130), 1.0, -65.0, unit="Degree"),
        )
    ),
        Layer("Emis_31", "uint8", 0, (1, 255), 0.002, 0.49),
        Layer("Emis_32", "uint8", 0, (1, 255), 0.002, 0.49),
        *clear,
    )


_MOD11A1 = _lst((Layer("Clear_day_cov", "uint16", 0, (1, 65535), 0.0005),
                 Layer("Clear_night_cov", "uint16", 0, (1, 65535), 0.0005)))
_MOD11A2 = _lst((Layer("Clear_sky_days", "uint8", 0, (1, 255), categorical=True),  # a bit per clear day
                 Layer("Clear_sky_nights", "uint8", 0, (1, 255), categorical=True)))
_STATE = "sur_refl_state_500m"
_MOD09A1 = (
    *(Layer(f"sur_refl_b{b:02d}", "int16", -28672, (-100, 16000), 0.0001, masked_by=_STATE) for b in range(1, 8)),
    Layer("sur_refl_qc_500m", "uint32", 4294967295, (0, 4294966531), categorical=True),
    Layer("sur_refl_szen", "int16", 0, (0, 18000), 0.01, unit="Degree"),
    Layer("sur_refl_vzen", "int16", 0, (0, 18000), 0.01, unit="Degree"),
    Layer("sur_refl_raz", "int16", 0, (-18000, 18000), 0.01, unit="Degree"),
    Layer(_STATE, "uint16", 65535, (0, 57343), categorical=True),
    Layer("sur_refl_day_of_year", "uint16", 65535, (1, 366), unit="Julian Day", categorical=True),
)
# MOD15: 0-100 are values; 248-254 name why a pixel has none (water 254, barren 253, snow 252, …)
_MOD15A2H = (
    Layer("Lai_500m", "uint8", 255, (0, 100), 0.1, unit="m^2/m^2", masked_by="FparLai_QC"),
    Layer("Fpar_500m", "uint8", 255, (0, 100), 0.01, unit="Percent", masked_by="FparLai_QC"),
    Layer("FparLai_QC", "uint8", 255, (0, 254), categorical=True),
    Layer("FparExtra_QC", "uint8", 255, (0, 254), categorical=True),
    Layer("LaiStdDev_500m", "uint8", 255, (0, 100), 0.1, unit="m^2/m^2", masked_by="FparLai_QC"),
    Layer("FparStdDev_500m", "uint8", 255, (0, 100), 0.01, unit="Percent", masked_by="FparLai_QC"),
)
# MOD17: 32761-32767 name why a pixel has none (water 32766, barren 32765, …)
_MOD17A2H = (
    Layer("Gpp_500m", "int16", 32767, (0, 30000), 0.0001, unit="kg C/m^2", masked_by="Psn_QC_500m"),
    Layer("PsnNet_500m", "int16", 32767, (-30000, 30000), 0.0001, unit="kg C/m^2", masked_by="Psn_QC_500m"),
    Layer("Psn_QC_500m", "uint8", 255, (0, 254), categorical=True),
)
# MCD64A1: Burn Date 0 unburned, 1-366 day of burning, -1 unmapped (insufficient data), -2 water
_MCD64A1 = (
    Layer("Burn_Date", "int16", -1, (0, 366), unit="Day", categorical=True, masked_by="QA", hdf_name="Burn Date"),
    Layer("Burn_Date_Uncertainty", "uint8", 0, (1, 100), unit="Day", masked_by="QA",
          hdf_name="Burn Date Uncertainty"),
    Layer("QA", "uint8", None, (0, 255), categorical=True),
    Layer("First_Day", "int16", -1, (1, 366), unit="Day", categorical=True, masked_by="QA", hdf_name="First Day"),
    Layer("Last_Day", "int16", -1, (1, 366), unit="Day", categorical=True, masked_by="QA", hdf_name="Last Day"),
)
_IGBP = ((1, "Evergreen Needleleaf Forests"), (2, "Evergreen Broadleaf Forests"), (3, "Deciduous Needleleaf Forests"),
         (4, "Deciduous Broadleaf Forests"), (5, "Mixed Forests"), (6, "Closed Shrublands"), (7, "Open Shrublands"),
         (8, "Woody Savannas"), (9, "Savannas"), (10, "Grasslands"), (11, "Permanent Wetlands"), (12, "Croplands"),
         (13, "Urban and Built-up Lands"), (14, "Cropland/Natural Vegetation Mosaics"),
         (15, "Permanent Snow and Ice"), (16, "Barren"), (17, "Water Bodies"))
_UMD = ((0, "Water Bodies"), *_IGBP[:14], (15, "Barren"))
_LAI = ((0, "Water Bodies"), (1, "Grasslands"), (2, "Shrublands"), (3, "Broadleaf Croplands"), (4, "Savannas"),
        (5, "Evergreen Broadleaf Forests"), (6, "Deciduous Broadleaf Forests"), (7, "Evergreen Needleleaf Forests"),
        (8, "Deciduous Needleleaf Forests"), (9, "Unvegetated"), (10, "Urban and Built-up Lands"))
_BGC = ((0, "Water Bodies"), (1, "Evergreen Needleleaf Vegetation"), (2, "Evergreen Broadleaf Vegetation"),
        (3, "Deciduous Needleleaf Vegetation"), (4, "Deciduous Broadleaf Vegetation"),
        (5, "Annual Broadleaf Vegetation"), (6, "Annual Grass Vegetation"), (7, "Non-Vegetated Land"),
        (8, "Urban and Built-up Lands"))
_PFT = ((0, "Water Bodies"), (1, "Evergreen Needleleaf Trees"), (2, "Evergreen Broadleaf Trees"),
        (3, "Deciduous Needleleaf Trees"), (4, "Deciduous Broadleaf Trees"), (5, "Shrub"), (6, "Grass"),
        (7, "Cereal Crop"), (8, "Broadleaf Crop"), (9, "Urban and Built-up Lands"), (10, "Permanent Snow and Ice"),
        (11, "Barren"))
_LCCS1 = ((1, "Barren"), (2, "Permanent Snow and Ice"), (3, "Water Bodies"), (11, "Evergreen Needleleaf Forests"),
          (12, "Evergreen Broadleaf Forests"), (13, "Deciduous Needleleaf Forests"),
          (14, "Deciduous Broadleaf Forests"), (15, "Mixed Broadleaf/Needleleaf Forests"),
          (16, "Mixed Broadleaf Forests"), (21, "Open Forests"), (22, "Sparse Forests"), (31, "Dense Herbaceous"),
          (32, "Sparse Herbaceous"), (41, "Dense Shrublands"), (42, "Shrubland/Grassland Mosaics"),
          (43, "Sparse Shrublands"))
_LCCS2 = ((1, "Barren"), (2, "Permanent Snow and Ice"), (3, "Water Bodies"), (9, "Urban and Built-Up"),
          (10, "Dense Forest"), (20, "Open Forest"), (25, "Forest Cropland Mosaic"), (30, "Natural Herbaceous"),
          (35, "Natural Herbaceous/Cropland"), (36, "Herbaceous Croplands"), (40, "Shrublands"))
_LCCS3 = ((1, "Barren"), (2, "Permanent Snow and Ice"), (3, "Water Bodies"), (10, "Dense Forest"),
          (20, "Open Forest"), (27, "Woody Wetlands"), (30, "Grasslands"), (40, "Shrublands"),
          (50, "Herbaceous Wetlands"), (51, "Tundra"))
_LC_QC = ((0, "Classified land"), (1, "Unclassified land"), (2, "Classified water"), (3, "Unclassified water"),
          (4, "Classified sea ice"), (5, "Misclassified water"), (6, "Omitted snow/ice"),
          (7, "Misclassified snow/ice"), (8, "Backfilled label"), (9, "Forest type changed"), (10, "No data"))


def _classes(name: str, classes: Classes) -> Layer:
    """A land cover layer: class codes from the first to the last the guide names; 255 fill."""
    return Layer(name, "uint8", 255, (classes[0][0], classes[-1][0]), categorical=True, classes=classes)


# land cover is a label, not a retrieval: QC says how it was made, it masks nothing
_MCD12Q1 = (
    _classes("LC_Type1", _IGBP), _classes("LC_Type2", _UMD), _classes("LC_Type3", _LAI),
    _classes("LC_Type4", _BGC), _classes("LC_Type5", _PFT),
    *(Layer(f"LC_Prop{n}_Assessment", "uint8", 255, (0, 100), unit="Percent") for n in (1, 2, 3)),
    _classes("LC_Prop1", _LCCS1), _classes("LC_Prop2", _LCCS2), _classes("LC_Prop3", _LCCS3),
    _classes("QC", _LC_QC), _classes("LW", ((1, "Water"), (2, "Land"))),
)
_MCD43A4 = tuple(
    Layer(f"Nadir_Reflectance_Band{b}", "int16", 32767, (0, 32766), 0.0001,
          masked_by=f"BRDF_Albedo_Band_Mandatory_Quality_Band{b}") for b in range(1, 8)
) + tuple(
    Layer(f"BRDF_Albedo_Band_Mandatory_Quality_Band{b}", "uint8", 255, (0, 254), categorical=True,
          classes=((0, "Processed, good quality (full BRDF inversions)"),
                   (1, "Processed, see other QA (magnitude BRDF inversions)")))
    for b in range(1, 8)
)


def _pair(code: str, title: str, cadence: Cadence, pixels: int, layers: tuple[Layer, ...], version: str = "061",
          aqua_phase: int = 0, daac: str = LP_DAAC, on_pc: bool = True) -> tuple[Product, Product]:
    """The Terra (MOD) and Aqua (MYD) products of one kind: one STAC collection holds both."""
    collection = f"modis-{code}-061" if on_pc else None
    return (Product(f"MOD{code}", f"{title} (Terra)", "terra", cadence, pixels, layers, collection, version, daac),
            Product(f"MYD{code}", f"{title} (Aqua)", "aqua", cadence, pixels, layers, collection, version, daac,
                    phase_days=aqua_phase))


CATALOG: dict[str, Product] = {
    p.name: p
    for p in (
        *_pair("09A1", "Surface reflectance, 8-day, 500 m", "8-day", 2400, _MOD09A1),
        *_pair("10A2", "Snow cover, 8-day, 500 m", "8-day", 2400, _MOD10A2, "61", daac=NSIDC),
        *_pair("11A1", "Land surface temperature, daily, 1 km", "daily", 1200, _MOD11A1),
        *_pair("11A2", "Land surface temperature, 8-day, 1 km", "8-day", 1200, _MOD11A2),
        *_pair("13Q1", "Vegetation indices, 16-day, 250 m", "16-day", 4800, _MOD13Q1, aqua_phase=8),
        *_pair("13A1", "Vegetation indices, 16-day, 500 m", "16-day", 2400, _MOD13A1, aqua_phase=8),
        *_pair("13A2", "Vegetation indices, 16-day, 1 km", "16-day", 1200, _MOD13A2, aqua_phase=8, on_pc=False),
        *_pair("15A2H", "Leaf area index and FPAR, 8-day, 500 m", "8-day", 2400, _MOD15A2H),
        Product("MCD15A2H", "Leaf area index and FPAR, 8-day, 500 m (Terra and Aqua)", "terra,aqua", "8-day", 2400,
                _MOD15A2H, "modis-15A2H-061", "061"),
        *_pair("17A2H", "Gross primary productivity, 8-day, 500 m", "8-day", 2400, _MOD17A2H),
        Product("MCD43A4", "Nadir BRDF-adjusted reflectance, daily, 500 m (Terra and Aqua)", "terra,aqua", "daily",
                2400, _MCD43A4, "modis-43A4-061", "061"),
        Product("MCD64A1", "Burned area, monthly, 500 m (Terra and Aqua)", "terra,aqua", "monthly", 2400, _MCD64A1,
                "modis-64A1-061", "061"),
        Product("MCD12Q1", "Land cover type, yearly, 500 m (Terra and Aqua)", "terra,aqua", "yearly", 2400,
                _MCD12Q1, None, "061"),
    )
}


def periods(product: Product, start: date, end: date) -> list[date]:
    """First days of the product's compositing periods that overlap [start, end]."""
    if end < start:
        return []
    if product.cadence == "yearly":
        return [date(year, 1, 1) for year in range(start.year, end.year + 1)]
    if product.cadence == "monthly":
        months = range(start.year * 12 + start.month - 1, end.year * 12 + end.month)
        return [date(m // 12, m % 12 + 1, 1) for m in months]
    step = STEP_DAYS[product.cadence]
    found: list[date] = []
    for year in range(start.year - 1, end.year + 1):
        first = date(year, 1, 1) + timedelta(days=product.phase_days)
        offset = max(0, (start - first).days // step - 1)
        day = first + timedelta(days=offset * step)
        while day.year == year and day <= end:
            if last_day(product, day) >= start:
                found.append(day)
            day += timedelta(days=step)
    return found


def last_day(product: Product, first: date) -> date:
    """The last day of the product's compositing period that starts on ``first``: the
    calendar month's or year's last (MCD64A1, MCD12Q1), else its fixed length's, a phase-free
    composite's last period of a year cut short at 31 December (MOD10A2's of 27 December
    2021 covers five days, not eight; Aqua's shifted 16-day ones run on into January)."""
    if product.cadence == "monthly":
        return first.replace(day=calendar.monthrange(first.year, first.month)[1])
    if product.cadence == "yearly":
        return date(first.year, 12, 31)
    last = first + timedelta(days=STEP_DAYS[product.cadence] - 1)
    return last if product.phase_days else min(last, date(first.year, 12, 31))


def period_count(product: Product, start: date, end: date) -> int:
    """How many of the product's compositing periods overlap [start, end] (as
    ``len(periods(...))``, without making them: a year at a time)."""
    if end < start:
        return 0
    if product.cadence == "yearly":
        return end.year - start.year + 1
    if product.cadence == "monthly":
        return (end.year - start.year) * 12 + end.month - start.month + 1
    step, found = STEP_DAYS[product.cadence], 0
    for year in range(start.year - 1, end.year + 1):
        first, year_end = date(year, 1, 1) + timedelta(days=product.phase_days), date(year, 12, 31)
        if first > year_end or end < first or (not product.phase_days and start > year_end):
            continue  # (a phase-free year's last period ends with the year)
        last_k = min((year_end - first).days, (end - first).days) // step
        first_k = max(0, -(-((start - first).days - step + 1) // step))  # the first period ending on or after start
        found += max(0, last_k - first_k + 1)
    return found

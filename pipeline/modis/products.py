"""The MODIS products bagpipe knows: every layer of each with its encoding (data type, fill
value, scale and offset, valid range, unit, resolution), which layer quality-masks which,
where each product lives (its STAC collection, its CMR short name and version), and the
compositing periods a time span covers.

The catalog, not the file, owns the encoding. Data types, scales, units and resolutions are
those of the STAC collections' ``item_assets`` / ``raster:bands`` (Planetary Computer's
``modis-*-061``; ``data/modis/stac/`` keeps them, and a test checks this table against them);
``raster:bands`` gives no fill value, valid range or offset, so those come from the user
guides' layer tables (MOD10 v61, MOD13 and MOD11 C6/6.1, MCD43 v6.1), which the granules'
own HDF attributes repeat. Scale follows the multiply convention: value = stored × scale +
offset (HDF's MOD13 files say ``scale_factor 10000``, meaning divide by it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta

import numpy as np

Range = tuple[float, float]


@dataclass(frozen=True)
class Layer:
    """One science dataset of a product, as its granules encode it."""

    name: str  # the HDF-EOS SDS name, the STAC asset key and the layer file's suffix
    dtype: str
    nodata: float | None  # _FillValue; None: the layer has none (a bit field using every value)
    valid: Range  # valid_range of the stored values; others are masked
    scale: float = 1.0  # physical value = stored × scale + offset
    offset: float = 0.0
    unit: str = ""
    categorical: bool = False  # class codes or bit fields: nearest resampling; else bilinear
    masked_by: str = ""  # the quality layer that decides which pixels are usable

    @property
    def resampling(self) -> str:
        return "nearest" if self.categorical else "bilinear"

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
    period_days: int  # 1 = daily; composites start on day 1 (+ phase) of each year
    pixels: int  # per tile side: 2400 at 500 m, 1200 at 1 km
    layers: tuple[Layer, ...]
    stac_collection: str  # Planetary Computer's collection id
    cmr_version: str  # the CMR collection's version (NSIDC: "61", LP DAAC: "061")
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


_MOD10A2 = (
    Layer("Maximum_Snow_Extent", "uint8", 255, (0, 254), categorical=True),
    Layer("Eight_Day_Snow_Cover", "uint8", 0, (0, 255), categorical=True),  # a bit per day of the period
)
_RELIABLE = "500m_16_days_pixel_reliability"
_VI = "500m_16_days_"
_MOD13A1 = (
    Layer(f"{_VI}NDVI", "int16", -3000, (-2000, 10000), 0.0001, unit="NDVI", masked_by=_RELIABLE),
    Layer(f"{_VI}EVI", "int16", -3000, (-2000, 10000), 0.0001, unit="EVI", masked_by=_RELIABLE),
    Layer(f"{_VI}VI_Quality", "uint16", 65535, (0, 65534), categorical=True),
    *(Layer(f"{_VI}{band}_reflectance", "int16", -1000, (0, 10000), 0.0001, masked_by=_RELIABLE)
      for band in ("red", "NIR", "blue", "MIR")),
    Layer(f"{_VI}view_zenith_angle", "int16", -10000, (-9000, 9000), 0.01, unit="Degree"),
    Layer(f"{_VI}sun_zenith_angle", "int16", -10000, (-9000, 9000), 0.01, unit="Degree"),
    Layer(f"{_VI}relative_azimuth_angle", "int16", -4000, (-3600, 3600), 0.01, unit="Degree"),
    Layer(f"{_VI}composite_day_of_the_year", "int16", -1, (1, 366), unit="Julian Day", categorical=True),
    Layer(_RELIABLE, "int8", -1, (0, 3), unit="Rank", categorical=True),
)
_MOD11A1 = (*(
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
    Layer("Clear_day_cov", "uint16", 0, (1, 65535), 0.0005),
    Layer("Clear_night_cov", "uint16", 0, (1, 65535), 0.0005),
)
_MCD43A4 = tuple(
    Layer(f"Nadir_Reflectance_Band{b}", "int16", 32767, (0, 32766), 0.0001,
          masked_by=f"BRDF_Albedo_Band_Mandatory_Quality_Band{b}") for b in range(1, 8)
) + tuple(
    Layer(f"BRDF_Albedo_Band_Mandatory_Quality_Band{b}", "uint8", 255, (0, 254), categorical=True)
    for b in range(1, 8)
)


def _pair(code: str, title: str, period: int, pixels: int, layers: tuple[Layer, ...], version: str,
          aqua_phase: int = 0) -> tuple[Product, Product]:
    """The Terra (MOD) and Aqua (MYD) products of one kind: one STAC collection holds both."""
    return (Product(f"MOD{code}", f"{title} (Terra)", "terra", period, pixels, layers, f"modis-{code}-061", version),
            Product(f"MYD{code}", f"{title} (Aqua)", "aqua", period, pixels, layers, f"modis-{code}-061", version,
                    phase_days=aqua_phase))


CATALOG: dict[str, Product] = {
    p.name: p
    for p in (
        *_pair("10A2", "Snow cover, 8-day, 500 m", 8, 2400, _MOD10A2, "61"),
        *_pair("13A1", "Vegetation indices, 16-day, 500 m", 16, 2400, _MOD13A1, "061", aqua_phase=8),
        *_pair("11A1", "Land surface temperature, daily, 1 km", 1, 1200, _MOD11A1, "061"),
        Product("MCD43A4", "Nadir BRDF-adjusted reflectance, daily, 500 m (Terra and Aqua)", "terra,aqua", 1, 2400,
                _MCD43A4, "modis-43A4-061", "061"),
    )
}


def periods(product: Product, start: date, end: date) -> list[date]:
    """First days of the product's compositing periods that overlap [start, end]."""
    if end < start:
        return []
    step = timedelta(days=product.period_days)
    found: list[date] = []
    for year in range(start.year - 1, end.year + 1):
        first = date(year, 1, 1) + timedelta(days=product.phase_days)
        offset = max(0, (start - first).days // product.period_days - 1)
        day = first + offset * step
        while day.year == year and day <= end:
            if last_day(product, day) >= start:
                found.append(day)
            day += step
    return found


def last_day(product: Product, first: date) -> date:
    """The last day of the product's compositing period that starts on ``first``: a
    phase-free composite's last period of a year is cut short at 31 December (MOD10A2's of
    27 December 2021 covers five days, not eight)."""
    last = first + timedelta(days=product.period_days - 1)
    return last if product.phase_days else min(last, date(first.year, 12, 31))


def period_count(product: Product, start: date, end: date) -> int:
    """How many of the product's compositing periods overlap [start, end] (as
    ``len(periods(...))``, without making them: a year at a time)."""
    if end < start:
        return 0
    step, found = product.period_days, 0
    for year in range(start.year - 1, end.year + 1):
        first, year_end = date(year, 1, 1) + timedelta(days=product.phase_days), date(year, 12, 31)
        if first > year_end or end < first or (not product.phase_days and start > year_end):
            continue  # (a phase-free year's last period ends with the year)
        last_k = min((year_end - first).days, (end - first).days) // step
        first_k = max(0, -(-((start - first).days - step + 1) // step))  # the first period ending on or after start
        found += max(0, last_k - first_k + 1)
    return found

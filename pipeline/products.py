"""The MODIS products bagpipe knows — the layer of each it processes, with its real encoding
(data type, fill value, scale, resampling) — and the compositing periods a time span covers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta


@dataclass(frozen=True)
class Layer:
    """One science dataset of a product as its granules encode it."""

    name: str  # the HDF-EOS subdataset name, as in the GeoTIFF layer files
    dtype: str
    nodata: float  # _FillValue
    scale: float  # physical value = stored × scale + offset
    offset: float
    pixels: int  # per tile side: 2400 at 500 m, 1200 at 1 km
    categorical: bool  # class codes: nearest resampling; else bilinear
    valid: tuple[float, float]  # valid_range of the stored values

    @property
    def resampling(self) -> str:
        return "nearest" if self.categorical else "bilinear"


@dataclass(frozen=True)
class Product:
    name: str
    title: str
    period_days: int  # 1 = daily; composites start on day 1 of each year, every period_days
    collection: str  # MODIS collection (version) of the granules
    layer: Layer  # the layer bagpipe fetches and reprojects


CATALOG: dict[str, Product] = {
    p.name: p
    for p in (
        # 0 missing, 1 no decision, 11 night, 25 no snow, 37 lake, 39 ocean, 50 cloud,
        # 100 lake ice, 200 snow, 254 saturated, 255 fill
        Product("MOD10A2", "Snow cover, 8-day, 500 m (Terra)", 8, "061",
                Layer("Maximum_Snow_Extent", "uint8", 255, 1.0, 0.0, 2400, True, (0, 254))),
        Product("MOD13A1", "Vegetation indices, 16-day, 500 m (Terra)", 16, "061",
                Layer("500m_16_days_NDVI", "int16", -3000, 0.0001, 0.0, 2400, False, (-2000, 10000))),
        Product("MOD11A1", "Land surface temperature, daily, 1 km (Terra)", 1, "061",
                Layer("LST_Day_1km", "uint16", 0, 0.02, 0.0, 1200, False, (7500, 65535))),
        Product("MCD43A4", "Nadir BRDF-adjusted reflectance, daily, 500 m", 1, "061",
                Layer("Nadir_Reflectance_Band1", "int16", 32767, 0.0001, 0.0, 2400, False, (0, 32766))),
    )
}


def periods(product: Product, start: date, end: date) -> list[date]:
    """First days of the product's compositing periods that overlap [start, end]."""
    if end < start:
        return []
    step = timedelta(days=product.period_days)
    found: list[date] = []
    for year in range(start.year, end.year + 1):
        first = date(year, 1, 1)
        offset = max(0, (start - first).days // product.period_days)
        day = first + offset * step
        while day.year == year and day <= end:
            last = min(day + step - timedelta(days=1), date(year, 12, 31))
            if last >= start:
                found.append(day)
            day += step
    return found


def period_count(product: Product, start: date, end: date) -> int:
    """How many of the product's compositing periods overlap [start, end] (as
    ``len(periods(...))``, without making them: a year at a time)."""
    if end < start:
        return 0
    found = 0
    for year in range(start.year, end.year + 1):
        first, last = date(year, 1, 1), date(year, 12, 31)
        lo, hi = max(start, first), min(end, last)
        found += (hi - first).days // product.period_days - (lo - first).days // product.period_days + 1
    return found

"""The MODIS products bagpipe knows, and the compositing periods a time span covers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta


@dataclass(frozen=True)
class Product:
    name: str
    title: str
    period_days: int  # 1 = daily; composites start on day 1 of each year, every period_days
    collection: str  # MODIS collection (version) of the granules


CATALOG: dict[str, Product] = {
    p.name: p
    for p in (
        Product("MOD10A2", "Snow cover, 8-day, 500 m (Terra)", 8, "061"),
        Product("MOD13A1", "Vegetation indices, 16-day, 500 m (Terra)", 16, "061"),
        Product("MOD11A1", "Land surface temperature, daily, 1 km (Terra)", 1, "061"),
        Product("MCD43A4", "Nadir BRDF-adjusted reflectance, daily, 500 m", 1, "061"),
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

"""The world the local stack's imitations of Planetary Computer and NASA serve: which MODIS
granules exist, their names, and their content.

As in reality: land products exist only for tiles with land on them (Natural Earth's 1:50m
land, the portal's map data, rasterized at 0.25°: about 300 of the 460 tiles on the globe),
not for dates before a platform's first data nor during an outage (Terra's safe mode of
February 2016) nor before it is produced (days after its period), and a granule's name
carries its production timestamp. The real granules in
``data/modis`` (MOD10A2 h09v05, 2 February 2022, HDF4 and COG layers; ten MOD13A2 h18v09
composites of 2025, HDF4) are served as they are;
every other granule is synthesized on the exact MODIS grid in the product catalog's
encoding, deterministic from (product, tile, date), and written as NASA writes it (HDF4-EOS,
SDS named as NASA names them, MOD13's divide-by ``scale_factor``) or as Planetary Computer does (a COG per layer).
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from datetime import UTC, date, datetime, timedelta
from functools import cache, lru_cache
from pathlib import Path

import numpy as np
from pyhdf.SD import SD, SDC
from rasterio import features
from rasterio.io import MemoryFile
from rasterio.transform import from_origin

from pipeline.modis.grid import RADIUS, TILES_H, TILES_V, Tile
from pipeline.modis.products import CATALOG, Layer, Product, last_day
from pipeline.modis.targets import native_transform, sinusoidal

ROOT = Path(__file__).resolve().parents[1]
REAL_DATA = ROOT / "data" / "modis"
STAC_DATA = REAL_DATA / "stac"
LAND = (ROOT / "portal" / "vendor" / "land-50m.json", ROOT / "node_modules" / "world-atlas" / "land-50m.json")
FIRST_DAY = {"terra": date(2000, 2, 24), "aqua": date(2002, 7, 4), "terra,aqua": date(2000, 2, 24)}
# when a platform's granules are missing: Terra's safe mode of 18-28 February 2016
OUTAGES = {"terra": [(date(2016, 2, 18), date(2016, 2, 28))], "aqua": []}
REAL_FILES = {p.stem: p for p in REAL_DATA.rglob("*.hdf")}


@cache
def land_tiles() -> frozenset[str]:
    """The MODIS tiles with land on them (Natural Earth 1:50m land at 0.25°)."""
    path = next((p for p in LAND if p.exists()), None)
    if path is None:
        raise FileNotFoundError("no land-50m.json: run make setup (world-atlas from npm)")
    topo = json.loads(path.read_text())
    (sx, sy), (tx, ty) = topo["transform"]["scale"], topo["transform"]["translate"]
    arcs = []
    for arc in topo["arcs"]:  # quantized, delta-encoded
        points = np.cumsum(np.array(arc, dtype=float), axis=0)
        arcs.append(np.column_stack([points[:, 0] * sx + tx, points[:, 1] * sy + ty]))

    def ring(indexes: list[int]) -> list[list[float]]:
        coords: list[list[float]] = []
        for i in indexes:
            part = arcs[i] if i >= 0 else arcs[~i][::-1]
            coords += part.tolist()[1 if coords else 0:]
        return coords

    shapes = [{"type": "Polygon", "coordinates": [ring(r) for r in polygon]}
              for geometry in topo["objects"]["land"]["geometries"] for polygon in geometry["arcs"]]
    mask = features.rasterize(((s, 1) for s in shapes), out_shape=(720, 1440),
                              transform=from_origin(-180, 90, 0.25, 0.25), dtype="uint8")
    found = set()
    steps = (np.arange(24) + 0.5) / 24
    for h in range(TILES_H):
        for v in range(TILES_V):
            tile = Tile(h, v)
            x0, y0, x1, y1 = tile.bounds()
            xs, ys = np.meshgrid(x0 + (x1 - x0) * steps, y0 + (y1 - y0) * steps)
            lat = np.degrees(ys / RADIUS)
            with np.errstate(divide="ignore", invalid="ignore"):
                lon = np.degrees(xs / (RADIUS * np.cos(np.radians(lat))))
            ok = np.abs(lon) <= 180
            rows = np.clip(((90 - lat[ok]) / 0.25).astype(int), 0, 719)
            cols = np.clip(((lon[ok] + 180) / 0.25).astype(int), 0, 1439)
            if mask[rows, cols].any():
                found.add(tile.name)
    return frozenset(found)


def exists(product: Product, tile: str, day: date) -> bool:
    """Whether the archive has the product's granule of that tile and period: not before the
    platform's first data, nor during an outage, nor before it is produced (a period still
    running, or ended days ago, has none yet)."""
    if day < FIRST_DAY[product.platform] or tile not in land_tiles():
        return False
    if _produced(product, tile, day) > datetime.now(UTC).replace(tzinfo=None):  # the name's time is UTC
        return False
    return not any(first <= day <= last for platform in product.platform.split(",")
                   for first, last in OUTAGES.get(platform, []))


def _stamp(product: Product, tile: str, day: date) -> str:
    return f"{product.name}.A{day.year}{day.timetuple().tm_yday:03d}.{tile}.{product.collection}."


def _produced(product: Product, tile: str, day: date) -> datetime:
    """When a synthesized granule was produced: a few days after its period."""
    seed = int.from_bytes(hashlib.sha256(_stamp(product, tile, day).encode()).digest()[:8], "big")
    return datetime.combine(last_day(product, day), datetime.min.time()) + timedelta(days=3 + seed % 7,
                                                                                      seconds=seed % 86400)


def granule_name(product: Product, tile: str, day: date) -> str:
    """The granule's name, its production timestamp (a few days after the period) included."""
    stamp = _stamp(product, tile, day)
    real = [name for name in REAL_FILES if name.startswith(stamp)]
    if real:
        return real[0]
    return f"{stamp}{_produced(product, tile, day):%Y%j%H%M%S}"


def real_file(name: str, layer: str | None = None) -> Path | None:
    """The real file of a granule (its HDF4, or a layer's GeoTIFF), if ``data/modis`` has it."""
    if layer is None:
        return REAL_FILES.get(name)
    path = REAL_DATA / f"{name}_{layer}.tif"
    return path if path.exists() else None


def _field(seed: bytes, shape: tuple[int, int], cells: int = 24) -> np.ndarray:
    """Smooth noise in [0, 1): a coarse random lattice, bilinearly upsampled (as two
    matrix products of interpolation weights)."""
    rng = np.random.default_rng(int.from_bytes(seed[:8], "big"))
    coarse = rng.random((cells + 1, cells + 1))

    def weights(n: int) -> np.ndarray:
        at = np.linspace(0, cells, n, endpoint=False)
        low = at.astype(int)
        w = np.zeros((n, cells + 1))
        w[np.arange(n), low] = 1 - (at - low)
        w[np.arange(n), low + 1] = at - low
        return w

    return weights(shape[0]) @ coarse @ weights(shape[1]).T


COARSE = 4  # synthesized values are drawn on cells of 4 × 4 pixels (the globe's edge stays exact)


@lru_cache(maxsize=4)
def _base(product: str, pixels: int, tile: str, day: date) -> tuple[np.ndarray, ...]:
    """What every layer of a synthesized granule is drawn from, on the coarse cells: latitude,
    a smooth noise field and a cloud mask; and, per pixel, whether it lies on the globe
    (computed once per granule)."""
    transform = native_transform(Tile.parse(tile), pixels)
    rows = transform.f + (np.arange(pixels) + 0.5) * transform.e
    cols = transform.c + (np.arange(pixels) + 0.5) * transform.a
    half_width = np.pi * RADIUS * np.cos(rows / RADIUS)  # the globe's edge on each row
    on_globe = np.abs(cols)[None, :] <= half_width[:, None]
    n = pixels // COARSE
    lat = np.degrees(rows[COARSE // 2::COARSE] / RADIUS)[:, None]
    seed = hashlib.sha256(f"{product}/{tile}/{day.isoformat()}".encode()).digest()
    noise = np.round(_field(seed, (n, n)) * 32) / 32  # in steps: it compresses as real data does
    return lat, on_globe, noise, _field(seed[8:], (n, n)) > 0.8


def values(product: Product, layer: Layer, tile: str, day: date) -> np.ndarray:
    """A synthesized layer: plausible values in the layer's encoding, fill off the globe."""
    lat, on_globe, noise, cloud = _base(product.name, product.pixels, tile, day)
    season = math.cos(2 * math.pi * (day.timetuple().tm_yday - 15) / 365.25)  # 1 in mid-January
    name, low, high = layer.name, layer.valid[0], layer.valid[1]
    if name in ("Maximum_Snow_Extent", "Eight_Day_Snow_Cover"):
        snow = np.abs(lat) + 12 * (noise - 0.5) > 45 - 10 * season
        out = np.where(cloud, 50, np.where(snow, 200, 25)) if name == "Maximum_Snow_Extent" else \
            np.where(snow, 255, 1)
    elif name.endswith("pixel_reliability"):
        out = np.where(cloud, 3, np.where(noise > 0.7, 1, 0))
    elif name.startswith("QC_"):
        out = np.where(cloud, 2, np.where(noise > 0.7, 0b01000001, 0))
    elif name.startswith("BRDF_Albedo"):
        out = np.where(cloud, 1, 0)
    elif layer.categorical:  # other class layers and bit fields: their valid codes
        out = low + np.floor(noise * (min(high, low + 16) - low))
    else:  # continuous: a value between its valid range's ends, larger towards the equator
        out = low + (high - low) * (0.2 + 0.5 * noise + 0.3 * np.round(np.cos(np.radians(lat)) * 32) / 32) * 0.8
    full = np.repeat(np.repeat(out.astype(layer.dtype), COARSE, axis=0), COARSE, axis=1)
    return np.where(on_globe, full, np.array(layer.fill, dtype=layer.dtype))


@lru_cache(maxsize=32)
def cog(name: str, layer_name: str) -> bytes:
    """A granule's layer as Planetary Computer keeps it: a tiled, compressed GeoTIFF."""
    real = real_file(name, layer_name)
    if real:
        return real.read_bytes()
    product, tile, day = _parse(name)
    layer = product.layer(layer_name)
    profile = {"driver": "GTiff", "width": product.pixels, "height": product.pixels, "count": 1,
               "dtype": layer.dtype, "crs": sinusoidal(),
               "transform": native_transform(Tile.parse(tile), product.pixels),
               "nodata": layer.nodata, "tiled": True, "blockxsize": 512, "blockysize": 512, "compress": "deflate"}
    with MemoryFile() as memory:
        with memory.open(**profile) as dst:
            dst.write(values(product, layer, tile, day), 1)
            dst.scales, dst.offsets = (layer.scale,), (layer.offset,)
            dst.update_tags(LOCALGRANULEID=f"{name}.hdf", SYNTHESIZED="bagpipe local stack")
        return memory.read()


@lru_cache(maxsize=8)
def hdf4(name: str) -> bytes:
    """A granule as NASA's archives keep it: HDF4-EOS, every layer an SDS with its fill,
    valid range and scale (MOD13's as a divisor, as its files say it), the grid in
    ``StructMetadata.0``."""
    real = real_file(name)
    if real:
        return real.read_bytes()
    product, tile, day = _parse(name)
    x0, y0, x1, y1 = Tile.parse(tile).bounds()
    fields = "".join(f'\t\t\tOBJECT=DataField_{i}\n\t\t\t\tDataFieldName="{layer.sds}"\n'
                     f"\t\t\tEND_OBJECT=DataField_{i}\n" for i, layer in enumerate(product.layers, 1))
    struct = (f"GROUP=GridStructure\n\tGROUP=GRID_1\n\t\tGridName=\"MOD_Grid\"\n\t\tXDim={product.pixels}\n"
              f"\t\tYDim={product.pixels}\n\t\tUpperLeftPointMtrs=({x0:.6f},{y1:.6f})\n"
              f"\t\tLowerRightMtrs=({x1:.6f},{y0:.6f})\n\t\tProjection=GCTP_SNSOID\n"
              f"\t\tProjParams=({RADIUS:.6f},0,0,0,0,0,0,0,0,0,0,0,0)\n\t\tSphereCode=-1\n\t\tGROUP=DataField\n{fields}"
              "\t\tEND_GROUP=DataField\n\tEND_GROUP=GRID_1\nEND_GROUP=GridStructure\nEND\n")
    kinds = {"uint8": SDC.UINT8, "int8": SDC.INT8, "uint16": SDC.UINT16, "int16": SDC.INT16, "uint32": SDC.UINT32}
    with tempfile.TemporaryDirectory(prefix="bagpipe-hdf-") as tmp:
        path = Path(tmp, f"{name}.hdf")
        sd = SD(str(path), SDC.WRITE | SDC.CREATE)
        sd.attr("StructMetadata.0").set(SDC.CHAR8, struct)
        for layer in product.layers:
            kind = kinds[layer.dtype]
            sds = sd.create(layer.sds, kind, (product.pixels, product.pixels))
            sds.setcompress(SDC.COMP_DEFLATE, 6)
            if layer.nodata is not None:
                sds.attr("_FillValue").set(kind, int(layer.nodata))
            sds.attr("valid_range").set(kind, [int(layer.valid[0]), int(layer.valid[1])])
            if layer.scale != 1.0:  # MOD13 writes the divisor, the others the factor
                divide = product.name[3:5] == "13"
                sds.attr("scale_factor").set(SDC.FLOAT64, round(1 / layer.scale) if divide else layer.scale)
            sds[:] = values(product, layer, tile, day)
            sds.endaccess()
        sd.end()
        return path.read_bytes()


def _parse(name: str) -> tuple[Product, str, date]:
    short, stamp, tile = name.split(".")[:3]
    return CATALOG[short], tile, datetime.strptime(stamp[1:], "%Y%j").date()

"""Region products: per product, layer and date, the job's tiles mosaicked over the region
the scientist asked for, so that the region opens as one layer.

The tiles of a job share one grid (CRS, resolution, origin), so a mosaic is a copy, never a
resampling: each tile's pixels land unchanged, the region's pixels no tile covers (a tile
the catalog had no data for) are nodata. The mosaic covers the requested box snapped
outwards to the grid (the tiles' union for a region given as MODIS tiles). Up to
``MAX_PIXELS`` it is one Cloud-Optimized GeoTIFF carrying the tiles' scale, offset, unit
and tags; beyond, a VRT over the tile COGs (relative paths: the folder moves as one). A
reduction's outputs are mosaicked the same way, per output file.

A box across ±180° (west > east) has tiles on both sides of it, at both ends of the CRS's
x axis. Where a turn of the Earth is one length of x everywhere (a lon/lat CRS: 360°; a
cylindrical projection, Mercator's), the mosaic is one grid continuous across it: the tiles
east of ±180° are placed a turn further east (x past 180° in lon/lat: 177 to 182 for a box
from 177°E to 178°W, as GDAL, QGIS and xarray read a GeoTIFF's coordinates), so that it
covers the region and not the world between its two sides. Where it is not (MODIS's
sinusoidal grid, Mollweide's; or a turn is not whole pixels), each side is a mosaic of its
own, ``….west.tif`` (the box's west edge to 180°) and ``….east.tif`` (from −180° to its
east edge); where both sides are one stretch of x (a UTM zone across ±180°), one mosaic of
their union.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import numpy as np
import rasterio
import rasterio.io
import rasterio.shutil
from affine import Affine
from pyproj import Transformer
from rasterio.crs import CRS
from rasterio.io import MemoryFile
from rasterio.warp import transform, transform_bounds
from rasterio.windows import Window

from pipeline.modis import layout

MAX_PIXELS = 64_000_000  # larger mosaics are VRTs over the tiles, not copies of them
REGION = "region"  # the folder of a product's region mosaics, beside its tiles' folders
Bounds = tuple[float, float, float, float]


@dataclass(frozen=True)
class Grid:
    """The grid the tiles share: CRS, pixel size and origin."""

    crs: CRS
    res: tuple[float, float]
    origin: tuple[float, float]

    @classmethod
    def of(cls, path: Path) -> Grid:
        with rasterio.open(path) as src:
            return cls(src.crs, src.res, (src.transform.c, src.transform.f))

    def snap(self, bounds: Bounds) -> Bounds:
        """``bounds`` widened to whole pixels of the grid."""
        (x0, y0), (dx, dy) = self.origin, self.res
        west, south, east, north = bounds
        return (x0 + math.floor(round((west - x0) / dx, 6)) * dx, y0 - math.ceil(round((y0 - south) / dy, 6)) * dy,
                x0 + math.ceil(round((east - x0) / dx, 6)) * dx, y0 - math.floor(round((y0 - north) / dy, 6)) * dy)


def union(files: Sequence[Path], shifts: Mapping[Path, float] | None = None) -> Bounds:
    """The bounds of ``files`` together (each moved ``shifts[file]`` along x)."""
    boxes = []
    for path in files:
        shift = (shifts or {}).get(path, 0.0)
        with rasterio.open(path) as src:
            west, south, east, north = src.bounds
        boxes.append((west + shift, south, east + shift, north))
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def turn(crs: CRS) -> float | None:
    """The length of x of one turn of the Earth in ``crs``, where it is the same at every
    latitude (a lon/lat CRS, a cylindrical projection); None where it is not."""
    if crs.is_geographic:
        return 2 * math.pi / float(crs.units_factor[1])  # 360 in degrees, 400 in grads
    to_crs = Transformer.from_crs("EPSG:4326", crs, always_xy=True)
    lengths: list[float] = []
    for lat in (0.0, 40.0):
        (east, west), _ = to_crs.transform([179.999, -179.999], [lat, lat])
        lengths.append(float(east - west) * 360 / 359.998)
    if not all(map(math.isfinite, lengths)) or lengths[0] <= 0 or abs(lengths[1] - lengths[0]) > 1e-6 * lengths[0]:
        return None
    return lengths[0]


@dataclass(frozen=True)
class Part:
    """One mosaic of a group of tiles: its bounds, its tiles and how far each is moved along
    x (a turn, for a tile east of ±180° in a grid continuous across it), and the word its
    file's name takes ("": the region whole; ``west``, ``east``: a side of ±180°)."""

    bounds: Bounds
    files: tuple[Path, ...]
    shifts: Mapping[Path, float]
    side: str = ""


def _centre_lon(path: Path) -> float:
    with rasterio.open(path) as src:
        (lon,), _ = transform(src.crs, "EPSG:4326", [(src.bounds.left + src.bounds.right) / 2],
                              [(src.bounds.bottom + src.bounds.top) / 2])
    return float(lon)


def parts(request: dict[str, Any], files: Sequence[Path]) -> list[Part]:
    """The mosaics the group of tiles ``files`` makes over the request's region: one, or for
    a box across ±180° in a CRS that cannot join its sides, one per side."""
    grid = Grid.of(files[0])
    box = (request.get("region") or {}).get("bbox")
    if not box or box[0] <= box[2]:
        return [Part(region_bounds(request, grid, union(files)), tuple(files), {})]
    west, south, east, north = box
    sides = {"west": [f for f in files if _centre_lon(f) > 0], "east": [f for f in files if _centre_lon(f) <= 0]}
    if not sides["west"] or not sides["east"]:  # the tiles of one side only: no data on the other
        side = next(files for files in sides.values() if files)
        return [Part(_cut(grid, (west, south, 180.0, north) if side is sides["west"] else (-180.0, south, east, north),
                          union(side)), tuple(side), {})]
    length = turn(grid.crs)
    if length is not None and abs(length / grid.res[0] - round(length / grid.res[0])) < 1e-6:
        # one grid across ±180° (a turn is whole pixels): the east side a turn further east
        shifts = {f: length for f in sides["east"]}
        halves = (_cut(grid, (west, south, 180.0, north), union(sides["west"])),
                  _cut(grid, (-180.0, south, east, north), union(sides["east"])))
        bounds = (halves[0][0], min(halves[0][1], halves[1][1]), halves[1][2] + length, max(halves[0][3], halves[1][3]))
        return [Part(bounds, tuple(files), shifts)]
    a, b = union(sides["west"]), union(sides["east"])
    if max(a[0], b[0]) <= min(a[2], b[2]) + grid.res[0]:  # one stretch of x: the two sides touch in the CRS
        return [Part(union(files), tuple(files), {})]
    return [Part(_cut(grid, (west, south, 180.0, north), a), tuple(sides["west"]), {}, "west"),
            Part(_cut(grid, (-180.0, south, east, north), b), tuple(sides["east"]), {}, "east")]


def _cut(grid: Grid, box: Bounds, tiles: Bounds) -> Bounds:
    """A lon/lat box (west ≤ east) in the grid's CRS, snapped to it and cut to ``tiles``."""
    west, south, east, north = grid.snap(transform_bounds("EPSG:4326", grid.crs, *box, densify_pts=21))
    return (max(west, tiles[0]), max(south, tiles[1]), min(east, tiles[2]), min(north, tiles[3]))


def region_bounds(request: dict[str, Any], grid: Grid, tiles: Bounds) -> Bounds:
    """The requested region (a box not across ±180°) in the grid's CRS, snapped to it and
    cut to the tiles' union; the union itself for a region of MODIS tiles."""
    box = (request.get("region") or {}).get("bbox")
    if not box:
        return tiles
    return _cut(grid, tuple(box), tiles)


def mosaic(files: Sequence[Path], bounds: Bounds, target: Path, shifts: Mapping[Path, float] | None = None) -> Path:
    """Mosaic ``files`` (one grid; each moved ``shifts[file]`` along x) over ``bounds``: a COG
    at ``target`` (.tif), or beyond ``MAX_PIXELS`` a VRT beside it (.vrt). Returns the path
    written."""
    shifts = shifts or {}
    grid = Grid.of(files[0])
    width = round((bounds[2] - bounds[0]) / grid.res[0])
    height = round((bounds[3] - bounds[1]) / grid.res[1])
    target.parent.mkdir(parents=True, exist_ok=True)
    if width * height > MAX_PIXELS:
        return _vrt(files, bounds, (height, width), target.with_suffix(".vrt"), shifts)
    with rasterio.open(files[0]) as first:
        profile = first.profile | {"driver": "GTiff", "width": width, "height": height,
                                   "transform": Affine(grid.res[0], 0, bounds[0], 0, -grid.res[1], bounds[3])}
        for key in ("blockxsize", "blockysize", "tiled", "compress", "interleave"):
            profile.pop(key, None)
        scales, offsets, units, tags = first.scales, first.offsets, first.units, first.tags()
        descriptions = first.descriptions
    data = _laid(files, shifts, bounds, grid, profile)
    for key in ("SOURCES", "TARGET_TILE"):  # a tile's own; the mosaic's items name every tile's
        tags.pop(key, None)
    with MemoryFile() as raw:
        with raw.open(**profile) as dst:
            dst.write(data)
            dst.scales, dst.offsets = scales, offsets
            if any(units):
                dst.units = units
            for band, text in enumerate(descriptions, 1):
                if text:
                    dst.set_band_description(band, text)
            dst.update_tags(**tags, MOSAIC_OF=",".join(sorted(f.name for f in files)))
        del data
        with raw.open() as src:
            rasterio.shutil.copy(src, str(target), driver="COG", compress="DEFLATE", blocksize=512)
    return target


def _offset(src: rasterio.io.DatasetReader, shift: float, bounds: Bounds, res: tuple[float, float]) -> tuple[int, int]:
    """Where a tile (moved ``shift`` along x) begins in the mosaic: (column, row)."""
    return round((src.bounds.left + shift - bounds[0]) / res[0]), round((bounds[3] - src.bounds.top) / res[1])


def _laid(files: Sequence[Path], shifts: Mapping[Path, float], bounds: Bounds, grid: Grid,
          profile: dict[str, Any]) -> np.ndarray:
    """The mosaic's pixels: each tile's copied where it lies (its valid pixels, the first
    tile's where two overlap, as rasterio's merge copies them), nodata elsewhere."""
    height, width = profile["height"], profile["width"]
    nodata = profile["nodata"]
    data = np.full((profile["count"], height, width), 0 if nodata is None else nodata, dtype=profile["dtype"])
    filled = np.zeros(data.shape, bool)
    for path in files:
        with rasterio.open(path) as src:
            col, row = _offset(src, shifts.get(path, 0.0), bounds, grid.res)
            left, top = max(col, 0), max(row, 0)
            right, bottom = min(col + src.width, width), min(row + src.height, height)
            if left >= right or top >= bottom:
                continue
            block = src.read(window=Window(left - col, top - row, right - left, bottom - top), masked=True)
        take = ~np.ma.getmaskarray(block) & ~filled[:, top:bottom, left:right]
        data[:, top:bottom, left:right][take] = block.data[take]
        filled[:, top:bottom, left:right] |= take
    return data


def _vrt(files: Sequence[Path], bounds: Bounds, shape: tuple[int, int], target: Path,
         shifts: Mapping[Path, float]) -> Path:
    """A VRT over the tile COGs (the GDAL format has no writer in rasterio; one SimpleSource
    per tile and band, each placed at its offset on the shared grid)."""
    height, width = shape
    with rasterio.open(files[0]) as first:
        crs, res, count, nodata = first.crs, first.res, first.count, first.nodata
        dtypes, scales, offsets = first.dtypes, first.scales, first.offsets
    gdal_type = {"uint8": "Byte", "int8": "Int8", "uint16": "UInt16", "int16": "Int16", "uint32": "UInt32",
                 "int32": "Int32", "float32": "Float32", "float64": "Float64"}
    bands = []
    for band in range(1, count + 1):
        sources = []
        for path in files:
            with rasterio.open(path) as src:
                col, row = _offset(src, shifts.get(path, 0.0), bounds, res)
                rel = escape(Path(os.path.relpath(path, target.parent)).as_posix())
                sources.append(
                    f'<SimpleSource><SourceFilename relativeToVRT="1">{rel}</SourceFilename>'
                    f"<SourceBand>{band}</SourceBand>"
                    f'<SrcRect xOff="0" yOff="0" xSize="{src.width}" ySize="{src.height}"/>'
                    f'<DstRect xOff="{col}" yOff="{row}" xSize="{src.width}" ySize="{src.height}"/></SimpleSource>')
        nodata_xml = f"<NoDataValue>{nodata!r}</NoDataValue>" if nodata is not None else ""
        bands.append(f'<VRTRasterBand dataType="{gdal_type[dtypes[band - 1]]}" band="{band}">{nodata_xml}'
                     f"<Offset>{offsets[band - 1]!r}</Offset><Scale>{scales[band - 1]!r}</Scale>"
                     f"{''.join(sources)}</VRTRasterBand>")
    transform = f"{bounds[0]!r}, {res[0]!r}, 0.0, {bounds[3]!r}, 0.0, {-res[1]!r}"
    target.write_text(f'<VRTDataset rasterXSize="{width}" rasterYSize="{height}">'
                      f"<SRS>{escape(crs.to_wkt())}</SRS><GeoTransform>{transform}</GeoTransform>"
                      f"{''.join(bands)}</VRTDataset>\n")
    return target


def write_regions(out: Path, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Mosaic a results folder's products over the job's region: per product, layer and
    date of its tiles, per product, span and output file of its reductions (under
    ``<product>/region/<date or span>/``). Returns what it wrote, as manifest entries."""
    groups: dict[tuple[str, str, str, str], list[Path]] = {}
    made_by: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for task in manifest["tasks"]:
        span = layout.span(task)
        for name in task.get("files", []):
            path = out / name
            if path.suffix.lower() not in (".tif", ".tiff"):
                continue
            if layout.waits(task):
                output = layout.output_name(task, path.name)
                key = (layout.folder(task), span, f"{output}.{span}.tif" if output != path.stem else path.name, "")
            else:
                with rasterio.open(path) as src:
                    layer = src.tags().get("LAYER") or path.stem
                key = (task["product"], span, f"{task['product']}.{layer}.{span}.tif", layer)
            groups.setdefault(key, []).append(path)
            made_by.setdefault(key, []).append(task)
    written = []
    for (name, span, file, layer), files in sorted(groups.items()):
        for part in parts(manifest["request"], files):
            named = file.removesuffix(".tif") + f".{part.side}.tif" if part.side else file
            path = mosaic(part.files, part.bounds, out / name / REGION / span / named, part.shifts)
            tasks = [task for task, tile in zip(made_by[(name, span, file, layer)], files, strict=True)
                     if tile in part.files]
            first, last = layout.dates(tasks[0])
            written.append({"folder": name, "span": span, "product": tasks[0]["product"], "start": first.isoformat(),
                            "end": last.isoformat(), "date": first.isoformat(), "layer": layer or None,
                            "file": path.relative_to(out).as_posix(), "tasks": [t["task"] for t in tasks]})
    return written

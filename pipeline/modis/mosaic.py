"""Region products: per product, layer and date, the job's tiles mosaicked over the region
the scientist asked for, so that the region opens as one layer.

The tiles of a job share one grid (CRS, resolution, origin), so a mosaic is a copy, never a
resampling: each tile's pixels land unchanged, the region's pixels no tile covers (a tile
the catalog had no data for) are nodata. The mosaic covers the requested box snapped
outwards to the grid (the tiles' union for a region given as MODIS tiles, or one crossing
±180°). Up to ``MAX_PIXELS`` it is one Cloud-Optimized GeoTIFF carrying the tiles' scale,
offset, unit and tags; beyond, a VRT over the tile COGs (relative paths: the folder moves
as one). A reduction's outputs are mosaicked the same way, per output file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import rasterio
import rasterio.merge
import rasterio.shutil
from affine import Affine
from rasterio.crs import CRS
from rasterio.io import MemoryFile
from rasterio.warp import transform_bounds

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


def union(files: Sequence[Path]) -> Bounds:
    boxes = []
    for path in files:
        with rasterio.open(path) as src:
            boxes.append(tuple(src.bounds))
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def region_bounds(request: dict[str, Any], grid: Grid, tiles: Bounds) -> Bounds:
    """The requested region in the grid's CRS, snapped to it and cut to the tiles' union."""
    box = (request.get("region") or {}).get("bbox")
    if not box or box[0] > box[2]:  # MODIS tiles, or a box across ±180°: the tiles themselves
        return tiles
    west, south, east, north = grid.snap(transform_bounds("EPSG:4326", grid.crs, *box, densify_pts=21))
    return (max(west, tiles[0]), max(south, tiles[1]), min(east, tiles[2]), min(north, tiles[3]))


def mosaic(files: Sequence[Path], bounds: Bounds, target: Path) -> Path:
    """Mosaic ``files`` (one grid) over ``bounds``: a COG at ``target`` (.tif), or beyond
    ``MAX_PIXELS`` a VRT beside it (.vrt). Returns the path written."""
    grid = Grid.of(files[0])
    width = round((bounds[2] - bounds[0]) / grid.res[0])
    height = round((bounds[3] - bounds[1]) / grid.res[1])
    target.parent.mkdir(parents=True, exist_ok=True)
    if width * height > MAX_PIXELS:
        return _vrt(files, bounds, (height, width), target.with_suffix(".vrt"))
    with rasterio.open(files[0]) as first:
        profile = first.profile | {"driver": "GTiff", "width": width, "height": height,
                                   "transform": Affine(grid.res[0], 0, bounds[0], 0, -grid.res[1], bounds[3])}
        for key in ("blockxsize", "blockysize", "tiled", "compress", "interleave"):
            profile.pop(key, None)
        scales, offsets, units, tags = first.scales, first.offsets, first.units, first.tags()
        descriptions = first.descriptions
    data, _ = rasterio.merge.merge([str(f) for f in files], bounds=bounds, res=grid.res, nodata=profile["nodata"])
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


def _vrt(files: Sequence[Path], bounds: Bounds, shape: tuple[int, int], target: Path) -> Path:
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
                col = round((src.bounds.left - bounds[0]) / res[0])
                row = round((bounds[3] - src.bounds.top) / res[1])
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
        bounds = region_bounds(manifest["request"], Grid.of(files[0]), union(files))
        path = mosaic(files, bounds, out / name / REGION / span / file)
        tasks = made_by[(name, span, file, layer)]
        first, last = layout.dates(tasks[0])
        written.append({"folder": name, "span": span, "product": tasks[0]["product"], "start": first.isoformat(),
                        "end": last.isoformat(), "date": first.isoformat(), "layer": layer or None,
                        "file": path.relative_to(out).as_posix(), "tasks": [t["task"] for t in tasks]})
    return written

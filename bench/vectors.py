"""Sites, zones and cubes against the tools a scientist would use instead, side by side in
one run, each way in a fresh process (the imitation keeps what it synthesized in its
process: a second way in the same one would find the granules made).

- ``sites_vs_xarray``: ``--sites`` sites (1,000) in MODIS tile h09v05 × a year of MOD13A1
  (23 composites): bagpipe's job, cold (a fresh Azurite and Planetary Computer imitation:
  no granule made or cached), from submission to SUCCEEDED (its table written), ÷ the same
  points read by ``odc.stac.load`` of the same items (NDVI and its quality, the two layers
  bagpipe reads) on the product's own grid and ``xarray``'s ``.sel`` (nearest), cold too.
  ``sites_vs_rasterio``: the same against rasterio's ``sample`` of each item's two files
  (window reads, GDAL's block cache).
- ``zonal_vs_exactextract``: zonal statistics (mean, min, max, std, count, sum) of
  ``--zones`` polygons (1,000) over four 1° target tiles × the composites of
  July–September 2022: bagpipe's job once the tiles are made (a job of the same span
  made them, on the same workers: its tile tasks are settled CACHED, its zonal tasks and
  gather run) ÷
  ``exactextract`` over a mosaic of the same tile files, each date (the mosaic's making
  not counted: a scientist may have it at hand).
- ``cube_vs_xarray_netcdf`` and ``…_zarr``: a cube (``--dates`` × 3 × 3 tiles of 1,200
  pixels, int16 with a scale and fill) written from tile files on disk by the gather's
  writer (``pipeline.science.cubes``, a tile and date at a time) ÷ xarray's ``to_netcdf`` /
  ``to_zarr`` of the same tiles as a dask array chunked by tile and date, same chunks and
  codec. ``gather_peak_share``: the gather's writer's peak resident memory (VmHWM), writing
  the cube and uploading it as a gather does (``Transfers.upload_file``, ``IN_FLIGHT`` bytes
  in flight), as a share of a worker's memory
  limit (``LIMIT_MB``), the cube being larger than that limit.

    python -m bench.vectors [--parts sites zones cube] [--sites 1000] [--zones 1000] [--dates 36]

Each figure is printed; the last line is one JSON object of them.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np

LIMIT_MB = 512  # a worker's memory limit the cube is larger than (a Container Apps replica's slot share)
YEAR = ("2022-01-01", "2022-12-31")
QUARTER = ("2022-07-01", "2022-09-30")
NDVI, QA = "500m_16_days_NDVI", "500m_16_days_pixel_reliability"
TILE_SIDE, TILES_PER_SIDE = 1200, 3  # the cube's tiles
CUBE_FILL, CUBE_SCALE = -3000, 0.0001


def _peak() -> int:
    """This process's peak resident memory in bytes (``VmHWM``, which starts afresh at exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def _one(way: str, folder: Path, **options: Any) -> dict[str, Any]:
    """Run one way in a fresh process; its figures (the last line it prints)."""
    args = [sys.executable, "-m", "bench.vectors", "--one", way, "--folder", str(folder),
            "--options", json.dumps(options)]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{way} failed:\n{done.stderr[-4000:]}")
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


class Stack:
    """A fresh Azurite and Planetary Computer imitation in ``folder``, for one way."""

    def __init__(self, folder: Path) -> None:
        from bagpipe.azurite import Azurite
        from bagpipe.planetary import Planetary

        os.environ["BAGPIPE_WORLD_CACHE"] = str(folder / "world")  # granules made anew: cold
        self.azurite = Azurite(folder / "azurite").start()
        self.planetary = Planetary(self.azurite.connection_string).__enter__()

    def settings(self) -> Any:
        return settings_on(self.azurite.connection_string, self.planetary.stac_url, self.planetary.sas_url)

    def close(self) -> None:
        self.planetary.__exit__(None, None, None)
        self.azurite.stop()


def settings_on(connection: str, stac: str, sas: str) -> Any:
    """A deployment of its own on that Azurite, its granules from that imitation."""
    from pipeline.settings import Settings

    return Settings(storage_connection=connection, namespace=f"v{secrets.token_hex(4)}", tile_stage="modis",
                    catalog="stac", stac_url=stac, stac_sas_url=sas)


def run_jobs(settings: Any, bodies: list[dict[str, Any]], workers: int = 2, slots: int = 2) -> list[float]:
    """Jobs submitted one after the other and each run to its end on the same real workers
    (threads of this process, each task in a stage process of its own): each one's seconds
    from submission to SUCCEEDED."""
    from bench.throughput import running
    from pipeline.lifecycle import attempts, jobs
    from pipeline.requests import application
    from pipeline.requests.request import JobRequest
    from pipeline.storage.clients import Clients

    clients = Clients(settings)
    clients.ensure_resources()
    walls = []
    with running(settings, workers, slots, idle_sleep=0.05, sweep_every=1.0):
        for body in bodies:
            started = time.perf_counter()
            job = application.submit(clients, JobRequest.model_validate(body)).job
            while not (row := jobs.get(clients, job)).state.finished:
                time.sleep(0.1)
            walls.append(time.perf_counter() - started)
            if row.state.value != "SUCCEEDED":
                raise RuntimeError(f"{job} ended {row.state.value}: "
                                   f"{[a.error for a in attempts.list_attempts(clients.tasks, row.parts)][:3]}")
    return walls


# --- sites ---------------------------------------------------------------------------------


def sites(count: int) -> list[dict[str, Any]]:
    """``count`` sites scattered over MODIS tile h09v05 (New Mexico, Texas, Oklahoma)."""
    from pipeline.modis.grid import locate

    rng = np.random.default_rng(45)
    found: list[dict[str, Any]] = []
    while len(found) < count:
        lon, lat = float(rng.uniform(-117, -92)), float(rng.uniform(30.5, 39.5))
        if locate(lon, lat, 2400)[0].name == "h09v05":
            found.append({"id": f"site-{len(found):05d}", "lon": round(lon, 5), "lat": round(lat, 5)})
    return found


def _items(stac_url: str) -> list[Any]:
    """The year's MOD13A1 items of h09v05: those a box inside it finds, less its neighbours'
    (whose footprints' lon/lat boxes reach into it) and Aqua's (MYD13A1, in the same
    collection)."""
    import pystac_client

    catalog = pystac_client.Client.open(stac_url)
    found = catalog.search(collections=["modis-13A1-061"], datetime="/".join(YEAR), bbox=[-104.9, 34.9, -104.8, 35.0])
    return [item for item in found.items() if item.id.startswith("MOD13A1.")
            and (item.properties["modis:horizontal-tile"], item.properties["modis:vertical-tile"]) == (9, 5)]


def sites_bagpipe(folder: Path, count: int) -> dict[str, Any]:
    """bagpipe's sites job on a fresh stack, its workers and control loop in a process of
    their own, as the peers' reads are: beside the imitation's server in one process, their
    threads and its synthesis of granules took turns at Python's lock."""
    stack = Stack(folder)
    try:
        return _one("sites-job", folder, count=count, connection=stack.azurite.connection_string,
                    stac=stack.planetary.stac_url, sas=stack.planetary.sas_url)
    finally:
        stack.close()


def sites_job(count: int, connection: str, stac: str, sas: str) -> dict[str, Any]:
    body = {"sites": {"points": sites(count)}, "start": YEAR[0], "end": YEAR[1], "products": ["MOD13A1"]}
    (wall,) = run_jobs(settings_on(connection, stac, sas), [body])
    return {"wall": wall}


def sites_peer(folder: Path, count: int, reader: str) -> dict[str, Any]:
    """A peer's read of the sites (``reader``) on a fresh stack, from a process of its own:
    GDAL holds Python's lock while it opens a file, which would starve the imitation's
    server in the same process."""
    stack = Stack(folder)
    try:
        return _one(f"read-{reader}", folder, count=count, stac=stack.planetary.stac_url, sas=stack.planetary.sas_url)
    finally:
        stack.close()


def _site_xy(count: int) -> tuple[list[float], list[float]]:
    """The sites' sinusoidal x and y, as a scientist computes them (PROJ)."""
    from pyproj import Transformer

    from pipeline.modis.targets import SINUSOIDAL_PROJ4

    points = sites(count)
    x, y = Transformer.from_crs("EPSG:4326", SINUSOIDAL_PROJ4, always_xy=True).transform(
        [p["lon"] for p in points], [p["lat"] for p in points])
    return list(x), list(y)


def read_odc(count: int, stac: str, sas: str) -> dict[str, Any]:
    """odc.stac.load of the year's items on the product's own grid, then ``.sel`` of the points."""
    import odc.stac
    import xarray

    from pipeline.modis.access import SasSigner
    from pipeline.modis.targets import SINUSOIDAL_PROJ4

    x, y = _site_xy(count)
    started = time.perf_counter()
    items = _items(stac)
    cube = odc.stac.load(items, bands=[NDVI, QA], crs=SINUSOIDAL_PROJ4, resolution=463.31271652791656,
                         patch_url=SasSigner(sas).sign, groupby="solar_day", pool=2)
    where = {"x": xarray.DataArray(x, dims="site"), "y": xarray.DataArray(y, dims="site")}
    values = cube[NDVI].sel(where, method="nearest").values
    quality = cube[QA].sel(where, method="nearest").values
    wall = time.perf_counter() - started
    assert values.shape == quality.shape == (len(items), count), values.shape
    return {"wall": wall, "dates": len(items)}


def read_rasterio(count: int, stac: str, sas: str) -> dict[str, Any]:
    """rasterio's ``sample`` of each item's NDVI and quality files at the points."""
    import rasterio

    from pipeline.modis.access import SasSigner

    x, y = _site_xy(count)
    started = time.perf_counter()
    items = _items(stac)
    signer = SasSigner(sas)
    read = 0
    for item in items:
        for band in (NDVI, QA):
            with rasterio.open(signer.sign(item.assets[band].href)) as src:
                read += len(list(src.sample(zip(x, y, strict=True))))
    wall = time.perf_counter() - started
    assert read == 2 * len(items) * count
    return {"wall": wall}


def measure_sites(home: Path, count: int) -> dict[str, Any]:
    ours = _one("sites-bagpipe", home / "s1", count=count)["wall"]
    odc = _one("sites-peer", home / "s2", count=count, reader="odc")
    theirs, dates = odc["wall"], odc["dates"]
    rio = _one("sites-peer", home / "s3", count=count, reader="rasterio")["wall"]
    print(f"sites ({count} × {dates} dates of MOD13A1, cold): bagpipe {ours:.1f} s, odc.stac + xarray "
          f"{theirs:.1f} s, rasterio sample {rio:.1f} s", flush=True)
    return {"sites": count, "sites_bagpipe_s": round(ours, 2), "sites_xarray_s": round(theirs, 2),
            "sites_rasterio_s": round(rio, 2), "sites_vs_xarray": round(ours / theirs, 3),
            "sites_vs_rasterio": round(ours / rio, 3)}


# --- zones ---------------------------------------------------------------------------------


def zones(count: int) -> dict[str, Any]:
    """``count`` squares of 0.01–0.05° over the four 1° tiles of -109..-107 × 35..37."""
    rng = np.random.default_rng(46)
    features = []
    for number in range(count):
        lon, lat = rng.uniform(-108.95, -107.05), rng.uniform(35.05, 36.95)
        size = rng.uniform(0.01, 0.05)
        ring = [[lon, lat], [lon + size, lat], [lon + size, lat + size], [lon, lat + size], [lon, lat]]
        features.append({"type": "Feature", "id": f"zone-{number:05d}", "properties": {},
                         "geometry": {"type": "Polygon", "coordinates": [ring]}})
    return {"type": "FeatureCollection", "features": features}


def zones_both(folder: Path, count: int) -> dict[str, Any]:
    """bagpipe's zonal job on tiles made, then exactextract over each date's mosaic of them."""
    from exactextract import exact_extract
    from rasterio.io import MemoryFile
    from rasterio.merge import merge

    from pipeline.lifecycle import jobs, tasks
    from pipeline.modis import TILE_STAGE
    from pipeline.storage import names
    from pipeline.storage.clients import Clients

    statistics = ["mean", "min", "max", "std", "count", "sum"]
    span = {"start": QUARTER[0], "end": QUARTER[1], "products": ["MOD13A1"],
            "grid": {"tile_size": 1.0, "resolution": 0.005}}
    collection = zones(count)
    stack = Stack(folder)
    try:
        settings = stack.settings()
        # the tiles made, then the zones' job on the same workers, warm
        _, ours = run_jobs(settings, [span | {"region": {"bbox": [-109.0, 35.0, -107.0, 37.0]}},
                                      span | {"zones": {"features": collection, "statistics": statistics}}])
        clients = Clients(settings)
        (first, *_) = sorted(jobs.list_jobs(clients, 2), key=lambda j: j.created_at)
        by_date: dict[str, list[bytes]] = {}
        for row in tasks.list_tasks(clients.tasks, first.parts):
            if row.stage == TILE_STAGE:  # a task a date: each of its target tiles, one layer
                by_date.setdefault(row.parameters()["date"], []).extend(
                    clients.tiles.download_blob(output.removeprefix(names.TILE_OUTPUT_PREFIX)).readall()
                    for output in row.output_names())
    finally:
        stack.close()
    theirs = mosaics = 0.0
    for found in by_date.values():
        started = time.perf_counter()
        datasets = [MemoryFile(data).open() for data in found]
        mosaic, transform = merge(datasets)
        with MemoryFile() as memory:
            with memory.open(**datasets[0].profile | {"driver": "GTiff", "height": mosaic.shape[1],
                                                      "width": mosaic.shape[2], "transform": transform}) as out:
                out.write(mosaic)
                out.scales = datasets[0].scales
            mosaics += time.perf_counter() - started
            started = time.perf_counter()
            exact_extract(memory.open(), collection["features"], ["mean", "min", "max", "stdev", "count", "sum"],
                          output="pandas")
            theirs += time.perf_counter() - started
    return {"ours": ours, "theirs": theirs, "mosaics": mosaics, "dates": len(by_date),
            "tiles": sum(len(v) for v in by_date.values())}


def measure_zones(home: Path, count: int) -> dict[str, Any]:
    found = _one("zones", home / "z", count=count)
    ours, theirs = found["ours"], found["theirs"]
    print(f"zones ({count} polygons × {found['dates']} dates, {found['tiles']} tiles): bagpipe {ours:.1f} s, "
          f"exactextract over the mosaic {theirs:.2f} s (the mosaics made in {found['mosaics']:.2f} s more)",
          flush=True)
    return {"zones": count, "zonal_bagpipe_s": round(ours, 2), "zonal_exactextract_s": round(theirs, 3),
            "zonal_mosaic_s": round(found["mosaics"], 3), "zonal_vs_exactextract": round(ours / theirs, 3)}


# --- cubes ---------------------------------------------------------------------------------


def _tile_transforms() -> list[tuple[Any, tuple[int, int]]]:
    from affine import Affine

    step = 0.001
    return [(Affine(step, 0, -108 + col * TILE_SIDE * step, 0, -step, 37 - row * TILE_SIDE * step),
             (TILE_SIDE, TILE_SIDE)) for row in range(TILES_PER_SIDE) for col in range(TILES_PER_SIDE)]


def _dates(count: int) -> list[date]:
    return [date(2022, 1, 1) + timedelta(days=8 * d) for d in range(count)]


def make_tiles(folder: Path, count: int) -> None:
    """The cube's tiles as tile tasks write them (int16 NDVI-like fields with fill, scale,
    tiled and deflated), ``{date}_{tile}.tif``."""
    import rasterio

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    rows, cols = np.mgrid[0:TILE_SIDE, 0:TILE_SIDE]
    for number, day in enumerate(_dates(count)):
        for index, (transform, _) in enumerate(_tile_transforms()):
            field = 4000 + 3000 * np.sin((rows + index * 300) / 170.0 + number / 5) * np.cos(cols / 230.0)
            values = (field + rng.normal(0, 150, field.shape)).astype(np.int16)
            values[rng.random(field.shape) < 0.05] = CUBE_FILL
            with rasterio.open(folder / f"{day.isoformat()}_{index}.tif", "w", driver="GTiff", width=TILE_SIDE,
                               height=TILE_SIDE, count=1, dtype="int16", crs="EPSG:4326", transform=transform,
                               nodata=CUBE_FILL, tiled=True, blockxsize=512, blockysize=512,
                               compress="deflate") as out:
                out.write(values, 1)
                out.scales = (CUBE_SCALE,)


def cube_bagpipe(folder: Path, form: str, count: int, connection: str) -> dict[str, Any]:
    """As the cube gather writes: each tile file read in turn into the sink, then uploaded."""
    import rasterio
    from azure.storage.blob import BlobServiceClient

    from pipeline.reduction.gather import IN_FLIGHT
    from pipeline.science import cubes
    from pipeline.storage.transfer import Transfers

    started = time.perf_counter()
    layout = cubes.layout_of("EPSG:4326", _tile_transforms(), _dates(count))
    path = folder / f"bagpipe{cubes.SUFFIX[form]}"
    sink = cubes.open_sink(form, path, layout, [cubes.Variable("ndvi", "int16", CUBE_FILL, CUBE_SCALE, 0.0, "NDVI")],
                           {})
    try:
        for number, day in enumerate(layout.dates):
            for index in range(TILES_PER_SIDE ** 2):
                with rasterio.open(folder / "tiles" / f"{day.isoformat()}_{index}.tif") as src:
                    row, col = layout.offset(src.transform)
                    sink.write("ndvi", number, row, col, np.asarray(src.read(1)))
    finally:
        sink.close()
    wall = time.perf_counter() - started
    service = BlobServiceClient.from_connection_string(connection)
    container = service.get_container_client(f"bench-cubes-{secrets.token_hex(4)}")
    container.create_container()
    Transfers(service).upload_file(container, path.name, path, "application/octet-stream", in_flight=IN_FLIGHT)
    container.delete_container()
    return {"wall": wall, "peak": _peak(), "file": path.stat().st_size,
            "bytes": layout.shape[0] * layout.shape[1] * len(layout.dates) * 2}


def cube_xarray(folder: Path, form: str, count: int) -> dict[str, Any]:
    """xarray's ``to_netcdf`` / ``to_zarr`` of the tiles as one dask array (a chunk per tile
    and date, each read by rasterio when written), same chunks, type, fill, scale and codec."""
    import dask.array as da
    import rasterio
    import xarray
    import zarr
    from dask.delayed import delayed

    def read(path: Path) -> np.ndarray:
        with rasterio.open(path) as src:
            return np.asarray(src.read(1))

    started = time.perf_counter()
    dates = _dates(count)
    side = TILES_PER_SIDE
    blocks = [[[da.from_delayed(delayed(read)(folder / "tiles" / f"{day.isoformat()}_{r * side + c}.tif"),
                                (TILE_SIDE, TILE_SIDE), np.int16) for c in range(side)]
               for r in range(side)] for day in dates]
    stacked = da.stack([da.block(rows) for rows in blocks])
    x = -108 + (np.arange(TILE_SIDE * side) + 0.5) * 0.001
    y = 37 - (np.arange(TILE_SIDE * side) + 0.5) * 0.001
    data = xarray.Dataset({"ndvi": (("time", "y", "x"), stacked, {"units": "NDVI"})},
                          coords={"time": np.asarray(dates, "datetime64[ns]"), "y": y, "x": x})
    chunks = (1, TILE_SIDE, TILE_SIDE)
    if form == "netcdf":
        path = folder / "xarray.nc"
        data.to_netcdf(path, engine="h5netcdf", encoding={"ndvi": {
            "dtype": "int16", "_FillValue": CUBE_FILL, "scale_factor": CUBE_SCALE, "chunksizes": chunks,
            "zlib": True, "complevel": 4, "shuffle": True}})
    else:
        path = folder / "xarray.zarr.zip"
        store = zarr.storage.ZipStore(path, mode="w")
        data.to_zarr(store, zarr_format=2, consolidated=False, encoding={"ndvi": {
            "dtype": "int16", "_FillValue": CUBE_FILL, "scale_factor": CUBE_SCALE, "chunks": chunks}})
        store.close()
    return {"wall": time.perf_counter() - started, "peak": _peak(), "file": path.stat().st_size}


def measure_cubes(home: Path, count: int) -> dict[str, Any]:
    from bagpipe.azurite import Azurite

    folder = home / "cube"
    make_tiles(folder / "tiles", count)
    figures: dict[str, Any] = {}
    limit = LIMIT_MB * 1024 * 1024
    azurite = Azurite(home / "cube-azurite").start()
    try:
        peaks = []
        for form in ("netcdf", "zarr"):
            ours = _one("cube-bagpipe", folder, form=form, count=count, connection=azurite.connection_string)
            theirs = _one("cube-xarray", folder, form=form, count=count)
            peaks.append(ours["peak"])
            print(f"{form} cube of {ours['bytes'] / 1e9:.2f} GB ({count} dates × 3 × 3 tiles of {TILE_SIDE}²): "
                  f"bagpipe {ours['wall']:.1f} s, peak {ours['peak'] / 1e6:.0f} MB with its upload, "
                  f"{ours['file'] / 1e6:.0f} MB on disk; xarray {theirs['wall']:.1f} s, peak "
                  f"{theirs['peak'] / 1e6:.0f} MB, {theirs['file'] / 1e6:.0f} MB", flush=True)
            figures |= {f"cube_{form}_bagpipe_s": round(ours["wall"], 2),
                        f"cube_{form}_xarray_s": round(theirs["wall"], 2),
                        f"cube_vs_xarray_{form}": round(ours["wall"] / theirs["wall"], 3),
                        f"cube_{form}_xarray_peak_share": round(theirs["peak"] / limit, 3)}
        if ours["bytes"] <= limit:
            print(f"(the cube is not larger than the {LIMIT_MB} MB limit: --dates {count} is too few)", flush=True)
        figures |= {"cube_bytes": ours["bytes"], "gather_peak_bytes": max(peaks),
                    "gather_peak_share": round(max(peaks) / limit, 3)}
    finally:
        azurite.stop()
    return figures


def run_one(way: str, folder: Path, options: dict[str, Any]) -> dict[str, Any]:
    """One way, in this process."""
    if way == "sites-bagpipe":
        return sites_bagpipe(folder, options["count"])
    if way == "sites-job":
        return sites_job(options["count"], options["connection"], options["stac"], options["sas"])
    if way == "sites-peer":
        return sites_peer(folder, options["count"], options["reader"])
    if way == "read-odc":
        return read_odc(options["count"], options["stac"], options["sas"])
    if way == "read-rasterio":
        return read_rasterio(options["count"], options["stac"], options["sas"])
    if way == "zones":
        return zones_both(folder, options["count"])
    if way == "cube-bagpipe":
        return cube_bagpipe(folder, options["form"], options["count"], options["connection"])
    return cube_xarray(folder, options["form"], options["count"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", nargs="+", choices=["sites", "zones", "cube"], default=["sites", "zones", "cube"])
    parser.add_argument("--sites", type=int, default=1000)
    parser.add_argument("--zones", type=int, default=1000)
    parser.add_argument("--dates", type=int, default=36, help="the cube's dates")
    parser.add_argument("--one", choices=["sites-bagpipe", "sites-job", "sites-peer", "read-odc", "read-rasterio",
                                          "zones", "cube-bagpipe", "cube-xarray"], help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, Path(args.folder), json.loads(args.options))))
        return
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-vectors-") as tmp:
        home = Path(tmp)
        if "cube" in args.parts:
            figures |= measure_cubes(home, args.dates)
        if "sites" in args.parts:
            figures |= measure_sites(home, args.sites)
        if "zones" in args.parts:
            figures |= measure_zones(home, args.zones)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

"""Quick-looks: each layer's colour map and legend match its encoding, and a job's overview
lays its tiles on one image of its region, with the classes' colours where they are; a
reduction's in the unit and on the colour ramp its reducer declared."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine
from azure.core.exceptions import ResourceNotFoundError
from PIL import Image
from rasterio.io import MemoryFile

from pipeline.modis import overview, quicklook
from pipeline.modis.products import CATALOG
from pipeline.modis.targets import SINUSOIDAL_PROJ4
from pipeline.reduction import reducers
from pipeline.science import ramps, rasters
from pipeline.storage import names
from pipeline.storage.clients import Clients

SNOW = CATALOG["MOD10A2"].layer("Maximum_Snow_Extent")
COLOURS = {value: colour for value, _, colour in quicklook.SNOW_CLASSES}


def decoded(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"))


def test_snow_classes_get_their_colours_and_the_legend_names_them() -> None:
    stored = np.array([[25, 200], [50, 255]], dtype="uint8")
    style = quicklook.style_for(SNOW)
    rgba = quicklook.colorize(stored, style, SNOW.nodata)
    assert tuple(rgba[0, 1]) == (*COLOURS[200], 255) and tuple(rgba[0, 0]) == (*COLOURS[25], 255)
    assert tuple(rgba[1, 0]) == (*COLOURS[50], 255) and rgba[1, 1, 3] == 0  # fill: transparent
    legend = {entry["label"]: entry["colour"] for entry in quicklook.legend_json(style)}
    assert legend["200 snow"] == "#{:02x}{:02x}{:02x}".format(*COLOURS[200])
    assert legend["25 no snow"] == "#{:02x}{:02x}{:02x}".format(*COLOURS[25]) and "255 fill" not in legend
    picture = decoded(quicklook.picture(np.repeat(np.repeat(rgba, 50, 0), 50, 1), style, "snow"))
    assert tuple(picture[10, 60]) == (*COLOURS[200], 255)  # the image on top, the legend below it
    below = {tuple(p) for p in picture[100:].reshape(-1, 4)}
    assert all((*COLOURS[v], 255) in below for v in (25, 50, 200))  # every class's swatch is drawn


def test_ndvi_is_on_a_vegetation_ramp_and_temperature_in_celsius() -> None:
    ndvi = CATALOG["MOD13A1"].layer("500m_16_days_NDVI")
    style = quicklook.style_for(ndvi)
    rgba = quicklook.colorize(np.array([[8000, -3000]], dtype="int16"), style, ndvi.nodata, ndvi.scale)
    assert tuple(rgba[0, 0, :3]) == dict(quicklook.VEGETATION)[0.8] and rgba[0, 1, 3] == 0
    lst = CATALOG["MOD11A1"].layer("LST_Day_1km")
    style = quicklook.style_for(lst)
    assert style.unit == "°C" and "45 °C" in [line for line, _ in style.legend()]
    kelvin_30c = round((30 + 273.15) / lst.scale)  # stored value of 30 °C
    rgba = quicklook.colorize(np.array([[kelvin_30c]], dtype="uint16"), style, lst.nodata, lst.scale)
    assert np.abs(rgba[0, 0, :3].astype(int) - dict(quicklook.TEMPERATURE_C)[30.0]).max() <= 2


def test_a_continuous_layer_has_a_colour_bar_and_the_picture_its_corners() -> None:
    """NDVI is continuous: its picture's legend is one bar of the ramp's colours from its low
    end to its high one (not a swatch per stop), the portal's legend gives each stop's value;
    the picture's corners are written above and below the image, across ±180° as the
    longitudes they are."""
    ndvi = CATALOG["MOD13A1"].layer("500m_16_days_NDVI")
    style = quicklook.style_for(ndvi)
    rgba = quicklook.colorize(np.full((130, 400), 5000, dtype="int16"), style, ndvi.nodata, ndvi.scale)
    bounds = (177.5, -17.5, 181.5, -16.2)
    drawn = decoded(quicklook.picture(rgba, style, "MOD13A1 NDVI", bounds))
    band = quicklook.LEGEND_ROW
    assert tuple(drawn[band + 60, 200]) == tuple(rgba[60, 200])  # the image below a line of coordinates
    assert (drawn[:band, :100, :3] < 128).any() and (drawn[:band, -100:, :3] < 128).any()  # NW and NE written
    below = band + 130
    assert (drawn[below:below + band, :100, :3] < 128).any() and (drawn[below:below + band, -100:, :3] < 128).any()
    bar = 2 * band + 130 + 3 + band + quicklook.BAR // 2
    row = drawn[bar, 5:-5, :3]
    assert len({tuple(p) for p in row}) > 100  # continuous, not seven swatches
    for end, (_, colour) in ((row[0], quicklook.VEGETATION[0]), (row[-1], quicklook.VEGETATION[-1])):
        assert np.abs(end.astype(int) - colour).max() <= 3  # its low end and its high one
    assert quicklook.corners(bounds) == ("177.50°E 16.20°S", "178.50°W 16.20°S", "177.50°E 17.50°S",
                                         "178.50°W 17.50°S")
    legend = quicklook.legend_json(style)
    assert [entry["value"] for entry in legend] == [value for value, _ in quicklook.VEGETATION]
    assert legend[-1]["label"] == "1 NDVI"


def zlib_level(png: bytes) -> int:
    """The compression level a PNG's image data says it was written at (its zlib header's
    FLEVEL: 0 fastest, 1 fast, 2 default, 3 maximum)."""
    at = png.index(b"IDAT") + 4
    return png[at + 1] >> 6


def test_quicklooks_are_written_at_zlibs_fastest_level_and_keep_their_pixels() -> None:
    """A finisher writes two PNGs per overview: at the maximum level (Pillow's optimize) an
    overview of 1024 × 512 took 1.1–1.8 s of CPU; each is written at the fastest level, its
    pixels as drawn."""
    ndvi = CATALOG["MOD13A1"].layer("500m_16_days_NDVI")
    y, x = np.mgrid[0:512, 0:1024]
    stored = (3000 + 2000 * np.sin(x / 50.0) * np.cos(y / 70.0)).astype("int16")
    stored[:, 900:] = ndvi.nodata
    rgba = quicklook.colorize(stored, quicklook.style_for(ndvi), ndvi.nodata, ndvi.scale)
    bare = quicklook.png(rgba)
    assert zlib_level(bare) == 0 and np.array_equal(decoded(bare), rgba)
    drawn = quicklook.picture(rgba, quicklook.style_for(ndvi), "MOD13A1 NDVI", (-108.0, 35.0, -106.0, 36.0))
    assert zlib_level(drawn) == 0
    assert np.array_equal(decoded(drawn)[quicklook.LEGEND_ROW:quicklook.LEGEND_ROW + 512, :1024], rgba)


def tile_cog(west: float, values: np.ndarray, north: float = 35.0) -> bytes:
    profile = {"driver": "GTiff", "width": 100, "height": 100, "count": 1, "dtype": "uint8", "crs": "EPSG:4326",
               "transform": Affine(0.01, 0, west, 0, -0.01, north), "nodata": 255}
    with MemoryFile() as memory:
        with memory.open(**profile) as dst:
            dst.write(values, 1)
        return memory.read()


def test_a_jobs_overview_shows_its_region_with_the_class_colours(clients: Clients) -> None:
    job = "j-overview"
    entries = []
    for i, (west, value) in enumerate([(-110.0, 200), (-109.0, 25)]):  # snow west, bare ground east
        values = np.full((100, 100), value, dtype="uint8")
        values[:10, :10] = 255  # a corner without data
        blob = names.tile_blob(f"{i:02d}" * 32, "MOD10A2", "Maximum_Snow_Extent", "2022-02-02", f"t{i}")
        clients.transfers.upload(clients.tiles, blob, tile_cog(west, values), "image/tiff")
        entries.append({"task": f"{i:09d}", "stage": "modis", "product": "MOD10A2", "date": "2022-02-02",
                        "crs": "EPSG:4326", "bounds": f"{west},34.0,{west + 1},35.0",
                        "outputs": [names.TILE_OUTPUT_PREFIX + blob]})
    (made,) = overview.build(clients, job, entries)
    assert made["bounds"] == (-110.0, 34.0, -108.0, 35.0) and made["tiles"] == 2
    assert {"label": "200 snow", "colour": "#f5faff"} in made["legend"]
    bare = decoded(clients.transfers.download(clients.products, made["map"])[0])
    assert bare.shape == (512, 1024, 4)  # 2° × 1°, the longer side 1024 px
    assert tuple(bare[256, 256]) == (*COLOURS[200], 255)  # a pixel of the snow tile
    assert tuple(bare[256, 768]) == (*COLOURS[25], 255)  # and of the snow-free one
    assert bare[5, 5, 3] == 0 and bare[5, 517, 3] == 0  # nodata: transparent
    picture = decoded(clients.transfers.download(clients.products, made["picture"])[0])
    assert picture.shape[0] > 512 and tuple(picture[256, 256]) == (*COLOURS[200], 255)
    with rasterio.open(io.BytesIO(clients.transfers.download(clients.tiles, entries[0]["outputs"][0][6:])[0])) as t:
        assert t.read(1)[50, 50] == 200  # the class whose colour the overview shows there


def test_an_overview_across_the_antimeridian_is_the_region_not_the_world(clients: Clients) -> None:
    """Fiji's tiles either side of ±180° (179…180 and −180…−179): one image of the region,
    2° × 1° as the region is, the west tile on its left and the east tile on its right, its
    box across ±180° as GeoJSON gives one (west above east) — not 360° wide with a speck
    at either end."""
    entries = []
    for i, (west, value) in enumerate([(179.0, 200), (-180.0, 25)]):
        blob = names.tile_blob(f"{i + 7:02d}" * 32, "MOD10A2", "Maximum_Snow_Extent", "2022-02-02", f"f{i}")
        clients.transfers.upload(clients.tiles, blob, tile_cog(west, np.full((100, 100), value, "uint8"), -16.0),
                                 "image/tiff")
        entries.append({"task": f"{i:09d}", "stage": "modis", "product": "MOD10A2", "date": "2022-02-02",
                        "crs": "EPSG:4326", "bounds": f"{west},-17.0,{west + 1},-16.0",
                        "outputs": [names.TILE_OUTPUT_PREFIX + blob]})
    (made,) = overview.build(clients, "j-fiji", entries)
    assert made["bounds"] == (179.0, -17.0, -179.0, -16.0)
    bare = decoded(clients.transfers.download(clients.products, made["map"])[0])
    assert bare.shape == (512, 1024, 4)
    assert tuple(bare[256, 256]) == (*COLOURS[200], 255) and tuple(bare[256, 768]) == (*COLOURS[25], 255)
    assert (bare[..., 3] == 255).all()  # every pixel one of the tiles'


def test_an_overview_of_cached_tiles_is_drawn_once_and_copied_for_a_repeat(clients: Clients) -> None:
    entries = []
    for i, (west, value) in enumerate([(-110.0, 200), (-109.0, 25)]):
        blob = names.tile_blob(f"{i + 4:02d}" * 32, "MOD10A2", "Maximum_Snow_Extent", "2022-02-10", f"t{i}")
        clients.transfers.upload(clients.tiles, blob, tile_cog(west, np.full((100, 100), value, "uint8")), "image/tiff")
        entries.append({"task": f"{i:09d}", "stage": "modis", "product": "MOD10A2", "date": "2022-02-10",
                        "crs": "EPSG:4326", "bounds": f"{west},34.0,{west + 1},35.0",
                        "outputs": [names.TILE_OUTPUT_PREFIX + blob]})
    (first,) = overview.build(clients, "j-drawn", entries)
    assert [b.name for b in clients.products.list_blobs(name_starts_with=names.OVERVIEW_CACHE_PREFIX)]

    for entry in entries:  # the repeat reads no tile: it copies what was drawn
        clients.tiles.delete_blob(entry["outputs"][0].removeprefix(names.TILE_OUTPUT_PREFIX))
    (again,) = overview.build(clients, "j-again", entries)
    assert {k: v for k, v in again.items() if k not in ("picture", "map")} == {
        k: v for k, v in first.items() if k not in ("picture", "map")}
    assert again["map"] == names.overview_blob("j-again", "MOD10A2.Maximum_Snow_Extent.2022-02-10.map.png")
    for kind in ("picture", "map"):
        assert (clients.transfers.download(clients.products, again[kind])[0]
                == clients.transfers.download(clients.products, first[kind])[0])

    # other tiles (another content address) are drawn, not copied: read, and here gone
    other = [e | {"outputs": [e["outputs"][0].replace("2022-02-10", "2022-02-18")]} for e in entries]
    with pytest.raises(ResourceNotFoundError):
        overview.build(clients, "j-other", other)


def fraction_cog(unit: str, colormap: str) -> bytes:
    """A program's raster as published: a fraction from 0 (west) to 1 (east), -1 nodata,
    with the unit and colour ramp its reducer declared (``rasters.declare``)."""
    profile = {"driver": "GTiff", "width": 100, "height": 100, "count": 1, "dtype": "float32", "crs": "EPSG:4326",
               "transform": Affine(0.01, 0, -108.0, 0, -0.01, 36.0), "nodata": -1.0}
    values = np.repeat(np.linspace(0.0, 1.0, 100, dtype="float32")[None, :], 100, axis=0)
    values[:, :5] = -1.0
    with MemoryFile() as memory:
        with memory.open(**profile) as dst:
            dst.write(values, 1)
        path = Path(memory.name)
        declared = rasters.declare(path, unit, colormap)
        assert declared == bool(unit or colormap)
        return memory.read()


def test_a_reductions_overview_is_in_its_declared_unit_on_its_declared_ramp(clients: Clients) -> None:
    """A reducer declaring its outputs' unit and colour ramp (reducer.json's output, here
    "1" and Blues) gets an overview on that ramp, its colour bar and its legend (which the
    job page draws) in that unit; without a declaration, viridis and no unit."""
    blues = ramps.stops("Blues")
    made = {}
    for unit, colormap in (("1", "Blues"), ("", "")):
        blob = f"products/j-ramp-{colormap or 'none'}/snow_fraction/h09v05/snow_fraction.tif"
        clients.transfers.upload(clients.products, blob, fraction_cog(unit, colormap), "image/tiff")
        entry = {"task": "000000003", "stage": "reduce", "product": "MOD10A2", "start": "2022-01-25",
                 "end": "2022-02-17", "crs": "EPSG:4326", "bounds": "-108.0,35.0,-107.0,36.0",
                 "reduce": {"name": "snow_fraction"}, "outputs": [blob]}
        (made[colormap],) = overview.build(clients, f"j-ramp-{colormap or 'none'}", [entry])
    declared, plain = made["Blues"], made[""]
    assert declared["unit"] == "1" and plain["unit"] == ""
    assert [e["colour"] for e in declared["legend"]] == ["#{:02x}{:02x}{:02x}".format(*c) for c in blues]
    assert declared["legend"][-1]["label"].endswith(" 1") and not plain["legend"][-1]["label"].endswith(" 1")
    assert plain["legend"][0]["colour"] == "#{:02x}{:02x}{:02x}".format(*quicklook.VIRIDIS[0][1])
    bare = decoded(clients.transfers.download(clients.products, declared["map"])[0])
    height, width = bare.shape[:2]
    assert bare[height // 2, 2, 3] == 0  # nodata: transparent
    for column, colour in ((int(width * 0.06), blues[0]), (width - 2, blues[-1])):  # its low end, its high one
        assert np.abs(bare[height // 2, column, :3].astype(int) - colour).max() <= 12, column
    picture = decoded(clients.transfers.download(clients.products, declared["picture"])[0])
    bar = 2 * quicklook.LEGEND_ROW + height + 3 + quicklook.LEGEND_ROW + quicklook.BAR // 2
    row = picture[bar, 5:-5, :3].astype(int)
    assert np.abs(row[0] - blues[0]).max() <= 3 and np.abs(row[-1] - blues[-1]).max() <= 3  # the bar on Blues


def test_a_reducer_names_a_colour_ramp_bagpipe_draws(tmp_path: Path) -> None:
    manifest = {"name": "ramped", "argv": ["{python}", "{here}/x.py"], "output": {"unit": "mm", "colormap": "Blues_r"}}
    assert reducers.parse(json.dumps(manifest).encode(), tmp_path, "reducer.json").colormap == "Blues_r"
    with pytest.raises(ValueError, match=r"output\.colormap: .*'Bluez' is not a colour ramp"):
        reducers.parse(json.dumps(manifest | {"output": {"colormap": "Bluez"}}).encode(), tmp_path, "reducer.json")


def sinusoidal_cog(x: float, y: float, values: np.ndarray) -> bytes:
    profile = {"driver": "GTiff", "width": 100, "height": 100, "count": 1, "dtype": "uint8",
               "crs": SINUSOIDAL_PROJ4, "transform": Affine(1000.0, 0, x, 0, -1000.0, y), "nodata": 255}
    with MemoryFile() as memory:
        with memory.open(**profile) as dst:
            dst.write(values, 1)
        return memory.read()


def test_a_tile_is_warped_into_its_window_of_the_overview_as_onto_the_whole_of_it(
        clients: Clients, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each raster is warped into the part of the canvas its lon/lat box covers, not onto
    the whole canvas: the same pixels, to the byte, as warping every raster onto the whole
    canvas — for tiles on the sinusoidal grid at 58° N, whose edges are slanted and curved
    in lon/lat, so that a window too tight would cut their corners off."""
    classes = sorted(COLOURS)
    rows, cols = np.mgrid[0:100, 0:100]
    members = []
    for i, x in enumerate((1_000_000.0, 1_100_000.0, 1_000_000.0)):
        y = 6_500_000.0 if i < 2 else 6_400_000.0
        values = np.asarray(classes, dtype="uint8")[(rows // 3 + cols // 7 + i) % len(classes)]
        values[:4, :4] = 255
        blob = names.tile_blob(f"{i + 20:02d}" * 32, "MOD10A2", "Maximum_Snow_Extent", "2022-02-02", f"s{i}")
        clients.transfers.upload(clients.tiles, blob, sinusoidal_cog(x, y, values), "image/tiff")
        members.append(({"crs": SINUSOIDAL_PROJ4, "bounds": f"{x},{y - 100_000},{x + 100_000},{y}"},
                        names.TILE_OUTPUT_PREFIX + blob))
    key = ("MOD10A2", "Maximum_Snow_Extent", "2022-02-02", "")
    windowed = overview.draw(clients, "j-window", key, members)[1]
    monkeypatch.setattr(overview, "_window", lambda box, transform, shape: (slice(0, shape[0]), slice(0, shape[1])))
    whole = overview.draw(clients, "j-whole", key, members)[1]
    bare = decoded(windowed["map"])
    assert (bare[..., 3] == 255).sum() > 0.3 * bare[..., 3].size  # the tiles drawn, slanted, on a third of it
    assert np.array_equal(bare, decoded(whole["map"]))
    assert np.array_equal(decoded(windowed["picture"]), decoded(whole["picture"]))


def test_overviews_drawn_at_once_are_those_drawn_one_after_another(
        clients: Clients, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's overviews are drawn on several threads: each the same image as drawn alone."""
    entries = []
    for d, day in enumerate(("2022-01-01", "2022-01-09", "2022-01-17", "2022-01-25", "2022-02-02", "2022-02-10")):
        for i, west in enumerate((-110.0, -109.0)):
            values = np.asarray(sorted(COLOURS), dtype="uint8")[(np.arange(10_000).reshape(100, 100) // (d + 2 + i))
                                                                 % len(COLOURS)]
            blob = names.tile_blob(f"{d}{i}" * 32, "MOD10A2", "Maximum_Snow_Extent", day, f"t{i}")
            clients.transfers.upload(clients.tiles, blob, tile_cog(west, values), "image/tiff")
            entries.append({"task": f"{d:08d}{i}", "stage": "modis", "product": "MOD10A2", "date": day,
                            "crs": "EPSG:4326", "bounds": f"{west},34.0,{west + 1},35.0",
                            "outputs": [names.TILE_OUTPUT_PREFIX + blob]})
    monkeypatch.setattr(overview, "_cache", lambda *args: None)  # each job draws its own
    at_once = overview.build(clients, "j-threads", entries)
    monkeypatch.setattr(overview, "DRAWN_AT_ONCE", 1)
    alone = overview.build(clients, "j-alone", entries)
    assert len(at_once) == len(alone) == 6
    for one, other in zip(at_once, alone, strict=True):
        assert one["date"] == other["date"]
        for kind in ("picture", "map"):
            assert (clients.transfers.download(clients.products, one[kind])[0]
                    == clients.transfers.download(clients.products, other[kind])[0])

"""``bagpipe run-stage``: one stage of a task on local files, with no Azure at all — the
code the workers run, for a scientist debugging a reprojection or a reduction on a laptop."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from bagpipe.terminal import console, fail

if TYPE_CHECKING:
    from pipeline.reduction import reducers


def run_stage(
    stage: Annotated[str, typer.Argument(metavar="STAGE", help="reproject, or reduce.")],
    inputs: Annotated[list[Path], typer.Option("--input", exists=True, dir_okay=False,
                                               help="A source file (repeat: a mosaic, or a reduction's span); "
                                                    "reproject: a granule's HDF4 file or a layer's GeoTIFF.")],
    out: Annotated[Path, typer.Option(help="The output file (reproject) or folder (reduce).")],
    dst_crs: Annotated[str, typer.Option(help="reproject: target CRS, as for rio warp.")] = "EPSG:4326",
    res: Annotated[float, typer.Option(min=0.0, help="reproject: target pixel size in CRS units.")] = 0.005,
    bounds: Annotated[Optional[tuple[float, float, float, float]], typer.Option(
        help="reproject: west south east north, in the target CRS.")] = None,
    resampling: Annotated[Optional[str], typer.Option(
        help="reproject: nearest, bilinear, average, ... (default: the layer's)")] = None,
    product: Annotated[Optional[str], typer.Option(
        help="reproject: the product the sources are of (default: the one their names say).")] = None,
    layer: Annotated[Optional[str], typer.Option(
        help="reproject: the layer (default: the one a GeoTIFF's name says, else the product's).")] = None,
    reducer: Annotated[Optional[str], typer.Option(
        help="reduce: an installed reducer's name, or a reducer's folder (its reducer.json).")] = None,
    reducers_path: Annotated[str, typer.Option(help="reduce: more folders of reducers (:-separated).")] = "",
    arg: Annotated[Optional[list[str]], typer.Option(
        help="reduce: an argument for task.json's args, NAME=VALUE (VALUE as JSON where it is).")] = None,
    tile: Annotated[Optional[str], typer.Option(
        help="reduce: the tile's name in task.json (default: its grid's name for the inputs' bounds).")] = None,
) -> None:
    """Run one stage on local files, with no Azure at all: the code workers run."""
    if stage == "reproject":
        _reproject(inputs, out, dst_crs, res, bounds, resampling, product, layer)
    elif stage == "reduce":
        _reduce(inputs, out, reducer, reducers_path, dict(_arg(a) for a in arg or []), tile)
    else:
        fail(ValueError(f"unknown stage {stage!r}: reproject or reduce"))


def _named(inputs: list[Path], product: str | None, layer: str | None) -> tuple[str, str | None]:
    """The product and layer the ``--input`` files are of: what their names say (a granule's
    file is named for its product, a layer's GeoTIFF for its layer too, as NASA and Planetary
    Computer name them), checked against ``--product`` and ``--layer`` where given; exits
    naming the file whose name disagrees, or asking for ``--product`` when no name says."""
    from pipeline.modis.granules import named_in
    from pipeline.modis.products import CATALOG

    said = {path: named_in(path.name) for path in inputs}
    for path, found in said.items():
        if found and product and found[0] != product:
            fail(ValueError(f"--product {product}, but {path.name} is a {found[0]} granule, as its name says: "
                            f"drop --product, or give {product}'s files"))
    products = sorted({found[0] for found in said.values() if found})
    if product is None:
        if len(products) != 1 or None in said.values():
            unnamed = [path.name for path, found in said.items() if not found]
            fail(ValueError(f"--product: the inputs' names do not say one product ({', '.join(products + unnamed)}): "
                            f"name it, one of {', '.join(CATALOG)}"))
        product = products[0]
    if product not in CATALOG:
        fail(ValueError(f"--product: one of {', '.join(CATALOG)}"))
    layers = {found[1] for found in said.values() if found and found[1] in CATALOG[product].layer_names}
    if layer is None and len(layers) == 1:
        layer = layers.pop()
    elif layer is not None and layers - {layer}:
        fail(ValueError(f"--layer {layer}, but the inputs' names say {', '.join(sorted(layers))}: drop --layer, "
                        "or give that layer's files"))
    return product, layer


def _reproject(inputs: list[Path], out: Path, dst_crs: str, res: float,
               bounds: tuple[float, float, float, float] | None, resampling: str | None, product: str | None,
               layer: str | None) -> None:
    """Warp a layer of local granule files: HDF4 files are masked by their quality layer;
    a single layer's GeoTIFF is warped as it is (its quality layer is another file)."""
    import rasterio
    from rasterio.enums import Resampling

    from pipeline.modis.granules import HDF, granule_id
    from pipeline.modis.products import CATALOG
    from pipeline.modis.reprojection import Source, Target, warp
    from pipeline.modis.targets import crs_problem

    problem = crs_problem(dst_crs)  # as the API refuses a grid's: a tile it can make, write and draw
    if problem:
        fail(ValueError(f"--dst-crs: {problem}"))
    if bounds is None:
        fail(ValueError("--bounds west south east north is required"))
    west, south, east, north = bounds
    if not (west < east and south < north):
        fail(ValueError(f"--bounds: west south east north, west < east and south < north (not {bounds})"))
    product, layer = _named(inputs, product, layer)
    spec = CATALOG[product].default if layer is None else next(
        (x for x in CATALOG[product].layers if x.name == layer), None)
    if spec is None:
        fail(ValueError(f"--layer: one of {', '.join(CATALOG[product].layer_names)}"))
    resampling = resampling or spec.resampling
    if resampling not in Resampling.__members__:
        fail(ValueError(f"unknown resampling {resampling!r}"))
    # a tile's SOURCES name granules by id, as a worker's do: run-stage reduce reads their dates
    sources = [Source(granule_id(p.name) or p.name, {HDF if p.suffix == ".hdf" else spec.name: p}) for p in inputs]
    try:
        data = warp(sources, CATALOG[product], spec.name, Target(dst_crs, bounds, res, resampling),
                    masks=all(p.suffix == ".hdf" for p in inputs))
    except Exception as exc:  # a scientist's command line: say what went wrong
        fail(exc)
    out.write_bytes(data)
    console.print(f"wrote {out} ({len(data)} bytes)")
    with rasterio.MemoryFile(data) as memory, memory.open() as written:
        if not written.dataset_mask().any():
            console.print("[yellow]warning:[/yellow] no valid pixel in --bounds: do the --input granules cover "
                          "them (or are they all fill there)?")


def _reducer(name: str | None, path: str) -> reducers.Reducer:
    """``--reducer``: an installed reducer's name, or a reducer's own folder (its ``reducer.json``)."""
    from pipeline.reduction import reducers

    if name and (Path(name) / "reducer.json").is_file():
        try:
            return reducers.load(Path(name) / "reducer.json")
        except ValueError as exc:
            fail(exc)
    known = reducers.catalog(path)
    if name not in known:
        fail(ValueError(f"--reducer: a reducer's folder (its reducer.json), or one of {', '.join(sorted(known))}"))
    return known[name]


def _tiles(inputs: list[Path]) -> tuple[dict[str, Any], dict[str, list[tuple[str, Path]]]]:
    """What reprojected tiles (``run-stage reproject``'s, or a job's downloaded tiles) say
    of the task a worker would run on them — its product, layer, tile, CRS and bounds —
    and their (date, file) by ``PRODUCT.LAYER``, in the order given; exits naming a file
    that is no such tile or that disagrees with the first."""
    import rasterio

    from pipeline.modis.granules import Granule, granule_id
    from pipeline.modis.targets import GridSpec

    where: dict[str, Any] = {}
    dated: dict[str, list[tuple[str, Path]]] = {}
    for path in inputs:
        with rasterio.open(path) as tile:
            tags, crs, bounds, res = tile.tags(), tile.crs, tile.bounds, tile.res[0]
        sources = [Granule.named(granule_id(name) or name, {}) for name in tags.get("SOURCES", "").split(",")]
        if not (tags.get("PRODUCT") and tags.get("LAYER") and sources and all(sources)) or crs is None:
            fail(ValueError(f"--input {path}: not a reprojected tile (no PRODUCT, LAYER or SOURCES tag, or no CRS): "
                            "make it with `bagpipe run-stage reproject`, or download a job's with `bagpipe results`"))
        size = bounds.right - bounds.left
        place = {"crs": crs.to_string(), "bounds": ",".join(repr(round(v, 9)) for v in bounds),
                 "tile": GridSpec(crs.to_string(), size, res).tile_at(bounds.left, bounds.bottom).name}
        if where and {k: where[k] for k in place} != place:
            fail(ValueError(f"--input {path}: another tile ({place['bounds']} in {place['crs']}) than the first "
                            f"({where['bounds']} in {where['crs']}): a reduction runs on one tile's dates"))
        where = where or place | {"product": tags["PRODUCT"], "layer": tags["LAYER"]}
        day = sources[0].day.isoformat()  # type: ignore[union-attr]  # checked above
        dated.setdefault(f"{tags['PRODUCT']}.{tags['LAYER']}", []).append((day, path))
    return where, dated


def _reduce(inputs: list[Path], out: Path, name: str | None, path: str, args: dict[str, Any], tile: str | None) -> None:
    """Run a reducer on reprojected tiles as a worker runs a request's reducer on a tile's
    span: the same ``task.json`` (``pipeline.reduction.stage.program_task``), the same
    staged file names, the same sandbox."""
    import tempfile

    from pipeline.reduction.stage import program_task, run_program

    program = _reducer(name, path)
    where, dated = _tiles(inputs)
    first = f"{where['product']}.{where['layer']}"
    task = program_task(job="local", task="local", product=where["product"], layer=where["layer"],
                        tile=tile or where["tile"], crs=where["crs"], bounds=where["bounds"], missing_dates=[],
                        failed_dates=[], args=args)
    with tempfile.TemporaryDirectory(prefix="bagpipe-run-") as top:
        run = run_program(program, sorted(dated[first]), Path(top), task,
                          {ref: sorted(pairs) for ref, pairs in dated.items() if ref != first})
        for stream in ("stdout.txt", "stderr.txt"):
            text = (run.folder / stream).read_text(errors="replace").strip()
            if text:
                console.print(f"[dim]{stream}:[/dim] {text[-2000:]}")
        failure = run.failure(program)
        out.mkdir(parents=True, exist_ok=True)
        for made in run.outputs:
            target = out / made.relative_to(run.folder / "outputs")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(made, target)
            console.print(f"wrote {target}")
    if failure is not None:
        fail(failure)


def _arg(text: str) -> tuple[str, Any]:
    """``--arg NAME=VALUE``: VALUE as JSON where it is (a number, a list…), as a request's
    ``args`` give it, else the text."""
    name, equals, value = text.partition("=")
    if not (name and equals):
        fail(ValueError(f"--arg: NAME=VALUE (not {text!r})"))
    try:
        return name, json.loads(value)
    except ValueError:
        return name, value

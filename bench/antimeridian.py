"""Peak memory of reprojecting one target tile that touches MODIS tiles h00 and h35 (the
antimeridian, in a Pacific-centred CRS): the mosaic of the sources' bounding box
(``rasterio.merge``, as bagpipe did before) against each source warped into the target's own
array (``pipeline.modis.reprojection``, now). Each way runs in a fresh process; its peak resident
memory above what the process held once its inputs were read is the figure.

    python -m bench.antimeridian [--pixels 1000]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

# A 100 km tile of EPSG:3832 (WGS 84 / PDC Mercator) over Fiji, across ±180°: its sources
# are h00v10 and h35v10 (see pipeline/modis/targets.py).
CRS = "EPSG:3832"
BOUNDS = (3_300_000.0, -2_100_000.0, 3_400_000.0, -2_000_000.0)
TILES = ("h00v10", "h35v10")


def sources(folder: Path) -> list[Path]:
    """The two synthesized MOD10A2 layers, written as Planetary Computer keeps them."""
    from bagpipe import modis_world as world
    from pipeline.modis.products import CATALOG

    paths = []
    for tile in TILES:
        name = world.granule_name(CATALOG["MOD10A2"], tile, date(2022, 2, 2))
        path = folder / f"{name}_Maximum_Snow_Extent.tif"
        path.write_bytes(world.cog(name, "Maximum_Snow_Extent"))
        paths.append(path)
    return paths


def _peak_mb() -> float:
    """This process's peak resident memory (MB): Linux's ``VmHWM``, which starts afresh at
    exec — ``getrusage``'s ``ru_maxrss`` keeps the peak of the process that forked this one
    (a test runner's hundreds of MB), hiding the figure."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(way: str, paths: list[Path], pixels: int) -> dict[str, float]:
    """In this process: warp one way, return the peak memory it added (MB)."""
    import numpy as np
    import rasterio
    from rasterio.merge import merge
    from rasterio.warp import reproject

    from pipeline.modis.products import CATALOG
    from pipeline.modis.reprojection import Source, Target, warp_array

    target = Target(CRS, BOUNDS, (BOUNDS[2] - BOUNDS[0]) / pixels, "nearest")
    before = _peak_mb()
    if way == "mosaic":
        datasets = [rasterio.open(p) for p in paths]
        stacked, transform = merge(datasets, nodata=255)
        out = np.full(target.shape, 255, dtype="uint8")
        reproject(stacked[0], out, src_transform=transform, src_crs=datasets[0].crs, src_nodata=255,
                  dst_transform=target.transform, dst_crs=CRS, dst_nodata=255)
        spread = stacked.shape
    else:
        out = warp_array([Source(p.stem, {"Maximum_Snow_Extent": p}) for p in paths],
                         CATALOG["MOD10A2"].layer("Maximum_Snow_Extent"), target)
        spread = (1, *out.shape)
    return {"added_mb": round(_peak_mb() - before, 1), "peak_mb": round(_peak_mb(), 1),
            "covered": float((out != 255).mean()), "array": list(spread)}


def measure(way: str, pixels: int) -> dict[str, float]:
    """Run one way in a fresh process and return its figures."""
    with tempfile.TemporaryDirectory(prefix="bagpipe-bench-") as tmp:
        sources(Path(tmp))
        done = subprocess.run([sys.executable, "-m", "bench.antimeridian", "--one", way, "--folder", tmp,
                               "--pixels", str(pixels)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pixels", type=int, default=1000)
    parser.add_argument("--one", choices=["mosaic", "target"])
    parser.add_argument("--folder")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, sorted(Path(args.folder).glob("*.tif")), args.pixels)))
        return
    before, after = measure("mosaic", args.pixels), measure("target", args.pixels)
    print(f"mosaic of the bounding box (before): array {before['array']}, +{before['added_mb']} MB")
    print(f"each source into the target (now):  array {after['array']}, +{after['added_mb']} MB")
    print(json.dumps({"target_pixels": args.pixels, "before_added_mb": before["added_mb"],
                      "after_added_mb": after["added_mb"], "before_peak_mb": before["peak_mb"],
                      "after_peak_mb": after["peak_mb"], "before_covered": before["covered"],
                      "after_covered": after["covered"]}))


if __name__ == "__main__":
    main()

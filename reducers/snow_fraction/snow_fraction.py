"""Snow-covered fraction over a time span, from MOD10A2 maximum snow extent tiles.

Usage: snow_fraction.py TASK_JSON   (bagpipe writes task.json: "inputs", "outputs_dir", "args")

Per pixel: (periods that saw snow) / (periods with a clear view of land: snow or no snow).
Writes snow_fraction.tif (float32, nodata -1) and snow_fraction.png (quick-look: white =
always snow, black = never, blue = never seen clearly).
"""

import json
import sys
from pathlib import Path

import numpy as np
import rasterio

SNOW, NO_SNOW = 200, 25  # MOD10A2 Maximum_Snow_Extent classes


def say_progress(task: dict, done: float) -> None:
    """Tell bagpipe the share of the work done (its worker ends a straggling attempt sooner)."""
    if task.get("progress_file"):
        path = Path(task["progress_file"])
        path.with_suffix(".new").write_text(f"{done:.4f}\n")
        path.with_suffix(".new").replace(path)


def main(task_path: str) -> int:
    task = json.loads(Path(task_path).read_text())
    if not task["inputs"]:
        print("no input tiles", file=sys.stderr)
        return 2
    snow = seen = None
    for done, name in enumerate(task["inputs"]):
        say_progress(task, done / len(task["inputs"]))
        with rasterio.open(name) as tile:
            classes = tile.read(1)
            profile = tile.profile
        if snow is None:
            snow = np.zeros(classes.shape, np.uint16)
            seen = np.zeros(classes.shape, np.uint16)
        snow += classes == SNOW
        seen += (classes == SNOW) | (classes == NO_SNOW)
    fraction = np.where(seen > 0, snow / np.maximum(seen, 1), -1).astype("float32")
    out = Path(task["outputs_dir"])
    profile.update(driver="GTiff", dtype="float32", nodata=-1, count=1, compress="deflate", tiled=False)
    for key in ("blockxsize", "blockysize"):
        profile.pop(key, None)
    with rasterio.open(out / "snow_fraction.tif", "w", **profile) as dst:
        dst.write(fraction, 1)
        dst.update_tags(PERIODS=",".join(task["dates"]), MISSING=",".join(task["missing_dates"]),
                        DEFINITION="periods with snow / periods with a clear view of land")
    grey = np.clip(fraction * 255, 0, 255).astype("uint8")
    never = fraction < 0
    rgb = np.stack([np.where(never, 40, grey), np.where(never, 60, grey), np.where(never, 140, grey)])
    png = {"driver": "PNG", "width": rgb.shape[2], "height": rgb.shape[1], "count": 3, "dtype": "uint8",
           "crs": profile["crs"], "transform": profile["transform"]}
    with rasterio.open(out / "snow_fraction.png", "w", **png) as dst:
        dst.write(rgb)
    valid = fraction[~never]
    print(f"{len(task['inputs'])} periods; mean snow fraction {valid.mean() if valid.size else float('nan'):.3f} "
          f"over {valid.size} pixels")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""The MODIS science: products and their layers, catalogs (STAC, CMR), the tile grid, and the
stages of a tile task: collection, then reprojection; region mosaics, quick-looks and the
products' STAC items."""

import warnings

from rasterio.errors import NotGeoreferencedWarning

# rasterio's warp of arrays (each given its transform) builds in-memory datasets that have no
# transform for a moment, and hides the warning that raises with warnings.catch_warnings(),
# which is not thread-safe: warps in threads (a tile task's places, a finisher's overviews)
# let "Dataset has no geotransform ... identity matrix" through now and then, the pixels the
# same (tests/test_quicklook.py, threaded against one at a time). Not said to a scientist.
warnings.filterwarnings("ignore", message="Dataset has no geotransform", category=NotGeoreferencedWarning,
                        module="rasterio.warp")

TILE_STAGE = "modis"  # the stage a tile task runs (``tilestage``): collection, then reprojection
POINT_STAGE = "points"  # a point task (``points``): sites sampled on a granule's own grid

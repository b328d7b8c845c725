"""The MODIS science: products and their layers, catalogs (STAC, CMR), the tile grid, and the
stages of a tile task: collection, then reprojection; region mosaics, quick-looks and the
products' STAC items."""

TILE_STAGE = "modis"  # the stage a tile task runs (``tilestage``): collection, then reprojection
POINT_STAGE = "points"  # a point task (``points``): sites sampled on a granule's own grid

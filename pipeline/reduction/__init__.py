"""Reduction: scientists' programs (declared or uploaded), and the ``reduce`` stage that runs
one in a sandbox of its own (``sandbox``, ``jail``); the built-in reductions that need no
program (``builtin``: a reducer or an expression, a baseline's climatology), run in the
worker on numpy (``pipeline.science``)."""

REDUCE_STAGE = "reduce"  # the stage a reduction task runs (``stage``)
AGGREGATE_STAGE = "aggregate"  # a reduction's built-in reducer or expression (``builtin``)
CLIMATOLOGY_STAGE = "climatology"  # a baseline's statistics (``builtin``)
ZONAL_STAGE = "zonal"  # a target tile's partial zonal statistics (``zonal``)
ZONES_GATHER = "zones"  # the gather joining them across tiles into one table (``zonal``)
CUBE_GATHER = "cube"  # the gather writing a netCDF or Zarr cube (``cubes``)
SITES_GATHER = "sites"  # the gather joining a job's point tables into one (``gather``)

"""Reduction: scientists' programs (declared or uploaded), and the ``reduce`` stage that runs
one in a sandbox of its own (``sandbox``, ``jail``); the built-in reductions that need no
program (``builtin``: a reducer or an expression, a baseline's climatology), run in the
worker on numpy (``pipeline.science``)."""

REDUCE_STAGE = "reduce"  # the stage a reduction task runs (``stage``)
AGGREGATE_STAGE = "aggregate"  # a reduction's built-in reducer or expression (``builtin``)
CLIMATOLOGY_STAGE = "climatology"  # a baseline's statistics (``builtin``)

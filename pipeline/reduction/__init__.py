"""Reduction: scientists' programs (declared or uploaded), and the ``reduce`` stage that runs
one in a sandbox of its own (``sandbox``, ``jail``)."""

REDUCE_STAGE = "reduce"  # the stage a reduction task runs (``stage``)

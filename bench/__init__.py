"""Benchmarks: each module runs on demand (``make bench NAME=x``), prints its figures and,
as its last line, one JSON object."""

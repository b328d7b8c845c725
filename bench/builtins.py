"""Speed of the built-in reducers (``pipeline.science.builtins``), the climatology and an
expression, on one core: input megapixels (dates × rows × columns) per CPU second, the best
of a few runs, for the whole-stack form and the streaming one (a date at a time; the order
statistics by blocks of rows), and the streaming form's peak memory (traced, a run of its
own) against the stack's size.

    python -m bench.builtins [--dates 23] [--pixels 1200] [--mask clouds|random] [--repeat 3]

The stack: a year of 16-day composites (23 dates) of a 1200 × 1200 tile, float32, 30% of its
values missing — in clouds (blocks of 16 × 16 pixels, as a mask is in a real tile) or, with
``--mask random``, pixel by pixel, which is slower: numpy's masked writes and choices
(``where``, ``copyto``) branch per pixel, and a random mask defeats the processor's branch
prediction. CPU time, not wall time, so that other work on the machine does not count. Last
line: one JSON object.
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")  # one core (numpy's elementwise work and sorts use one anyway)

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from collections.abc import Callable  # noqa: E402
from datetime import date, timedelta  # noqa: E402

import numpy as np  # noqa: E402

from pipeline.science import builtins  # noqa: E402
from pipeline.science.climatology import climatology  # noqa: E402
from pipeline.science.expressions import parse  # noqa: E402


def best(run: Callable[[], object], repeat: int) -> float:
    """The least CPU time of ``repeat`` runs (seconds)."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times)


def peak_mb(run: Callable[[], object]) -> float:
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dates", type=int, default=23)
    parser.add_argument("--pixels", type=int, default=1200)
    parser.add_argument("--mask", choices=["clouds", "random"], default="clouds")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    shape = (args.pixels, args.pixels)
    values = rng.normal(0.4, 0.2, (args.dates, *shape)).astype(np.float32)
    if args.mask == "random":
        values[rng.random(values.shape) < 0.3] = np.nan
    else:
        blocks = -(-args.pixels // 16)
        clouds = np.kron(rng.random((args.dates, blocks, blocks)) < 0.3, np.ones((1, 16, 16), bool))
        values[clouds[:, : args.pixels, : args.pixels]] = np.nan
    dates = [date(2022, 1, 1) + timedelta(days=16 * k) for k in range(args.dates)]
    baseline = climatology(values[: max(2, args.dates // 4)])
    megapixels = values.size / 1e6
    stack_mb = values.nbytes / 1e6

    def read(index: int, rows: slice) -> np.ndarray:
        return values[index, rows]

    figures: dict[str, dict[str, float]] = {}
    print(f"{args.dates} dates of {args.pixels} x {args.pixels}, 30% missing ({args.mask}): {megapixels:.1f} "
          f"megapixels, a stack of {stack_mb:.0f} MB; megapixels per CPU second, best of {args.repeat}")
    print(f"{'reducer':<16}{'whole':>9}{'stream':>9}{'stream peak MB':>16}")
    for name in builtins.NAMES:
        reducer = builtins.Reducer(name, 90.0 if name == "percentile" else None)
        whole = best(lambda r=reducer: builtins.reduce(r, values, dates, baseline), args.repeat)
        streamed = best(lambda r=reducer: builtins.reduce_stream(r, read, dates, shape, baseline), args.repeat)
        peak = peak_mb(lambda r=reducer: builtins.reduce_stream(r, read, dates, shape, baseline,
                                                                 max_bytes=64 * 1024 * 1024))
        figures[str(reducer)] = {"whole": round(megapixels / whole, 1), "stream": round(megapixels / streamed, 1),
                                 "stream_peak_mb": round(peak, 1)}
        print(f"{reducer!s:<16}{megapixels / whole:>9.1f}{megapixels / streamed:>9.1f}{peak:>16.1f}")
    seconds = best(lambda: climatology(values), args.repeat)
    figures["climatology"] = {"whole": round(megapixels / seconds, 1)}
    print(f"{'climatology':<16}{megapixels / seconds:>9.1f}")
    ndvi = parse("(nir - red) / (nir + red)")
    red, nir = values[0], values[1]
    seconds = best(lambda: ndvi.evaluate({"red": red, "nir": nir}), args.repeat)
    figures["expression_ndvi"] = {"whole": round(red.size / 1e6 / seconds, 1)}  # output megapixels
    print(f"{'NDVI expression':<16}{red.size / 1e6 / seconds:>9.1f}   (output megapixels per CPU second)")
    print(json.dumps({"dates": args.dates, "pixels": args.pixels, "mask": args.mask, "stack_mb": round(stack_mb, 1),
                      "stream_max_bytes_mb": 64 * 1024 * 1024 / 1e6, "megapixels_per_cpu_second": figures}))


if __name__ == "__main__":
    main()

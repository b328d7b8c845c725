"""End-to-end rate of the local stack: one job of the built-in stage, run with 1 and with
2 worker processes side by side in one run, from submit to the completion email.

    python -m bench.lifecycle [--tasks-years 2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import httpx

from bagpipe.azurite import Azurite
from bagpipe.stack import LocalStack

STAGES = "tests.stages_for_tests"  # the digest stage: a light stand-in with no rasters
REQUEST = {
    "region": {"tiles": ["h07v05", "h08v04", "h08v05", "h09v04", "h09v05", "h10v04", "h10v05"]},
    "products": ["MOD10A2"],
    "email": "bench@example.org",
}


def run_once(azurite: Azurite, home: Path, workers: int, slots: int, years: int, namespace: str) -> dict:
    request = REQUEST | {"start": "2022-01-01", "end": f"{2021 + years}-12-31"}
    with LocalStack(home, workers=workers, slots=slots, connection=azurite.connection_string,
                    namespace=namespace, overrides={"tile_stage": "digest", "stage_modules": STAGES}) as stack:
        http = httpx.Client(base_url=stack.api_url, timeout=60,
                            headers=stack.headers)
        started = time.monotonic()
        created = http.post("/api/jobs", json=request).json()
        job, total = created["job"], created["total"]
        while True:
            status = http.get(f"/api/jobs/{job}").json()
            if status["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                break
            time.sleep(0.2)
        elapsed = time.monotonic() - started
    return {"workers": workers, "slots": slots, "tasks": total, "state": status["state"],
            "seconds": round(elapsed, 2), "tasks_per_s": round(total / elapsed, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--years", type=int, default=1, help="years of 8-day periods (322 tasks each)")
    parser.add_argument("--slots", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        azurite = Azurite(Path(tmp) / "azurite").start()
        try:
            runs = [run_once(azurite, Path(tmp) / f"w{w}", w, args.slots, args.years, f"b{w}")
                    for w in (1, 2)]
        finally:
            azurite.stop()
    print(f"{'workers':>8} {'slots':>6} {'tasks':>6} {'seconds':>8} {'tasks/s':>8}")
    for r in runs:
        print(f"{r['workers']:>8} {r['slots']:>6} {r['tasks']:>6} {r['seconds']:>8} {r['tasks_per_s']:>8}")
    print(json.dumps({"runs": runs, "speedup_2_workers": round(runs[1]["tasks_per_s"] / runs[0]["tasks_per_s"], 2)}))


if __name__ == "__main__":
    main()

"""A job under fire, checked from storage against a clean run of the same request.

A clean run first; then the same request through a Toxiproxy in front of Azurite while a
random worker is SIGKILLed (and restarted) every few seconds, Azurite (disk mode) is stopped
and restarted twice, and the proxy injects latency spikes and resets a share of
connections. The tasks do real work: MODIS granules found through the local Planetary Computer, collected,
cached and reprojected to 1° tiles. Then, from storage alone: every task terminal and
succeeded, one committed attempt per task, each output byte-identical to the clean run's,
no blob that no task names (nor a cache marker left behind), one completion email.
Last line: one JSON object.

Azurite is stopped with SIGTERM, as a service restarts: SIGKILL would lose the emulator's
own unsaved metadata, which Azure Storage does not do to acknowledged writes.

    python -m tests.harness.chaos [--tasks 2000] [--workers 4] [--slots 2] [--kill-every 4]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import httpx

from bagpipe.azurite import ACCOUNT, ACCOUNT_KEY, Azurite
from bagpipe.stack import LocalStack
from bagpipe.toxiproxy import Toxiproxy
from pipeline.lifecycle import attempts, jobs, tasks
from pipeline.lifecycle.status import TaskStatus
from pipeline.storage import names
from pipeline.storage.clients import Clients

FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED")
COMMITTED = {TaskStatus.SUCCEEDED.value, TaskStatus.CACHED.value}


def request_for(count: int) -> tuple[dict[str, Any], int]:
    """MOD10A2 over 1° tiles inside MODIS tile h09v05, 8-day periods: about ``count`` tasks,
    and the most tiles a tile task warps. Below 200, a period's 2 tiles are one task (a
    batch, killed and retried whole); from 200, 10 tiles a task each (as many periods in
    batches would run past today)."""
    tiles, batch = (10, 1) if count >= 200 else (2, 2)
    periods = math.ceil(count * batch / tiles)
    start = date(2018, 1, 1)
    return {"region": {"bbox": [-110.0 + 0.01, 35.01, -110.0 + tiles / 2 - 0.01, 36.99]},
            "grid": {"crs": "EPSG:4326", "tile_size": 1, "resolution": 0.02},
            "products": ["MOD10A2"], "start": start.isoformat(),
            "end": (start + timedelta(days=8 * periods - 1)).isoformat(), "email": "chaos@example.org"}, batch


@dataclass
class Chaos:
    """What was done to the run, counted as it was done."""

    kills: int = 0
    restarts: int = 0
    resets: int = 0
    latency_spikes: int = 0
    log: list[str] = field(default_factory=list)


def submit(stack: LocalStack, body: dict[str, Any]) -> tuple[str, float]:
    """The new job's id, and when it was submitted."""
    http = httpx.Client(base_url=stack.api_url, timeout=60, headers=stack.headers)
    return http.post("/api/jobs", json=body).raise_for_status().json()["job"], time.monotonic()


def wait(stack: LocalStack, job: str, started: float, timeout: float) -> float:
    """Seconds from submission to the job's end."""
    http = httpx.Client(base_url=stack.api_url, timeout=60, headers=stack.headers)
    while time.monotonic() - started < timeout:
        try:
            listed = http.get("/api/jobs").json()
            if next(j["state"] for j in listed if j["job"] == job) in FINISHED:
                return time.monotonic() - started
        except (httpx.HTTPError, StopIteration, TypeError, ValueError):
            pass  # storage restarting under the API: ask again
        time.sleep(0.5)
    raise TimeoutError(f"job {job} did not finish within {timeout:.0f} s")


def torment(stack: LocalStack, azurite: Azurite, proxy: Toxiproxy, progress: Callable[[], float], stop: threading.Event,
            chaos: Chaos, kill_every: float, seed: int, restarts: int) -> None:
    """Kill workers, restart storage ``restarts`` times evenly along the way (twice: at 1/3
    and 2/3), spike latency, reset connections."""
    rng = random.Random(seed)
    restart_at = [(i + 1) / (restarts + 1) for i in range(restarts)]
    next_kill, next_spike, next_reset = (time.monotonic() + t for t in (kill_every, 3.0, 5.0))
    while not stop.wait(0.25):
        try:
            next_kill, next_spike, next_reset = _strike(stack, azurite, proxy, progress, chaos, rng, restart_at,
                                                        kill_every, next_kill, next_spike, next_reset)
        except Exception as exc:  # the run goes on; a storage that stays down would stall it
            chaos.log.append(f"torment step failed: {type(exc).__name__}: {exc}")
            if azurite.process is None or azurite.process.poll() is not None:
                _start_storage(azurite, chaos)


def _start_storage(azurite: Azurite, chaos: Chaos, tries: int = 5) -> None:
    """Start Azurite again, however loaded the machine: a stalled run proves nothing."""
    for attempt in range(tries):
        try:
            azurite.start(timeout=120)
            return
        except (RuntimeError, TimeoutError) as exc:
            chaos.log.append(f"storage start {attempt + 1} failed: {exc}")
            time.sleep(2)
    raise RuntimeError("storage could not be started again")


def _strike(stack: LocalStack, azurite: Azurite, proxy: Toxiproxy, progress: Callable[[], float], chaos: Chaos,
            rng: random.Random, restart_at: list[float], kill_every: float, next_kill: float, next_spike: float,
            next_reset: float) -> tuple[float, float, float]:
    """Whatever is due now; returns when the next kill, spike and reset are due."""
    now = time.monotonic()
    if now >= next_kill:
        index = rng.randrange(len(stack.worker_processes))
        victim = stack.worker_processes[index]
        if victim.poll() is None:
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait()
            chaos.kills += 1
        stack.start_worker(index)
        next_kill = now + kill_every
    if restart_at and progress() >= restart_at[0]:
        restart_at.pop(0)
        azurite.stop()
        time.sleep(3)
        _start_storage(azurite, chaos)
        chaos.restarts += 1
        chaos.log.append(f"storage restarted at {progress():.0%}")
    if now >= next_spike:
        burst(proxy, 1.5, "latency", "downstream", latency=400, jitter=300)
        chaos.latency_spikes += 1
        next_spike = time.monotonic() + rng.uniform(4, 8)
    if now >= next_reset:
        burst(proxy, 1.0, "reset_peer", "upstream", toxicity=0.3, timeout=50)
        chaos.resets += 1
        next_reset = time.monotonic() + rng.uniform(6, 12)
    return next_kill, next_spike, next_reset


def jobs_state(clients: Clients, job: str) -> str:
    try:
        return jobs.get(clients, job).state.value
    except Exception as exc:
        return f"unreadable ({type(exc).__name__})"


def burst(proxy: Toxiproxy, seconds: float, kind: str, stream: str, **attributes: Any) -> None:
    """One toxic on every storage service's proxy for ``seconds``."""
    services = ("blob", "queue", "table")
    for name in services:
        proxy.toxic(name, kind, stream, **attributes)
    time.sleep(seconds)
    for name in services:
        proxy.remove(name, f"{kind}_{stream}")


def storage_view(clients: Clients, job: str) -> dict[str, Any]:
    """What storage says of a finished job: per task its status and its outputs' MD5s;
    committed attempts per task; blobs no task names; leftover markers."""
    rows = tasks.list_tasks(clients.tasks, jobs.get(clients, job).parts)
    committed = Counter(a.task for a in attempts.list_attempts(clients.tasks, jobs.get(clients, job).parts)
                        if a.outcome in COMMITTED)
    digests: dict[str, list[str]] = {}
    named: set[tuple[str, str]] = set()
    for row in rows:
        found = []
        for output in row.output_names():
            container, blob = ((clients.tiles, output.removeprefix(names.TILE_OUTPUT_PREFIX))
                               if output.startswith(names.TILE_OUTPUT_PREFIX) else (clients.products, output))
            named.add((container.container_name, blob))
            found.append(hashlib.md5(container.download_blob(blob).readall(), usedforsecurity=False).hexdigest())
        digests[row.task] = found
    keep = (names.manifest_blob(job), f"{job}/packs/", names.overview_blob(job, ""),  # the job's own, not a task's
            names.PACK_CACHE_PREFIX, names.OVERVIEW_CACHE_PREFIX)  # and the packs and overviews of cached tiles
    unnamed = [f"{c.container_name}/{b.name}" for c in (clients.tiles, clients.products)
               for b in c.list_blobs() if (c.container_name, b.name) not in named
               and not b.name.startswith(keep) and not b.name.startswith(names.MARKER_PREFIX)]
    markers = [f"{c.container_name}/{b.name}" for c in (clients.tiles, clients.sources) for b in c.list_blobs()
               if b.name.startswith(names.MARKER_PREFIX)]
    return {"rows": rows, "committed": committed, "digests": digests, "unnamed": unnamed, "markers": markers}


def run(tasks_wanted: int, workers: int, slots: int, kill_every: float, seed: int = 7,
        timeout: float = 3600, restarts: int = 2) -> dict[str, Any]:
    body, batch = request_for(tasks_wanted)
    with tempfile.TemporaryDirectory(prefix="bagpipe-chaos-") as tmp:
        home = Path(tmp)
        azurite = Azurite(home / "azurite").start()
        proxy = Toxiproxy().start()
        try:
            ports = {name: proxy.proxy(name, getattr(azurite, f"{name}_port")) for name in ("blob", "queue", "table")}
            proxied = (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
                       + "".join(f"{n.capitalize()}Endpoint=http://127.0.0.1:{p}/{ACCOUNT};" for n, p in ports.items()))
            overrides: dict[str, object] = {"tile_stage": "modis", "tile_batch": batch, "lease_seconds": 10}

            with LocalStack(home / "clean", workers, slots, connection=azurite.connection_string, namespace="clean",
                            overrides=overrides) as stack:
                clean_job, started = submit(stack, body)
                clean_s = wait(stack, clean_job, started, timeout)
                clean = storage_view(Clients(stack.settings), clean_job)

            chaos = Chaos()
            stop = threading.Event()
            with LocalStack(home / "chaos", workers, slots, connection=proxied, namespace="chaos",
                            overrides=overrides) as stack:
                direct = Clients(stack.settings.with_(storage_connection=azurite.connection_string))
                total = len(clean["rows"])

                def progress() -> float:
                    try:
                        return sum(tasks.terminal_counts(direct.tasks, jobs.get(direct, job).parts).values()) / total
                    except Exception:
                        return 0.0

                job, started = submit(stack, body)
                tormentor = threading.Thread(target=torment, args=(stack, azurite, proxy, progress, stop, chaos,
                                                                    kill_every, seed, restarts), daemon=True)
                tormentor.start()
                try:
                    chaos_s = wait(stack, job, started, timeout)
                except TimeoutError as exc:  # say where it stood: what storage holds, what was done
                    rows = tasks.list_tasks(direct.tasks, jobs.get(direct, job).parts)
                    stuck = [(r.task, r.status.value, r.attempt) for r in rows if r.status.value not in COMMITTED]
                    raise TimeoutError(f"{exc}; storage up: {azurite.process is not None}; unfinished: "
                                       f"{stuck[:10]}; job: {jobs_state(direct, job)}; {chaos}") from None
                finally:
                    stop.set()
                    tormentor.join(60)
                time.sleep(2)  # the completion email is sent as the job finishes
                emails = sum(job in str(m["Subject"]) for _, m in stack.mail.messages())
                seen = storage_view(direct, job)
        finally:
            proxy.stop()
            azurite.stop()

    statuses = Counter(r.status.value for r in seen["rows"])
    lost = (total - len(seen["rows"])) + sum(n for s, n in statuses.items() if s not in COMMITTED)
    duplicates = sum(n - 1 for n in seen["committed"].values() if n > 1)
    mismatched = sum(seen["digests"].get(k) != v for k, v in clean["digests"].items())
    return {"tasks": total, "kills": chaos.kills, "restarts": chaos.restarts, "resets": chaos.resets,
            "latency_spikes": chaos.latency_spikes, "lost": lost, "duplicates": duplicates,
            "mismatched": mismatched, "orphans": len(seen["unnamed"]) + len(seen["markers"]),
            "emails": emails, "statuses": dict(statuses), "clean_s": round(clean_s, 1),
            "chaos_s": round(chaos_s, 1), "makespan_ratio_to_clean": round(chaos_s / clean_s, 2),
            "examples": {"unnamed": seen["unnamed"][:5], "markers": seen["markers"][:5]}, "log": chaos.log}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--kill-every", type=float, default=4.0, help="seconds between worker kills")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    result = run(args.tasks, args.workers, args.slots, args.kill_every, args.seed)
    print(f"{result['tasks']} tasks: clean {result['clean_s']} s, under chaos {result['chaos_s']} s "
          f"({result['kills']} kills, {result['restarts']} storage restarts, {result['resets']} reset bursts, "
          f"{result['latency_spikes']} latency spikes)")
    print(f"lost {result['lost']}, duplicates {result['duplicates']}, mismatched {result['mismatched']}, "
          f"orphans {result['orphans']}, emails {result['emails']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

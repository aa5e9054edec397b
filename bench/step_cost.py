"""Cost of one durable step: median time per tool-call step, and bytes written per step.

Workload (the issue's): one task of S steps, each a planned tool call with a
~200-byte argument and a ~500-byte result appended to the dialog; the agent is
plain Python (no model). Stores are compared side by side in one run, as
ratios to the in-memory store, because these machines are shared and noisy.

    python bench/step_cost.py --steps 2000
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

import tether as tt
from tether.store import Checkpoint, Claim, SQLiteStore

ARG = "a" * 200
RESULT = "r" * 500


class MeasuringStore(SQLiteStore):
    """The SQLite store, noting the payload bytes of every commit."""

    commits: list[int]

    async def commit(self, claim: Claim, checkpoint: Checkpoint, keep: int, lease_until: float) -> int:
        size = len(checkpoint.head)
        size += sum(len(orjson.dumps(row.entry)) for row in checkpoint.history)
        size += sum(len(orjson.dumps(r.result)) + len(r.key) for r in checkpoint.idempotency)
        self.commits.append(size)
        return await super().commit(claim, checkpoint, keep, lease_until)


async def run_one(store: SQLiteStore, steps: int, side_effect: bool = False,
                  settings: tt.Settings | None = None) -> dict[str, Any]:
    harness = tt.Harness(store, settings=settings)
    stamps: list[float] = []

    @harness.tool(idempotent=not side_effect, side_effect=side_effect)
    async def work(ctx: tt.ToolContext, payload: str, n: int) -> dict[str, Any]:
        stamps.append(time.perf_counter())
        return {"n": n, "text": RESULT}

    @harness.agent("bench")
    class Bench(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            n = task.scratch.get("n", 0)
            if n >= steps:
                return tt.Finish({"steps": n})
            task.scratch["n"] = n + 1
            return tt.ToolCall("work", {"payload": ARG, "n": n})

    await harness.submit("bench", {})
    started = time.perf_counter()
    await harness.run_until_idle(concurrency=1)
    total = time.perf_counter() - started
    deltas = [b - a for a, b in itertools.pairwise(stamps)]
    await harness.close()
    return {"median_ms": statistics.median(deltas) * 1000, "total_s": total}


async def main(steps: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="tether-bench-"))
    strict = tt.Settings(defer_results_under=0)
    setups: dict[str, tuple[Callable[[], MeasuringStore], bool, tt.Settings | None]] = {
        "memory": (lambda: MeasuringStore(":memory:", synchronous="OFF"), False, None),
        "sqlite FULL (default)": (lambda: MeasuringStore(str(folder / "a.db"), "FULL"), False, None),
        "sqlite FULL, no deferral": (lambda: MeasuringStore(str(folder / "b.db"), "FULL"), False,
                                     strict),
        "sqlite FULL, side effect": (lambda: MeasuringStore(str(folder / "c.db"), "FULL"), True,
                                     None),
        "sqlite NORMAL": (lambda: MeasuringStore(str(folder / "d.db"), "NORMAL"), False, None),
    }
    results = {}
    for name, (make, side_effect, settings) in setups.items():
        store = make()
        store.commits = []
        results[name] = await run_one(store, steps, side_effect, settings) | {
            "commits": list(store.commits)}
    base = results["memory"]["median_ms"]
    print(f"{steps} tool-call steps in one task, 200-byte args, 500-byte results")
    print(f"{'store':24} {'median ms/step':>15} {'ratio':>7} {'total s':>8}")
    for name, r in results.items():
        print(f"{name:24} {r['median_ms']:15.3f} {r['median_ms'] / base:7.2f} {r['total_s']:8.2f}")
    for name in ("sqlite FULL (default)", "sqlite FULL, side effect"):
        commits = results[name]["commits"]
        per_step = round(len(commits) / steps)
        for step in (10, min(1000, steps - 1)):
            window = commits[step * per_step: (step + 1) * per_step]
            print(f"{name}: {per_step} commit(s)/step; payload bytes written by step {step}:"
                  f" {sum(window)}")
    db = folder / "a.db"
    print(f"database file after the run: {db.stat().st_size / 1024:.0f} KiB"
          f" ({db.stat().st_size / steps:.0f} bytes/step incl. indexes; old versions pruned)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    asyncio.run(main(parser.parse_args().steps))

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


async def run_one(store: SQLiteStore, steps: int) -> dict[str, Any]:
    harness = tt.Harness(store)
    stamps: list[float] = []

    @harness.tool(idempotent=True)
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
    setups = {
        "memory": lambda: MeasuringStore(":memory:", synchronous="OFF"),
        "sqlite FULL (default)": lambda: MeasuringStore(str(folder / "full.db"), "FULL"),
        "sqlite NORMAL": lambda: MeasuringStore(str(folder / "normal.db"), "NORMAL"),
    }
    results = {}
    for name, make in setups.items():
        store = make()
        store.commits = []
        results[name] = await run_one(store, steps) | {"commits": list(store.commits)}
    base = results["memory"]["median_ms"]
    print(f"{steps} tool-call steps in one task, 200-byte args, 500-byte results")
    print(f"{'store':24} {'median ms/step':>15} {'ratio':>7} {'total s':>8}")
    for name, r in results.items():
        print(f"{name:24} {r['median_ms']:15.3f} {r['median_ms'] / base:7.2f} {r['total_s']:8.2f}")
    commits = results["sqlite FULL (default)"]["commits"]
    # commit 0 is the first resume point; each step is a resume point + a result commit.
    for step in (10, min(1000, steps - 1)):
        per_step = commits[2 * step - 1] + commits[2 * step]
        print(f"payload bytes written by step {step}: {per_step}")
    db = folder / "full.db"
    print(f"database file after the run: {db.stat().st_size / 1024:.0f} KiB"
          f" ({db.stat().st_size / steps:.0f} bytes/step incl. indexes; old versions pruned)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    asyncio.run(main(parser.parse_args().steps))

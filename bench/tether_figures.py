"""Figures 3-6 of issue 7, which only tether has to show: recovery of many interrupted
tasks, P0 preemption latency, event ingestion with coalescing, memory per idle task.

Each figure runs in its own process on a SQLite file with the default settings
(synchronous=FULL), and prints one JSON line:

    python bench/tether_figures.py interrupt FOLDER N     # a child: N tasks in flight, then killed
    python bench/tether_figures.py recover FOLDER N       # time to recover them
    python bench/tether_figures.py preempt FOLDER TRIALS
    python bench/tether_figures.py ingest FOLDER EVENTS
    python bench/tether_figures.py idle FOLDER TASKS
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from workload import ARG, RESULT

import tether as tt
from tether.model import new_id
from tether.store import Checkpoint, Claim, SQLiteStore, StoredEvent

LEASE = 1.0
"""Seconds; short, so that the recovering process does not wait long for a dead lease."""


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/status has no VmRSS line")


# ---------------------------------------------------------------------------- figure 3


def interrupted_app(db: Path, recovering: bool, calls: list[float]) -> tt.Harness:
    """Tasks that take three quick steps and then sit in a long idempotent call; in the
    recovering process that call returns at once."""
    harness = tt.Harness(f"sqlite:///{db}", settings=tt.Settings(lease_seconds=LEASE,
                                                                 poll_interval=0.05))

    @harness.tool()
    async def work(ctx: tt.ToolContext, payload: str, n: int) -> str:
        return RESULT

    @harness.tool()
    async def long_call(ctx: tt.ToolContext, payload: str) -> str:
        calls.append(time.perf_counter())
        if not recovering:
            await asyncio.sleep(3600)
        return RESULT

    @harness.agent("three-then-long")
    class ThreeThenLong(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if task.step < 3:
                return tt.ToolCall("work", {"payload": ARG, "n": task.step})
            if task.step == 3:
                return tt.ToolCall("long_call", {"payload": ARG})
            return tt.Finish(task.step)

    return harness


async def interrupt(folder: Path, tasks: int) -> None:
    """Run *tasks* tasks into their long call, say READY, and wait to be SIGKILLed."""
    calls: list[float] = []
    harness = interrupted_app(folder / "recover.db", False, calls)
    for _ in range(tasks):
        await harness.submit("three-then-long")
    serving = asyncio.create_task(harness.serve(concurrency=tasks))
    while len(calls) < tasks:
        await asyncio.sleep(0.01)
    print("READY", flush=True)
    await serving


async def recover(folder: Path, tasks: int) -> dict[str, Any]:
    """Open the store of the killed process and time until every task is back in its call
    (claimed, loaded, resume point committed) and until every one has finished."""
    calls: list[float] = []
    started = time.perf_counter()
    harness = interrupted_app(folder / "recover.db", True, calls)
    await harness.run_until_idle(concurrency=64)
    finished = time.perf_counter()
    counts = await harness.store.count_by_status()
    await harness.close()
    if len(calls) != tasks or counts != {"completed": tasks}:
        raise SystemExit(f"recovery incomplete: {len(calls)} calls re-run, statuses {counts}")
    return {"tasks": tasks, "all_back_in_call_s": max(calls) - started,
            "all_finished_s": finished - started}


# ---------------------------------------------------------------------------- figure 4


class PauseWatchingStore(SQLiteStore):
    """The SQLite store, noting when a commit that leaves a task paused has returned (the
    runner commits with ``commit_reading``)."""

    paused: dict[str, float]
    waiters: dict[str, asyncio.Event]

    async def commit_reading(self, claim: Claim, checkpoint: Checkpoint, keep: int,
                             lease_until: float) -> tuple[int, list[StoredEvent] | None]:
        written = await super().commit_reading(claim, checkpoint, keep, lease_until)
        if checkpoint.status is tt.Status.PAUSED:
            self.paused[claim.task_id] = time.perf_counter()
            self.waiters[claim.task_id].set()
        return written


async def preempt(folder: Path, trials: int) -> dict[str, Any]:
    """Per trial: a task is inside an interruptible call; a P0 ``user_interrupt`` is
    emitted; timed until the call is cancelled and the paused checkpoint is committed."""
    store = PauseWatchingStore(str(folder / "preempt.db"))
    store.paused, store.waiters = {}, {}
    harness = tt.Harness(store)
    in_call: dict[str, asyncio.Event] = {}

    @harness.tool(interruptible=True)
    async def think(ctx: tt.ToolContext, payload: str) -> str:
        in_call[ctx.task_id].set()
        await asyncio.sleep(3600)
        return RESULT

    @harness.agent("thinker")
    class Thinker(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.ToolCall("think", {"payload": ARG})

    serving = asyncio.create_task(harness.serve(concurrency=4))
    latencies = []
    for _ in range(trials):
        task_id = new_id()
        in_call[task_id], store.waiters[task_id] = asyncio.Event(), asyncio.Event()
        await harness.submit("thinker", task_id=task_id)
        await in_call[task_id].wait()
        emitted = time.perf_counter()
        await harness.emit(tt.Event("user_interrupt", task_id))
        await asyncio.wait_for(store.waiters[task_id].wait(), 10)
        latencies.append(store.paused[task_id] - emitted)
    serving.cancel()
    await harness.close()
    return {"trials": trials, "p50_ms": statistics.median(latencies) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000, "max_ms": max(latencies) * 1000}


# ---------------------------------------------------------------------------- figure 5


async def ingest(folder: Path, events: int) -> dict[str, Any]:
    """Events sent one after another into one waiting task's inbox, each stored durably
    before the next is sent: coalescing progress reports (P3), then distinct messages (P1)."""
    harness = tt.Harness(f"sqlite:///{folder / 'ingest.db'}")

    @harness.agent("listener")
    class Listener(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.Wait("approval")

    results: dict[str, Any] = {"events": events}
    for kind, event_type in (("coalescing", "progress"), ("distinct", "user_message")):
        task_id = await harness.submit("listener")
        await harness.run_until_idle()
        started = time.perf_counter()
        for n in range(events):
            await harness.emit(tt.Event(event_type, task_id, {"done": n},
                                        source_event_id=f"{kind}-{n}"))
        elapsed = time.perf_counter() - started
        pending = await harness.store.pending_events(task_id)
        results[kind] = {"events_per_s": events / elapsed, "pending_after": len(pending)}
    await harness.close()
    return results


# ---------------------------------------------------------------------------- figure 6


async def idle(folder: Path, tasks: int) -> dict[str, Any]:
    """Memory this process holds per task parked waiting for an approval."""
    harness = tt.Harness(f"sqlite:///{folder / 'idle.db'}")

    @harness.agent("approve")
    class Approve(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.Wait("approval") if task.last_event is None else tt.Finish(1)

    await harness.submit("approve")
    await harness.run_until_idle(concurrency=32)  # warm: every code path loaded once
    gc.collect()
    tracemalloc.start()
    before_rss, before_heap = rss_kib(), tracemalloc.get_traced_memory()[0]
    for _ in range(tasks):
        await harness.submit("approve")
    await harness.run_until_idle(concurrency=32)
    gc.collect()
    after_rss, after_heap = rss_kib(), tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    waiting = (await harness.store.count_by_status()).get("waiting", 0)
    await harness.close()
    if waiting != tasks + 1:
        raise SystemExit(f"{waiting} tasks waiting, expected {tasks + 1}")
    return {"tasks": tasks, "rss_before_mib": before_rss / 1024, "rss_after_mib": after_rss / 1024,
            "heap_bytes_per_task": (after_heap - before_heap) / tasks,
            "rss_bytes_per_task": (after_rss - before_rss) * 1024 / tasks}


FIGURES = {"interrupt": interrupt, "recover": recover, "preempt": preempt, "ingest": ingest,
           "idle": idle}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("figure", choices=FIGURES)
    parser.add_argument("folder", type=Path)
    parser.add_argument("n", type=int)
    args = parser.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(FIGURES[args.figure](args.folder, args.n))
    if result is not None:
        print(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # nothing left to tidy: the figures are printed


if __name__ == "__main__":
    main()

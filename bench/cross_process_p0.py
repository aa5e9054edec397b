"""A P0 from another process: how long until the running task is paused and committed (issue 15).

A ``tether worker`` process (default settings) runs one task at a time inside an
interruptible tool that would take a minute. This process, on the same store, emits a
``user_interrupt`` (P0) and watches the store until the task's status is ``paused``: the
time from the emit returning (the event is durable) to the pause being committed. Then it
resumes the task for the next trial. Also reported: the CPU the worker process used while
idle (no task) and while holding a running task, per second of wall time.

    python bench/cross_process_p0.py --store sqlite --trials 20
    python bench/cross_process_p0.py --store postgres --pg postgresql://postgres@127.0.0.1/test

``--json`` prints the figures as one JSON line instead (``compare.py`` reads it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from systems import fresh_database

import tether as tt

HERE = Path(__file__).resolve().parent
SETTLE = 1.0
"""Seconds the worker is left alone before its CPU is measured."""


def build(store: str) -> tt.Harness:
    """The app the worker loads (``--app cross_process_p0:build``)."""
    h = tt.Harness(store)

    @h.tool(interruptible=True)
    async def think(ctx: tt.ToolContext, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "done"

    @h.agent("long")
    class Long(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.ToolCall("think", {"seconds": 60.0})

    return h


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _cpu_per_second(pid: int, seconds: float) -> float:
    before = _cpu_seconds(pid)
    await asyncio.sleep(seconds)
    return (_cpu_seconds(pid) - before) / seconds


async def _until(check: object, what: str, timeout: float = 10.0) -> float:
    started = time.perf_counter()
    while not await check():  # type: ignore[operator]
        if time.perf_counter() - started > timeout:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.0005)
    return time.perf_counter()


async def measure(url: str, trials: int, cpu_seconds: float) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent / "src")])}
    worker = subprocess.Popen(
        [sys.executable, "-m", "tether", "--store", url, "--app", "cross_process_p0:build",
         "worker"], env=env, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    h = build(url)
    try:
        await asyncio.sleep(SETTLE)
        idle_cpu = await _cpu_per_second(worker.pid, cpu_seconds)
        task_id = await h.submit("long")

        async def in_the_tool() -> bool:
            info = await h.get(task_id)
            return info.snapshot.call is not None and info.snapshot.call.status == "started" \
                and info.record.status is tt.Status.RUNNING

        async def paused() -> bool:
            return (await h.reads.task(task_id)).status is tt.Status.PAUSED

        await _until(in_the_tool, "the task to enter its tool")
        busy_cpu = await _cpu_per_second(worker.pid, cpu_seconds)
        latencies = []
        for _ in range(trials):
            await _until(in_the_tool, "the task to enter its tool")
            await h.emit(tt.Event("user_interrupt", task_id, {"text": "stop"}, priority=0))
            sent = time.perf_counter()
            latencies.append((await _until(paused, "the pause") - sent) * 1e3)
            await h.resume(task_id)
        latencies.sort()
        return {"trials": trials, "p50_ms": statistics.median(latencies),
                "p90_ms": latencies[int(0.9 * (len(latencies) - 1))],
                "p99_ms": latencies[int(0.99 * (len(latencies) - 1))], "max_ms": latencies[-1],
                "idle_cpu_per_s": idle_cpu, "busy_cpu_per_s": busy_cpu}
    finally:
        worker.terminate()
        try:
            worker.wait(10)
        except subprocess.TimeoutExpired:
            worker.kill()
        await h.close()


async def _migrate(url: str) -> None:
    async with tt.Harness(url) as h:
        await h.store.migrate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--cpu-seconds", type=float, default=3.0)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tether-p0-") as folder:
        if args.store == "sqlite":
            found = asyncio.run(measure(f"sqlite:///{Path(folder) / 'tether.db'}", args.trials,
                                        args.cpu_seconds))
        else:
            with fresh_database(args.pg) as url:
                asyncio.run(_migrate(url))
                found = asyncio.run(measure(url, args.trials, args.cpu_seconds))
    if args.json:
        print(json.dumps({"store": args.store, **found}))
        return
    print(f"{args.store}: P0 from another process until paused and committed, {found['trials']}"
          f" trials: p50 {found['p50_ms']:.1f} ms, p90 {found['p90_ms']:.1f} ms,"
          f" p99 {found['p99_ms']:.1f} ms, max {found['max_ms']:.1f} ms; worker CPU idle"
          f" {found['idle_cpu_per_s'] * 1e3:.1f} ms/s, holding a running task"
          f" {found['busy_cpu_per_s'] * 1e3:.1f} ms/s")


if __name__ == "__main__":
    main()

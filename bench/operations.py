"""Operating figures with real ``tether worker`` processes (E5, E7).

1. Drain: a worker runs 100 tasks at once, each inside a side-effecting call of
   ``--call-seconds``; SIGTERM is sent; measured: time until the process exits 0, and
   that every call finished once and every task was released (no lease left).
2. Idle memory: a worker parks ``--waiting`` tasks (each waiting for an approval) and
   reports its own RSS before any task, after parking them all, and after every one of
   them was approved and finished.

    python bench/operations.py --waiting 10000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tether as tt

APP = Path(__file__).resolve()


def build(store: str) -> tt.Harness:
    """The app both the parent and the worker processes load (``--app operations:build``
    calls it with the store URL; the parent passes the file's path)."""
    db = store.removeprefix("sqlite:///")
    h = tt.Harness(f"sqlite:///{db}", settings=tt.Settings(
        sqlite_synchronous="NORMAL", poll_interval=0.02, lease_seconds=5))
    seconds = float(os.environ.get("BENCH_CALL_SECONDS", "1"))
    ledger = db + ".ledger"

    @h.tool(side_effect=True)
    async def pay(ctx: tt.ToolContext, n: int) -> int:
        record(ledger, "started", ctx.idempotency_key)
        await asyncio.sleep(seconds)
        record(ledger, "paid", ctx.idempotency_key)
        return n

    @h.agent("payer")
    class Payer(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.ToolCall("pay", {"n": 1}) if t.step == 0 else tt.Finish(t.last_tool_result)

    @h.agent("approve")
    class Approve(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Wait("approval") if t.last_event is None else tt.Finish(1)

    return h


def record(ledger: str, table: str, key: str) -> None:
    with sqlite3.connect(ledger, timeout=30) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (key TEXT, at REAL)")
        conn.execute(f"INSERT INTO {table} VALUES (?, ?)", (key, time.time()))


def started_calls(ledger: Path) -> int:
    if not ledger.exists():
        return 0
    with sqlite3.connect(ledger, timeout=30) as conn:
        try:
            return int(conn.execute("SELECT COUNT(*) FROM started").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


def worker(db: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tether", "--store", f"sqlite:///{db}", "--app", "operations:build",
         "worker", *args], env={**os.environ, "PYTHONPATH": str(APP.parent), **(env or {})},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


async def counts(db: str) -> dict[str, int]:
    async with build(db) as h:
        return await h.store.count_by_status()


async def submit(db: str, agent: str, n: int) -> None:
    async with build(db) as h:
        for _ in range(n):
            await h.submit(agent)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def drain(tmp: Path, tasks: int, call_seconds: float) -> dict[str, Any]:
    db = str(tmp / "drain.db")
    asyncio.run(submit(db, "payer", tasks))
    env = {"BENCH_CALL_SECONDS": str(call_seconds)}
    proc = worker(db, "--concurrency", str(tasks), "--drain-timeout", "60", env=env)
    ledger = Path(db + ".ledger")
    while started_calls(ledger) < tasks:  # every task inside its side-effecting call
        if proc.poll() is not None:
            raise SystemExit(f"the worker exited early: {proc.communicate()[1][-2000:]}")
        time.sleep(0.01)
    started = time.time()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    exited = time.time()
    with sqlite3.connect(ledger) as conn:
        paid = conn.execute("SELECT COUNT(*), COUNT(DISTINCT key), MAX(at) FROM paid").fetchone()
    with sqlite3.connect(db) as conn:
        leased = conn.execute("SELECT COUNT(*) FROM tasks WHERE lease_owner IS NOT NULL").fetchone()[0]
    return {"exit": code, "seconds": exited - started, "after_last_call": exited - paid[2],
            "paid": paid[0], "distinct": paid[1],
            "leased_after": leased, "statuses": asyncio.run(counts(db))}


def idle_memory(tmp: Path, waiting: int) -> dict[str, Any]:
    db = str(tmp / "idle.db")
    proc = worker(db, "--concurrency", "32")
    time.sleep(1.5)
    before = rss_kib(proc.pid)
    asyncio.run(submit(db, "approve", waiting))
    while asyncio.run(counts(db)).get("waiting", 0) < waiting:
        time.sleep(0.5)
    parked = rss_kib(proc.pid)

    async def approve_all() -> None:
        async with build(db) as h:
            for record in await h.store.list_tasks(tt.Status.WAITING, limit=waiting):
                await h.emit(tt.Event("approval", record.task_id, {"ok": True}))

    asyncio.run(approve_all())
    while asyncio.run(counts(db)).get("completed", 0) < waiting:
        time.sleep(0.5)
    done = rss_kib(proc.pid)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    return {"before_kib": before, "parked_kib": parked, "after_kib": done}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100, help="tasks in flight when draining")
    parser.add_argument("--call-seconds", type=float, default=5.0)
    parser.add_argument("--waiting", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        result = drain(tmp, args.tasks, args.call_seconds)
        print(f"drain: {args.tasks} tasks each in a {args.call_seconds}s side-effecting call;"
              f" SIGTERM -> exit {result['exit']} after {result['seconds']:.2f}s"
              f" ({result['after_last_call']:.2f}s after the last call returned);"
              f" calls paid {result['paid']} ({result['distinct']} distinct keys);"
              f" tasks still leased {result['leased_after']}; statuses {result['statuses']}")
        memory = idle_memory(tmp, args.waiting)
        print(f"idle memory: worker RSS {memory['before_kib'] / 1024:.1f} MiB before,"
              f" {memory['parked_kib'] / 1024:.1f} MiB with {args.waiting} tasks waiting,"
              f" {memory['after_kib'] / 1024:.1f} MiB after all of them resumed and finished")


if __name__ == "__main__":
    main()

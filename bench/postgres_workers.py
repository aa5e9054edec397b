"""Many workers on PostgreSQL (issue 4): throughput, takeover after a kill, Redis hit rate.

1. Throughput: T tasks of S steps (each a quick tool call plus its checkpoint), run by 1, 2
   and 4 ``tether worker`` processes on one PostgreSQL database: tasks x steps per second.
2. Takeover: a worker holding tasks is SIGKILLed; time until another worker has claimed
   every one of them (bounded below by the lease, ``--lease`` seconds).
3. Cache: 1,000 tasks that wait for an approval, on PostgreSQL with the Redis head cache,
   run in this process; the share of head loads served from Redis.

    python bench/postgres_workers.py --pg postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg

import tether as tt

HERE = Path(__file__).resolve().parent


def build(store: str) -> tt.Harness:
    """The app the worker processes load (``--app postgres_workers:build``)."""
    lease = float(os.environ.get("BENCH_LEASE", "5"))
    h = tt.Harness(store, settings=tt.Settings(lease_seconds=lease, poll_interval=0.05))
    steps = int(os.environ.get("BENCH_STEPS", "10"))
    pause = float(os.environ.get("BENCH_TOOL_SECONDS", "0"))

    @h.tool(idempotent=True)
    async def work(ctx: tt.ToolContext, n: int, blob: str) -> str:
        if pause:
            await asyncio.sleep(pause)
        return "r" * 500

    @h.agent("stepper")
    class Stepper(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.step >= steps:
                return tt.Finish(t.step)
            return tt.ToolCall("work", {"n": t.step, "blob": "a" * 200})

    @h.agent("approve")
    class Approve(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Wait("approval") if t.last_event is None else tt.Finish(1)

    return h


def fresh_database(admin: str) -> str:
    name = f"tether_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{admin.rpartition('/')[0]}/{name}"


def drop_database(admin: str, url: str) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.rpartition("/")[2]}" WITH (FORCE)')


def statuses(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT status, COUNT(*) FROM tasks GROUP BY status").fetchall())


def start_workers(url: str, n: int, env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(
        [sys.executable, "-m", "tether", "--store", url, "--app", "postgres_workers:build",
         "worker", "--concurrency", "8"],
        env={**os.environ, "PYTHONPATH": str(HERE), **env},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=60)


async def submit(url: str, agent: str, n: int) -> None:
    async with build(url) as h:
        for _ in range(n):
            await h.submit(agent)


def throughput(admin: str, workers: int, tasks: int, steps: int) -> float:
    url = fresh_database(admin)
    try:
        asyncio.run(submit(url, "stepper", tasks))
        started = time.perf_counter()
        procs = start_workers(url, workers, {"BENCH_STEPS": str(steps)})
        while statuses(url).get("completed", 0) < tasks:
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        stop(procs)
        return tasks * steps / elapsed
    finally:
        drop_database(admin, url)


def takeover(admin: str, lease: float) -> tuple[float, int]:
    url = fresh_database(admin)
    env = {"BENCH_STEPS": "1000", "BENCH_TOOL_SECONDS": "0.01", "BENCH_LEASE": str(lease)}
    try:
        asyncio.run(submit(url, "stepper", 8))
        victim = start_workers(url, 1, env)[0]
        while statuses(url).get("running", 0) < 8:
            time.sleep(0.02)
        time.sleep(0.5)
        with psycopg.connect(url) as conn:
            held = [r[0] for r in conn.execute("SELECT task_id FROM tasks WHERE lease_owner IS NOT NULL")]
        rescuer = start_workers(url, 1, env)
        time.sleep(1.0)  # the rescuer is up and idle-polling before the kill
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        killed = time.perf_counter()
        while True:
            with psycopg.connect(url) as conn:
                crashed = conn.execute("SELECT COUNT(*) FROM tasks WHERE task_id = ANY(%s)"
                                       " AND crashes > 0", (held,)).fetchone()[0]
            if crashed == len(held):
                break
            time.sleep(0.005)
        took = time.perf_counter() - killed
        stop(rescuer)
        return took, len(held)
    finally:
        drop_database(admin, url)


async def cache_hit_rate(admin: str, redis: str, tasks: int) -> tuple[int, int]:
    from tether.store.redis_cache import CachedStore  # the redis extra: only this figure

    url = fresh_database(admin)
    try:
        h = build(url)
        h._cache_arg = redis
        for _ in range(tasks):
            await h.submit("approve")
        await h.run_until_idle(concurrency=16, timeout=600)
        for record in await h.store.list_tasks(tt.Status.WAITING, limit=tasks):
            await h.emit(tt.Event("approval", record.task_id))
        await h.run_until_idle(concurrency=16, timeout=600)
        store = h.store
        assert isinstance(store, CachedStore)
        assert await store.count_by_status() == {"completed": tasks}
        hits, misses = store.hits, store.misses
        await h.close()
        return hits, misses
    finally:
        drop_database(admin, url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lease", type=float, default=5.0)
    args = parser.parse_args()
    for workers in (1, 2, 4):
        rate = throughput(args.pg, workers, args.tasks, args.steps)
        print(f"throughput: {workers} worker(s), {args.tasks} tasks x {args.steps} steps:"
              f" {rate:.0f} tasks x steps / s", flush=True)
    took, held = takeover(args.pg, args.lease)
    print(f"takeover: {held} tasks of a SIGKILLed worker all claimed by another {took:.2f}s"
          f" after the kill (lease {args.lease}s)", flush=True)
    hits, misses = asyncio.run(cache_hit_rate(args.pg, args.redis, 1000))
    print(f"cache: 1,000 tasks (submit, wait, approval, finish): {hits} head loads from Redis,"
          f" {misses} from PostgreSQL; hit rate {hits / max(1, hits + misses):.1%}")


if __name__ == "__main__":
    main()

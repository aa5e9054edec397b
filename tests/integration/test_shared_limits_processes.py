"""R13 (issue 19): named limits hold across worker processes. Four `tether worker`
processes share one store (SQLite, then PostgreSQL) and a fake provider that records, across
processes, each call's start and end and the admission time its limit counted it at. The
most calls in flight never pass the concurrency limit, no window holds more admissions than
the rate allows, and every task finishes (nothing starves)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import tether as tt

APP = '''
import asyncio
import fcntl
import asyncio
import json
import os
import time

import tether as tt

harness = tt.Harness(settings=tt.Settings(poll_interval=0.05))
harness.limit("provider", concurrency=3)
harness.limit("search", per_second=5)


def record(entry: dict) -> None:
    with open(os.environ["PROVIDER_LOG"], "a") as log:
        fcntl.flock(log, fcntl.LOCK_EX)
        log.write(json.dumps(entry) + "\\n")


@harness.tool(limits=("provider",))
async def complete(ctx: tt.ToolContext, n: int) -> int:
    start = time.time()
    await asyncio.sleep(0.05)
    record({"limit": "provider", "start": start, "end": time.time(), "pid": os.getpid()})
    return n


@harness.tool(limits=("search",))
async def search(ctx: tt.ToolContext, n: int) -> int:
    record({"limit": "search", "admitted": ctx.admitted_at, "start": time.time(),
            "pid": os.getpid()})
    return n


@harness.agent("worker_task")
class WorkerTask(tt.Agent):
    async def plan(self, t):
        done = t.scratch.setdefault("done", [])
        for tool in ("complete", "search"):
            if tool not in done:
                done.append(tool)
                return tt.ToolCall(tool, {"n": t.input["n"]})
        return tt.Finish(t.input["n"])
'''
TASKS = 24


def most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    best = now = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def densest_window(times: list[float], seconds: float) -> int:
    times = sorted(times)
    return max(sum(1 for other in times[i:] if other - at < seconds)
               for i, at in enumerate(times))


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'limits.db'}"


def test_limits_hold_across_worker_processes_and_nothing_starves(
        store_url: str, tmp_path: Path) -> None:
    name = f"limitapp_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(APP)
    log = tmp_path / "provider.jsonl"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PROVIDER_LOG": str(log),
           "TETHER_STORE": store_url, "TETHER_APP": f"{name}:harness"}
    tether = [sys.executable, "-m", "tether"]
    ids = []
    for n in range(TASKS):
        made = subprocess.run([*tether, "submit", "worker_task", "--input", json.dumps({"n": n})],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        ids.append(made.stdout.strip())
    workers = [subprocess.Popen([*tether, "worker", "--concurrency", "4", "--until-idle"],
                                env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for worker in workers:
        _, err = worker.communicate(timeout=240)
        assert worker.returncode == 0, err
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    provider = [(e["start"], e["end"]) for e in entries if e["limit"] == "provider"]
    search = [e for e in entries if e["limit"] == "search"]
    assert len(provider) == TASKS and len(search) == TASKS
    assert most_at_once(provider) <= 3
    assert densest_window([e["admitted"] for e in search], 1.0) <= 5

    async def statuses() -> list[tt.Status]:
        async with tt.Harness(store_url) as h:
            return [(await h.store.get_task(task_id)).status for task_id in ids]

    assert set(asyncio.run(statuses())) == {tt.Status.COMPLETED}

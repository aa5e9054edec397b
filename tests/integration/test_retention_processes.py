"""R13, R20 (issue 19): retention with several workers. Three `tether worker` processes share
a store (SQLite, then PostgreSQL) with retention on: they run 60 tasks, each keeping a large
value apart (R20), and their housekeeping rounds (deleting finished tasks every 0.2 s, and
every tenth round collecting large values, on PostgreSQL under its lock on snapshots while
the others commit) run side by side: every finished task is deleted and no worker fails.
(Values younger than a minute are left by design, so none is collected this soon.)"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import tether as tt

APP = '''
import tether as tt

harness = tt.Harness(settings=tt.Settings(
    poll_interval=0.05, retain_completed=0.0, housekeeping_interval=0.2, blob_threshold=1024))


@harness.tool()
async def fetch(ctx: tt.ToolContext, n: int) -> str:
    return f"{n}:" + "x" * 5000


@harness.agent("fetcher")
class Fetcher(tt.Agent):
    async def plan(self, t):
        if t.last_tool_result is None:
            return tt.ToolCall("fetch", {"n": t.input})
        return tt.Finish(len(t.last_tool_result))
'''
TASKS = 60


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'retention.db'}"


def test_workers_delete_finished_tasks_side_by_side(store_url: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"retainapp_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(name)
    harness: tt.Harness = module.harness
    harness.use_store(store_url)

    async def submit() -> list[str]:
        return [await harness.submit("fetcher", n) for n in range(TASKS)]

    ids = asyncio.run(submit())
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TETHER_STORE": store_url,
           "TETHER_APP": f"{name}:harness"}
    workers = [subprocess.Popen([sys.executable, "-m", "tether", "worker"], env=env,
                                cwd=tmp_path, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True) for _ in range(3)]

    async def left() -> list[str]:
        return [t.task_id for t in await harness.store.list_tasks(limit=1000)]

    try:
        deadline = time.monotonic() + 120
        while asyncio.run(left()) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        errors = [worker.communicate(timeout=60)[1] for worker in workers]
    assert asyncio.run(left()) == [], "finished tasks were not all deleted"
    failed = [err for err in errors if "Traceback" in err]
    assert not failed, "a worker logged a traceback:\n" + "\n----\n".join(failed)

    async def gone(task_id: str) -> bool:
        try:
            await harness.get(task_id)
        except tt.TaskNotFound:
            return True
        return False

    assert all(asyncio.run(gone(task_id)) for task_id in ids[:5])

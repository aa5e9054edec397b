"""R3, E1, R13: a P0 stored by another process preempts a running task at once.

A ``tether worker`` child process runs a task inside an interruptible tool that would take
ten minutes. The test process, on the same store, emits a ``user_interrupt`` (P0). The
worker's own polls are slowed to 30 s (``_interrupt_app``), so the pause can only come
through the store's change signal (SQLite: the newest rows, looked at every few
milliseconds while the worker runs tasks; PostgreSQL: NOTIFY). The test waits for the
pause with a 10 s budget; how fast it is, ``bench/cross_process_p0.py`` measures.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import tether as tt

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tether.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def worker(store_url: str) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT / "src")])}
    child = subprocess.Popen(
        [sys.executable, "-m", "tether", "--store", store_url, "--app", "_interrupt_app:build",
         "worker"], env=env, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    yield child
    child.terminate()
    try:
        child.wait(15)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


async def _until(check: object, what: str, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    while not await check():  # type: ignore[operator]
        assert loop.time() < give_up, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.01)


async def test_r03_e1_a_p0_from_another_process_pauses_the_running_task(
        store_url: str, worker: subprocess.Popen[bytes]) -> None:
    """R3, E1: the interrupt is stored here; the worker in the other process cuts its tool
    and commits the pause, long before any of its own polls would have looked."""
    sys.path.insert(0, str(HERE))
    from _interrupt_app import build

    h = build(store_url)
    await h.store.migrate()
    task_id = await h.submit("long")

    async def in_its_tool() -> bool:
        info = await h.get(task_id)
        call = info.snapshot.call
        return info.record.status is tt.Status.RUNNING and call is not None \
            and call.status == "started"

    async def paused() -> bool:
        return (await h.reads.task(task_id)).status is tt.Status.PAUSED

    await _until(in_its_tool, "the worker to start the task's tool", 30)
    await h.emit(tt.Event("user_interrupt", task_id, {"text": "stop, wrong customer"},
                          priority=0))
    await _until(paused, "the worker to pause the task", 10)

    info = await h.get(task_id)
    assert info.snapshot.result is None, "the tool ran to its end instead of being cut"
    history = await h.history(task_id)
    assert any(row.get("type") == "user_interrupt" for row in history)
    assert "pause" in [r["resume_strategy"] for r in await h.reads.recovery_log(task_id)]
    assert worker.poll() is None, worker.stderr.read().decode() if worker.stderr else ""
    await h.close()

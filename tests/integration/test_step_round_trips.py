"""A step's write and the next step's read of the inbox share one round trip (issue 30, R5,
R13): the runner takes the pending events its commit read right after writing, and reads
the inbox itself only when something was stored for the task since (its wake), so a native
step on PostgreSQL is one call to the server. What arrives meanwhile is never lost: it is
read at the next tick, and no call starts before it (the resume point checks the inbox)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import pytest

import tether as tt
from tether.engine.runner import Runner

STEPS = 20


def counting(store: Any, names: tuple[str, ...],
             when: Callable[[], bool] = lambda: True) -> Counter[str]:
    """Count calls of the store's *names* made while *when* holds (instance attributes wrap
    the bound methods)."""
    seen: Counter[str] = Counter()
    for name in names:
        method = getattr(store, name)

        async def counted(*args: Any, _method: Any = method, _name: str = name,
                          **kwargs: Any) -> Any:
            if when():
                seen[_name] += 1
            return await _method(*args, **kwargs)

        setattr(store, name, counted)
    return seen


def stepper(url: str, seen: list[str], inject: Any = None) -> tt.Harness:
    h = tt.Harness(url, settings=tt.Settings(lease_seconds=5))

    @h.tool(idempotent=True)
    async def look(ctx: tt.ToolContext, n: int) -> int:
        if inject is not None and n == 5:
            await inject()
        return n

    @h.agent("stepper")
    class Stepper(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            said = [row["content"] for row in task.history if row.get("role") == "user"]
            seen.append(f"{task.step}:{len(said)}")
            return tt.ToolCall("look", {"n": task.step}) if task.step < STEPS else \
                tt.Finish(said)

    return h


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 't.db'}"
    return str(request.getfixturevalue("pg_url"))


async def test_r13_a_step_on_postgres_reads_its_inbox_in_the_round_trip_of_its_commit(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's own reads of the inbox (its ticks; the worker's watcher also reads when
    the server says something changed, in a task of its own, which is not counted) are two
    in all, not one a step. (SQLite reads its file in-process: its commit_reading is the
    commit, and the tick reads.)"""
    ticking: ContextVar[bool] = ContextVar("ticking", default=False)
    tick = Runner.tick

    async def watched_tick(runner: Runner) -> None:
        token = ticking.set(True)  # seen only in the runner's own task, not the watcher's
        try:
            await tick(runner)
        finally:
            ticking.reset(token)

    monkeypatch.setattr(Runner, "tick", watched_tick)
    seen: list[str] = []
    async with stepper(pg_url, seen) as h:
        task = await h.submit("stepper")
        calls = counting(h.store, ("commit", "commit_reading"))
        reads = counting(h.store, ("pending_events",), when=ticking.get)
        await h.run_until_idle(timeout=30)
        assert (await h.get(task)).record.status is tt.Status.COMPLETED
    assert calls["commit_reading"] >= STEPS and calls["commit"] == 0
    # the first tick after the claim, and the one after the last plan (a native agent's
    # Finish is not committed before it is carried out): not one a step
    assert reads["pending_events"] <= 2, reads


async def test_r05_a_message_stored_by_another_process_mid_step_is_still_read(
        url: str) -> None:
    """A message stored through a second harness (no notification reaches this worker's
    runner) while call 5 runs: the commit of call 5 reads it, and the next plan sees it."""
    seen: list[str] = []
    other = tt.Harness(url)
    task_id: list[str] = []

    async def inject() -> None:
        if not task_id[1:]:
            task_id.append("sent")
            await other.emit(tt.Event("user_message", task_id[0], "hello"))

    async with stepper(url, seen, inject) as h, other:
        task_id.append(await h.submit("stepper"))
        await asyncio.wait_for(h.run_until_idle(timeout=30), 40)
        info = await h.get(task_id[0])
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == ["hello"]
    heard = next(int(s.split(":")[0]) for s in seen if s.endswith(":1"))
    assert heard == 6  # the plan right after the call during which it arrived

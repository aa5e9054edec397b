"""R12, R14, R22, R26, E6 (issue 13, part 4): every failure is parked with its real reason.

- An error in a task's very first step parks it in needs_human with that error (not a
  transition error, lease expiries and "the worker died").
- A damaged head whose JSON still parses is damage: the task falls back to its last good
  version with a recovery-log entry, instead of being left alone as "written by newer code".
- A rollback into a timed wait whose timer already fired re-arms the wait: the task times out
  again instead of waiting forever while workers claim it over and over.
- A runaway agent stops at ``max_steps``; a huge tool result is refused by name.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import pytest
from _support import fast_settings, run_until_status, strategies

import tether as tt


@pytest.mark.parametrize(("mistake", "named"), [
    ("spawn", "'ghost'"),
    ("scratch", "not JSON"),
])
async def test_r26_an_error_in_the_first_step_parks_the_task_with_that_error(
        db_url: str, mistake: str, named: str) -> None:
    """R26: the very first step fails (it spawns an agent nobody registered, or leaves an
    object that is not plain data in its scratch): the task is in needs_human at once, with a
    reason naming the error, and no recovery was counted for a dead worker."""
    h = tt.Harness(db_url, settings=fast_settings(lease_seconds=30))

    @h.agent("first")
    class First(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if mistake == "spawn":
                return tt.Spawn("ghost")
            task.scratch["client"] = object()
            return tt.Reply("hello")

    tid = await h.submit("first")
    await h.run_until_idle(timeout=10)
    record = (await h.get(tid)).record
    assert record.status is tt.Status.NEEDS_HUMAN
    assert named in (record.reason or ""), record.reason
    assert "died" not in (record.reason or "")
    assert record.lease_owner is None or record.lease_until is None \
        or record.lease_until <= record.updated_at + 1  # released, not left to expire
    await h.close()


def _damage_newest_head(path: Path, tid: str, edit: str) -> int:
    with sqlite3.connect(path) as db:
        version, head = db.execute("SELECT version, head FROM snapshots WHERE task_id = ?"
                                   " ORDER BY version DESC LIMIT 1", (tid,)).fetchone()
        raw = orjson.loads(head)
        if edit == "unknown field":
            raw["stack"][0]["surprise"] = 1
        elif edit == "wrong type":
            raw["step"] = "seven"
        else:
            raw["stack"][0]["agenda"] = [{"action": {"kind": "teleport"}, "planned_by": None,
                                          "open_call": None}]
        db.execute("UPDATE snapshots SET head = ? WHERE task_id = ? AND version = ?",
                   (orjson.dumps(raw), tid, version))
    return int(version)


@pytest.mark.parametrize("edit", ["unknown field", "wrong type", "unknown action"])
async def test_r22_a_damaged_head_whose_json_parses_falls_back_to_the_last_good_version(
        tmp_path: Path, edit: str) -> None:
    """R22/R26: a head of this format with fields nobody writes, a wrong-typed field or an
    action nobody knows is damage: the worker falls back to the previous version (recorded in
    the recovery log, naming the damaged version) and the task finishes."""
    path = tmp_path / "t.db"
    settings = fast_settings(keep_versions=50)
    h = tt.Harness(f"sqlite:///{path}", settings=settings)

    @h.agent("slow")
    class Slow(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if task.last_event is None:
                return tt.Wait("approval")
            return tt.Finish("done")

    tid = await h.submit("slow")
    await h.run_until_idle(timeout=5)
    damaged = _damage_newest_head(path, tid, edit)
    shown = await h.get(tid)  # what a person reading the task sees: the last good version
    assert shown.version < damaged and f"version {damaged}" in shown.damaged[0]
    await h.emit(tt.Event("approval", tid))
    await h.run_until_idle(timeout=5)
    log = await h.store.list_recovery_log(tid)
    assert any(r["resume_strategy"] == "fallback_version" and f"version {damaged}" in r["detail"]
               for r in log), log
    if (await h.get(tid)).record.status is tt.Status.WAITING:  # the fallback predates the wait
        await h.emit(tt.Event("approval", tid))
        await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.damaged == ()
    await h.close()


async def test_e6_r14_rolling_back_into_a_wait_whose_timer_fired_rearms_it(
        harness: tt.Harness) -> None:
    """E6/R14: a task timed out of its wait; rolled back to a version inside that wait, the
    wait runs its timeout again from the rollback and the task finishes (before the fix, the
    old timer id was spent: the task waited forever and workers claimed it in a loop)."""

    @harness.agent("patient")
    class Patient(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if task.last_event is None:
                return tt.Wait("approval", timeout=0.05)
            return tt.Finish(task.last_event.get("timeout", False))

    tid = await harness.submit("patient")
    inside_wait = None
    while (await harness.get(tid)).record.status is not tt.Status.COMPLETED:
        await harness.run_until_idle(timeout=5)
        info = await harness.get(tid)
        if info.record.status is tt.Status.WAITING:
            inside_wait = info.version
    assert inside_wait is not None
    await harness.rollback(tid, inside_wait)
    rolled = await harness.get(tid)
    assert rolled.record.status is tt.Status.WAITING
    wait = rolled.snapshot.frame.wait
    assert wait is not None and wait["due_at"] > rolled.record.updated_at - 1
    await run_until_status(harness, tid, tt.Status.COMPLETED)  # a spinning task never idles
    info = await harness.get(tid)
    assert info.record.status is tt.Status.COMPLETED and info.snapshot.result is True
    assert (await strategies(harness, tid)).count("wait_timeout") == 2


async def test_r12_a_runaway_agent_stops_at_max_steps_and_a_resume_grants_as_many_again() -> None:
    """R12: an agent that never finishes goes to needs_human naming its step limit (per task
    here, overriding the setting); a person's resume lets it take that many steps again."""
    h = tt.Harness("memory://", settings=fast_settings(max_steps=1000))

    @h.agent("chatty")
    class Chatty(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.Reply("and another thing")

    tid = await h.submit("chatty", max_steps=15)
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "max_steps=15" in (info.record.reason or "") and info.snapshot.step == 15
    await h.resume(tid)
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.NEEDS_HUMAN and info.snapshot.step == 30
    assert (await strategies(h, tid)).count("step_limit") == 2
    with pytest.raises(tt.InvalidInput, match="max_steps"):
        await h.submit("chatty", max_steps=0)
    await h.close()


async def test_r20_a_tool_result_over_the_limit_is_refused_by_name_and_not_stored(
        tmp_path: Path) -> None:
    """R20/R26: a tool returning more than max_result_bytes runs once, is recorded as done
    (it may have had an effect), is not kept, and the task goes to a person naming the tool."""
    path = tmp_path / "t.db"
    h = tt.Harness(f"sqlite:///{path}", settings=fast_settings(max_result_bytes=64 * 1024))
    runs: list[int] = []

    @h.tool(side_effect=True)
    async def dump(ctx: tt.ToolContext) -> str:
        runs.append(1)
        return "x" * (3 << 20)

    @h.agent("dumper")
    class Dumper(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.ToolCall("dump") if not task.scratch.setdefault("n", 0) else tt.Finish(1)

    tid = await h.submit("dumper")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.NEEDS_HUMAN and runs == [1]
    assert "result of tool dump" in (info.record.reason or "") and "65,536" in info.record.reason
    await h.close()
    assert path.stat().st_size < (1 << 20)  # the 3 MiB result is nowhere in the store

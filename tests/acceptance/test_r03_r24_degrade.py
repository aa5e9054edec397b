"""R3 ("service degradation") with R24: degrade and recover switch a task, or a whole worker,
to the fallback its agent declares, and back; every switch is in the dialog."""

from __future__ import annotations

import asyncio
from typing import Any

from _support import fast_settings, strategies

import tether as tt
from tether.model import Status


def writer_app(fallback: tt.Fallback, written: list[str], models: list[str],
               steps: int = 4, halfway_wait: bool = False) -> tuple[tt.Harness, asyncio.Event]:
    """Alternates a read (lookup) and a write (save); the model it plans with is recorded."""
    gate = asyncio.Event()
    h = tt.Harness("memory://", settings=fast_settings())

    @h.tool(idempotent=True)
    async def lookup(ctx: tt.ToolContext, n: int) -> int:
        await gate.wait()
        return n

    @h.tool(side_effect=True)
    async def save(ctx: tt.ToolContext, n: int) -> int:
        written.append(f"save{n}")
        return n

    class Writer(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            model = self.fallback.options.get("model", "big") if t.degraded else "big"
            models.append(model)
            if t.step >= steps:
                return tt.Finish(t.step)
            if halfway_wait and t.step == 2 and not t.scratch.get("waited"):
                t.scratch["waited"] = True
                return tt.Wait("next")  # half way: the test switches modes here
            done = sum(1 for r in t.history if r.get("role") == "tool")
            return tt.ToolCall("lookup" if done % 2 == 0 else "save", {"n": done})

    Writer.fallback = fallback
    h.add_agent("writer", Writer())
    return h, gate


def dialog_switches(history: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(r.get("type") or r.get("event"), r.get("scope", "task")) for r in history
            if (r.get("type") or r.get("event")) in ("degrade", "recover")]


async def test_r03_a_degrade_event_switches_a_task_to_its_fallback_and_recover_back() -> None:
    """R3: the agent plans with the fallback's cheaper model while degraded, the big one after
    recover; both switches are in the dialog and the recovery log."""
    written: list[str] = []
    models: list[str] = []
    h, gate = writer_app(tt.Fallback(options={"model": "small"}), written, models, steps=5,
                          halfway_wait=True)
    gate.set()
    tid = await h.submit("writer")
    await h.emit(tt.Event("degrade", tid, {"reason": "provider slow"}))
    await h.run_until_idle(timeout=5)
    assert (await h.get(tid)).record.status is Status.WAITING
    assert models == ["small"] * 3
    await h.emit(tt.Event("recover", tid))
    await h.emit(tt.Event("next", tid, priority=1))
    await h.run_until_idle(timeout=5)
    assert models[3:] == ["big"] * 3
    assert written == ["save1", "save3"]
    assert dialog_switches(await h.history(tid)) == [("degrade", "task"), ("recover", "task")]
    assert {"degrade", "recover"} <= set(await strategies(h, tid))
    info = await h.get(tid)
    assert info.record.status is Status.COMPLETED and info.snapshot.degraded is None
    await h.close()


async def test_r03_a_read_only_fallback_holds_a_write_until_recovery_then_runs_it_once() -> None:
    """R3: with ``Fallback(tools={"lookup"})`` a planned save is not run while degraded: the
    task pauses with the call kept; the recover event lets it run, once."""
    written: list[str] = []
    h, gate = writer_app(tt.Fallback(tools=frozenset({"lookup"})), written, [])
    gate.set()
    tid = await h.submit("writer")
    await h.emit(tt.Event("degrade", tid, "read-only maintenance"))
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is Status.PAUSED and written == []
    assert info.snapshot.frame.agenda[0].action["name"] == "save"
    assert "degrade_pause" in await strategies(h, tid)
    await h.emit(tt.Event("recover", tid))
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is Status.COMPLETED, info.record.reason
    assert written == ["save1", "save3"]
    await h.close()


async def test_r03_a_pause_fallback_pauses_and_recover_never_ends_a_persons_pause() -> None:
    """R3: ``Fallback(pause=True)`` pauses on degrade and carries on at recover; a pause a person
    asked for (a P0 interrupt) is theirs to end: recover leaves it paused."""
    written: list[str] = []
    h, gate = writer_app(tt.Fallback(pause=True), written, [])
    gate.set()
    tid = await h.submit("writer")
    await h.emit(tt.Event("degrade", tid, {"reason": "pager says so"}))
    await h.run_until_idle(timeout=5)
    assert (await h.get(tid)).record.status is Status.PAUSED and written == []
    await h.emit(tt.Event("recover", tid))
    await h.run_until_idle(timeout=5)
    assert (await h.get(tid)).record.status is Status.COMPLETED

    other = await h.submit("writer")
    await h.emit(tt.Event("user_interrupt", other, "hold on"))
    await h.run_until_idle(timeout=5)
    assert (await h.get(other)).record.status is Status.PAUSED
    await h.emit(tt.Event("degrade", other, {"reason": "x"}))
    await h.emit(tt.Event("recover", other))
    await h.run_until_idle(timeout=5)
    assert (await h.get(other)).record.status is Status.PAUSED
    await h.close()


async def test_r03_a_degraded_worker_runs_every_task_on_the_fallback_and_records_it() -> None:
    """R3: ``Harness.degrade`` degrades the whole worker: each task it runs records the switch
    (scope worker) and plans with the fallback; ``recover`` switches them all back."""
    models: list[str] = []
    h, gate = writer_app(tt.Fallback(options={"model": "small"}), [], models, steps=2)
    gate.set()
    h.degrade("primary model provider is down")
    first, second = await h.submit("writer"), await h.submit("writer")
    await h.run_until_idle(timeout=5)
    assert set(models) == {"small"}
    for tid in (first, second):
        assert dialog_switches(await h.history(tid)) == [("degrade", "worker")]
    h.recover()
    third = await h.submit("writer")
    models.clear()
    await h.run_until_idle(timeout=5)
    assert set(models) == {"big"}
    assert dialog_switches(await h.history(third)) == []
    await h.close()

"""E6 with R3: time survives restarts. Wait timeouts, deadlines, scheduled starts and long
back-offs are stored due times; whichever worker is alive when one falls due acts on it, once.

"No worker runs" here means the harness is closed (nothing in memory) while time passes;
the process-level version, with real worker processes, is in tests/chaos/test_drain_and_timers.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _support import fast_settings

import tether as tt
from tether.errors import InvalidInput
from tether.model import Status

SETTINGS = fast_settings(lease_seconds=0.5)


def approval_app(db_url: str, seen: list[Any], timeout: float | None = 0.3) -> tt.Harness:
    """Waits for an approval (with a timeout), then finishes with what ended the wait."""
    h = tt.Harness(db_url, settings=SETTINGS)

    @h.agent("approver")
    class Approver(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if not t.scratch.get("asked"):
                t.scratch["asked"] = True
                return tt.Wait("approval", timeout=timeout)
            seen.append(t.last_event)
            return tt.Finish(t.last_event)

    return h


async def park_waiting(db_url: str, **submit: Any) -> str:
    async with approval_app(db_url, []) as h:
        tid = await h.submit("approver", **submit)
        await h.run_until_idle(timeout=5)
        assert (await h.get(tid)).record.status is Status.WAITING
    return tid


async def events_of(h: tt.Harness, tid: str, kind: str) -> list[tt.StoredEvent]:
    return [e for e in await h.store.list_events(tid) if e.event.type == kind]


async def test_e6_a_wait_that_timed_out_while_no_worker_ran_fires_its_timer_once(db_url: str) -> None:
    """E6, R3: the timeout passed while nothing ran; the next worker fires one ``timer`` event
    through the inbox, the wait ends with the timeout marker, and a later run fires nothing."""
    tid = await park_waiting(db_url)
    await asyncio.sleep(0.5)  # past the 0.3 s timeout, with no worker alive
    seen: list[Any] = []
    async with approval_app(db_url, seen) as h:
        await h.run_until_idle(timeout=5)
        info = await h.get(tid)
        assert info.record.status is Status.COMPLETED
        assert seen == [{"type": "approval", "timeout": True, "event_id": seen[0]["event_id"]}]
        timers = await events_of(h, tid, "timer")
        assert [(e.status, e.priority) for e in timers] == [("applied", 1)]
        assert timers[0].event.id == seen[0]["event_id"]
        assert [r["type"] for r in await h.history(tid) if r.get("role") == "event"] == ["timer"]
        assert "wait_timeout" in [r["resume_strategy"] for r in await h.store.list_recovery_log(tid)]
    async with approval_app(db_url, seen) as h:
        await h.run_until_idle(timeout=5)
        assert len(await events_of(h, tid, "timer")) == 1 and len(seen) == 1


async def test_e6_an_approval_stored_before_the_due_time_beats_the_timeout(db_url: str) -> None:
    """E6: the approval arrived in time, though no worker looked until after the due time."""
    tid = await park_waiting(db_url)
    async with approval_app(db_url, []) as h:
        await h.emit(tt.Event("approval", tid, {"by": "ann"}))
    await asyncio.sleep(0.5)
    seen: list[Any] = []
    async with approval_app(db_url, seen) as h:
        await h.run_until_idle(timeout=5)
        assert (await h.get(tid)).record.status is Status.COMPLETED
        assert seen[0]["payload"] == {"by": "ann"}
        assert await events_of(h, tid, "timer") == []


async def test_e6_an_approval_stored_after_the_due_time_does_not_undo_the_timeout(db_url: str) -> None:
    """E6: the approval came late (after the due time, before any worker looked). The timeout
    wins, whichever is applied first; the late approval is still kept in the dialog."""
    tid = await park_waiting(db_url)
    await asyncio.sleep(0.5)
    async with approval_app(db_url, []) as h:
        await h.emit(tt.Event("approval", tid, {"by": "late"}))
    seen: list[Any] = []
    async with approval_app(db_url, seen) as h:
        await h.run_until_idle(timeout=5)
        assert seen[0]["timeout"] is True
        kinds = [r.get("type") for r in await h.history(tid) if r.get("role") == "event"]
        assert sorted(kinds) == ["approval", "timer"]


async def test_e6_two_workers_looking_at_the_same_moment_fire_the_timer_once(db_url: str) -> None:
    """E6: two workers (two harnesses on one store) serve while the timeout falls due."""
    tid = await park_waiting(db_url, input=None)
    seen: list[Any] = []
    first, second = approval_app(db_url, seen), approval_app(db_url, seen)
    stop = asyncio.Event()
    servers = [asyncio.create_task(h.serve(stop=stop)) for h in (first, second)]
    deadline = time.monotonic() + 5
    while (await first.get(tid)).record.status is not Status.COMPLETED:
        assert time.monotonic() < deadline, "the timer never fired"
        await asyncio.sleep(0.02)
    stop.set()
    await asyncio.gather(*servers)
    assert len(seen) == 1 and seen[0]["timeout"] is True
    assert len(await events_of(first, tid, "timer")) == 1
    await first.close()
    await second.close()


class HeldClock:
    """The wall clock (``time.time``) held still until :meth:`let_go`, so that a deadline a
    fraction of a second away cannot pass before the task reaches the point a test is about,
    however loaded the machine is; asyncio's own clock keeps running."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = time.time
        self.held_at: float | None = self.real()
        monkeypatch.setattr(time, "time", self.now)

    def now(self) -> float:
        return self.real() if self.held_at is None else self.held_at

    def let_go(self) -> None:
        self.held_at = None


def deadline_app(db_url: str, on_plan: Callable[[], None] | None = None) -> tt.Harness:
    h = tt.Harness(db_url, settings=SETTINGS)

    @h.agent("waits")
    class Waits(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.scratch.get("asked"):
                return tt.Finish("carried on")
            t.scratch["asked"] = True
            return tt.Wait("approval")

    @h.agent("thinks")
    class Thinks(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if on_plan is not None:
                on_plan()
            await asyncio.sleep(60)  # a model call that will not finish in time
            return tt.Finish("never")

    return h


async def test_e6_a_deadline_that_passed_while_waiting_fails_the_task_once(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """E6, R3: ``submit(deadline=)``: a task still waiting at its deadline gets one
    ``task_timeout`` (P0) and fails, naming the deadline; a person can still resume it."""
    clock = HeldClock(monkeypatch)
    async with deadline_app(db_url) as h:
        tid = await h.submit("waits", deadline=0.3)
        await h.run_until_idle(timeout=5)
        record = await h.store.get_task(tid)
        assert record.status is Status.WAITING and record.wake_at is not None
    clock.let_go()
    await asyncio.sleep(max(0.0, record.wake_at - time.time()) + 0.05)
    async with deadline_app(db_url) as h:
        await h.run_until_idle(timeout=5)
        info = await h.get(tid)
        assert info.record.status is Status.FAILED
        assert info.snapshot.error is not None and "deadline" in info.snapshot.error
        assert [(e.status, e.priority) for e in await events_of(h, tid, "task_timeout")] \
            == [("applied", 0)]
        await h.resume(tid, message="take the time you need")
        await h.run_until_idle(timeout=5)
        info = await h.get(tid)  # back to its wait, now with no deadline to fire
        assert info.record.status is Status.WAITING and info.record.wake_at is None
        await h.emit(tt.Event("approval", tid, {"by": "ann"}))
        await h.run_until_idle(timeout=5)
        info = await h.get(tid)
        assert info.record.status is Status.COMPLETED and info.snapshot.result == "carried on"
        assert len(await events_of(h, tid, "task_timeout")) == 1


async def test_e6_a_deadline_cuts_off_a_model_call_in_flight(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """E6: the deadline falls due during a long plan() call: it is cancelled at once (as a P0
    would) and the task fails; the worker does not wait for the call to come back. The wall
    clock is held until the call starts, so the deadline always falls due inside it."""
    clock = HeldClock(monkeypatch)
    async with deadline_app(db_url, on_plan=clock.let_go) as h:
        tid = await h.submit("thinks", deadline=timedelta(seconds=0.3))
        started = time.monotonic()
        await h.run_until_idle(timeout=30)
        assert clock.held_at is None and time.monotonic() - started < 30
        info = await h.get(tid)
        assert info.record.status is Status.FAILED, info.record.reason
        assert "deadline" in (info.snapshot.error or "")


async def test_e6_not_before_schedules_the_start(db_url: str) -> None:
    """E6: ``submit(not_before=)``: no worker starts the task before then; one does after."""
    async with approval_app(db_url, [], timeout=0) as h:
        start = datetime.now(UTC) + timedelta(seconds=0.4)
        tid = await h.submit("approver", not_before=start)
        await h.run_until_idle(timeout=5)
        info = await h.get(tid)
        assert info.record.status is Status.PENDING and info.snapshot.step == 0
        assert info.record.wake_at == pytest.approx(start.timestamp())
        await asyncio.sleep(0.5)
        await h.run_until_idle(timeout=5)
        assert (await h.get(tid)).record.status is Status.COMPLETED


@pytest.mark.parametrize(("field", "value", "message"), [
    ("deadline", -1, "between 0 and"),
    ("deadline", float("inf"), "between 0 and"),
    ("deadline", 11 * 365 * 24 * 3600, "ten years"),
    ("not_before", datetime(2030, 1, 1), "needs a timezone"),
    ("not_before", "tomorrow", "not str"),
    ("deadline", True, "not bool"),
])
async def test_e6_bad_moments_are_refused_by_name_and_store_nothing(
        db_url: str, field: str, value: Any, message: str) -> None:
    async with approval_app(db_url, []) as h:
        with pytest.raises(InvalidInput, match=message) as caught:
            await h.submit("approver", task_id="t1", **{field: value})
        assert field in str(caught.value)
        assert await h.store.list_tasks() == []


async def test_e6_a_long_back_off_is_parked_in_the_store_and_a_retry_event_ends_it(
        tmp_path: Path) -> None:
    """E6, R3: a retry back-off longer than a lease is not slept through in memory: the task
    is committed with its due time and released. A ``retry`` event (P2) brings it back now."""
    calls: list[float] = []
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}", settings=SETTINGS)

    @h.tool(retry=tt.RetryPolicy(max_attempts=2, backoff=30, jitter=0))
    async def flaky(ctx: tt.ToolContext) -> str:
        calls.append(time.time())
        if len(calls) == 1:
            raise ConnectionError("upstream is down")
        return "ok"

    @h.agent("caller")
    class Caller(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.ToolCall("flaky", {}) if t.step == 0 else tt.Finish(t.last_tool_result)

    tid = await h.submit("caller")
    await h.run_until_idle(timeout=5)  # returns: nothing to do for 30 s
    record = await h.store.get_task(tid)
    assert record.status is Status.RUNNING and record.lease_owner is None
    assert record.wake_at is not None and record.wake_at > time.time() + 20
    assert len(calls) == 1
    await h.emit(tt.Event("retry", tid))
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is Status.COMPLETED and info.snapshot.result == "ok"
    assert len(calls) == 2
    await h.close()

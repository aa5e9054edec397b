"""Riding out a store outage (issue 13): bounded jittered back-off, an outage logged once when
it begins and once when it ends, and a worker that carries on through one.

The worker tests run a real harness on ``memory://`` behind a switch that makes every store
call raise StoreUnavailable while the store is "down", as a PostgreSQL restart or a SQLite
lock held past the busy timeout does. They wait on conditions, never on timing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import tether as tt
from tether.engine.worker import Worker
from tether.errors import CorruptStore, StoreUnavailable
from tether.store import open_store
from tether.store.retry import Backoff, Outage


def test_backoff_doubles_from_a_tenth_of_a_second_to_five_seconds_with_jitter() -> None:
    top = Backoff(rng=lambda: 1.0)
    assert [round(top.next(), 3) for _ in range(8)] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    bottom = Backoff(rng=lambda: 0.0)
    assert [round(bottom.next(), 3) for _ in range(3)] == [0.05, 0.1, 0.2]
    jittered = Backoff()
    delays = [jittered.next() for _ in range(200)]
    assert all(0 < d <= 5.0 for d in delays) and len(set(delays)) > 100
    jittered.reset()
    assert jittered.next() <= 0.1


def test_an_outage_is_logged_once_when_it_begins_and_once_when_it_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("tether.test_outage")
    outage = Outage(log, Backoff(rng=lambda: 1.0))
    caplog.set_level(logging.INFO, logger="tether.test_outage")
    assert outage.succeeded() is False  # nothing to end
    delays = [outage.failed(StoreUnavailable(f"away {n}")) for n in range(20)]
    assert max(delays) == 5.0 and outage.active
    assert outage.succeeded() is True and not outage.active
    assert outage.succeeded() is False
    outage.failed(StoreUnavailable("again"))
    assert [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records] == [
        ("WARNING", "store unavailable"), ("INFO", "store available again after 0.0 s (20"
                                                   " failed attempts)"),
        ("WARNING", "store unavailable")]
    assert outage.outages == 2


def test_r13_a_call_that_waited_through_an_outage_does_not_start_another(
        caplog: pytest.LogCaptureFixture) -> None:
    """A call that waited 5 s for a pooled connection all through an outage fails just after
    another call ended it: that failure belongs to the outage that ended, so it is not
    logged as a new one; a failure of a call begun afterwards is."""
    log = logging.getLogger("tether.test_outage_waited")
    caplog.set_level(logging.INFO, logger="tether.test_outage_waited")
    outage = Outage(log, Backoff(rng=lambda: 1.0))
    outage.noted(StoreUnavailable("server restarting"))
    assert outage.succeeded() is True
    late = StoreUnavailable("couldn't get a connection after 5.00 sec")
    late.waited = 5.0
    outage.noted(late)
    assert not outage.active and outage.outages == 1
    outage.noted(StoreUnavailable("away again"))
    assert outage.active and outage.outages == 2
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO", "WARNING"]


class Switch:
    """A store whose every call raises StoreUnavailable (or *error*) while it is down."""

    def __init__(self, inner: tt.Store) -> None:
        self.inner = inner
        self.down = False
        self.error: Exception = StoreUnavailable("test: the store is away")
        self.refused: Counter[str] = Counter()
        self.answered: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name == "close" or not asyncio.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                self.refused[name] += 1
                raise self.error
            result = await attr(*args, **kwargs)
            self.answered[name] += 1
            return result

        return call


async def until(condition: Callable[[], Awaitable[bool] | bool], what: str,
                timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while True:
        result = condition()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        assert time.monotonic() < end, f"no {what} within {timeout}s"
        await asyncio.sleep(0.005)


def app(switch: Switch) -> tuple[tt.Harness, dict[str, Any]]:
    h = tt.Harness(switch, settings=tt.Settings(lease_seconds=0.5, poll_interval=0.01,  # type: ignore[arg-type]
                                                recovery_backoff=0.01))
    state: dict[str, Any] = {"paid": Counter(), "gate": asyncio.Event(), "entered": 0}

    @h.tool(side_effect=True)
    async def pay(ctx: tt.ToolContext, order: str) -> str:
        state["entered"] += 1
        await state["gate"].wait()
        state["paid"][ctx.idempotency_key] += 1
        return f"paid {order}"

    @pay.reconcile
    async def _(ctx: tt.ToolContext, order: str) -> str | None:
        return f"paid {order}" if state["paid"][ctx.idempotency_key] else None

    @h.agent("payer")
    class Payer(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.last_tool_result is None:
                return tt.ToolCall("pay", {"order": t.input})
            return tt.Finish(t.last_tool_result)

    return h, state


def fast(worker: Worker) -> Worker:
    worker.outage.backoff = Backoff(first=0.002, cap=0.02)
    return worker


async def test_a_worker_whose_claims_fail_rides_the_outage_out_and_runs_the_tasks(
        caplog: pytest.LogCaptureFixture) -> None:
    switch = Switch(open_store("memory://"))
    h, state = app(switch)
    state["gate"].set()
    ids = [await h.submit("payer", f"o{n}") for n in range(3)]
    caplog.set_level(logging.INFO, logger="tether")
    switch.down = True
    worker = fast(Worker(h, 2))
    run = asyncio.create_task(worker.run(until_idle=True))
    await until(lambda: switch.refused["ping"] >= 5, "failed attempts")
    assert not run.done() and worker.outage.active
    switch.down = False
    await asyncio.wait_for(run, 20)
    for task_id in ids:
        assert (await h.get(task_id)).record.status is tt.Status.COMPLETED
    assert sum(state["paid"].values()) == 3
    lines = [r.getMessage() for r in caplog.records if r.name == "tether"]
    assert sum(line.startswith("store unavailable") for line in lines) == 1, lines
    assert sum(line.startswith("store available again") for line in lines) == 1, lines
    await h.close()


async def test_a_task_whose_commit_fails_transiently_is_not_parked_and_pays_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """The store goes away while the task is inside its call: the result cannot be committed,
    so the task stops (no needs_human); once the store is back it is handed over cleanly
    and resumes from its resume point, where the reconcile hook finds the payment."""
    switch = Switch(open_store("memory://"))
    h, state = app(switch)
    task_id = await h.submit("payer", "o1")
    caplog.set_level(logging.INFO, logger="tether")
    worker = fast(Worker(h, 1))
    run = asyncio.create_task(worker.run(until_idle=True))
    await until(lambda: state["entered"] == 1, "the call to start")
    switch.down = True
    state["gate"].set()  # paid; its result's commit fails
    await until(lambda: any("stopped by the store outage" in r.getMessage()
                            for r in caplog.records), "the task to stop")
    assert worker.outage.active and not worker.active
    switch.down = False
    await asyncio.wait_for(run, 20)
    info = await h.get(task_id)
    assert info.record.status is tt.Status.COMPLETED, info.record
    assert info.snapshot.result == "paid o1"
    assert sum(state["paid"].values()) == 1
    strategies = [r["resume_strategy"] for r in await h.store.list_recovery_log(task_id)]
    assert "needs_human" not in strategies and "resume" not in strategies, strategies
    assert "reconcile" in strategies, strategies  # handed over cleanly: no crash counted
    await h.close()


async def test_a_damaged_store_stops_the_worker_with_its_error() -> None:
    switch = Switch(open_store("memory://"))
    h, _ = app(switch)
    await h.submit("payer", "o1")
    switch.error = CorruptStore("test: the store is damaged; run tether check")
    switch.down = True
    with pytest.raises(CorruptStore, match="tether check"):
        await asyncio.wait_for(fast(Worker(h, 1)).run(until_idle=True), 20)
    switch.down = False
    await h.close()


async def test_a_worker_told_to_stop_during_an_outage_stops() -> None:
    switch = Switch(open_store("memory://"))
    h, _ = app(switch)
    await h.submit("payer", "o1")
    switch.down = True
    worker = Worker(h, 1)  # the real back-off, up to 5 s between attempts
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(until_idle=False, stop=stop))
    await until(lambda: switch.refused["ping"] >= 3, "three attempts")
    stop.set()
    await asyncio.wait_for(run, 10)
    switch.down = False
    await h.close()


async def test_a_worker_started_while_the_store_is_away_waits_for_it() -> None:
    """Started during an outage, the worker does not exit: it re-checks the waiting tasks
    (R16) and runs the others once the store answers."""
    switch = Switch(open_store("memory://"))
    h, state = app(switch)
    state["gate"].set()
    task_id = await h.submit("payer", "o1")
    switch.down = True
    worker = fast(Worker(h, 1))
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(until_idle=False, stop=stop, wake_waiting=True))
    await until(lambda: switch.refused["ping"] >= 3, "three attempts")
    assert not run.done() and switch.refused["wake_all"] == 1 and switch.answered["wake_all"] == 0
    switch.down = False
    await until(lambda: switch.answered["wake_all"] == 1, "the waiting tasks to be woken")

    async def completed() -> bool:
        return (await h.get(task_id)).record.status is tt.Status.COMPLETED

    await until(completed, "the task to complete")
    stop.set()
    await asyncio.wait_for(run, 10)
    await h.close()

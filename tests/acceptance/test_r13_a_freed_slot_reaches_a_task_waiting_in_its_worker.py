"""R13 (issue 30): on a store that tells workers of slots let go (PostgreSQL), a task held
back by a full concurrency limit waits a short while in the memory of the worker that runs
it (``Settings.slot_wait``), still leased, and the slot let go
reaches it at once: no park, no second claim, no second load. What it planned is committed
before it waits; an event still reaches it while it waits; past ``slot_wait`` it is parked in
the store, saying why, as before. On SQLite, which cannot tell another process's worker, it
is parked at once. A slot let go by another worker reaches it through the store's notice
('slot/' and the task's id): two harnesses with a store each (its own pool and its own
LISTEN connection), as two processes would have."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _support import fast_settings, wait_until

import tether as tt
from tether.store.base import SLOT_NOTICE


def one_slot_app(h: tt.Harness, release: asyncio.Event, started: list[str]) -> None:
    """Tasks that each make one call under a limit of one slot; the call holds its slot until
    the test lets it go. Each plan is paid for (``commit_plans``), as a model's answer is."""
    h.limit("provider", concurrency=1)

    @h.tool(limits=("provider",))
    async def hold(ctx: tt.ToolContext) -> str:
        started.append(ctx.task_id)
        await release.wait()
        return "done"

    @h.agent("holder")
    class Holder(tt.Agent):
        commit_plans = True

        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Finish(t.last_tool_result) if t.last_tool_result else tt.ToolCall("hold", {})


def count_claims(h: tt.Harness, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often the store handed each task to a worker."""
    claims: Counter[str] = Counter()
    claim_many = h.store.claim_many

    async def counted(*args: Any, **kwargs: Any) -> Any:
        got = await claim_many(*args, **kwargs)
        claims.update(claim.task_id for claim in got)
        return got

    monkeypatch.setattr(h.store, "claim_many", counted)
    return claims


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("pg_url")
    return url


async def in_line(h: tt.Harness, waiting: int) -> bool:
    usage = await h.store.limit_usage(time.time())
    return [(u.in_use, u.waiting) for u in usage] == [(1, waiting)]


async def two_tasks(h: tt.Harness, started: list[str]) -> tuple[str, str, asyncio.Task[None]]:
    """Two tasks run side by side: the one whose call took the slot, the one in line (workers
    may claim them in either order), and the run."""
    ids = {await h.submit("holder"), await h.submit("holder")}
    running = asyncio.create_task(h.run_until_idle(concurrency=2, timeout=30))

    async def one_runs_one_waits() -> bool:
        return len(started) == 1 and await in_line(h, 1)

    await wait_until(one_runs_one_waits, 30, what="a task in its call and one in the limit's line")
    (waiter,) = ids - {started[0]}
    return started[0], waiter, running


async def test_a_slot_let_go_hands_over_to_the_task_waiting_in_memory(
        pg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    h = tt.Harness(pg, settings=fast_settings(slot_wait=60.0))
    release, started = asyncio.Event(), []
    one_slot_app(h, release, started)
    claims = count_claims(h, monkeypatch)
    first, second, running = await two_tasks(h, started)
    record = await h.store.get_task(second)
    assert record.lease_owner is not None and record.wake_at is None  # in memory, not parked
    release.set()
    await running  # far sooner than slot_wait: the slot was handed over, not waited out
    assert started == [first, second]
    assert claims == {first: 1, second: 1}  # never parked, so never claimed or loaded again
    assert (await h.get(second)).snapshot.result == "done"
    await h.close()


@pytest.mark.parametrize("where", ["postgres, past slot_wait", "sqlite, at once"])
async def test_the_task_is_parked_in_the_store_saying_why(
        where: str, request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    url = request.getfixturevalue("pg_url") if where.startswith("postgres") \
        else f"sqlite:///{tmp_path / 't.db'}"
    slot_wait = 0.05 if where.startswith("postgres") else 60.0
    h = tt.Harness(url, settings=fast_settings(slot_wait=slot_wait))
    release, started = asyncio.Event(), []
    one_slot_app(h, release, started)
    claims = count_claims(h, monkeypatch)
    _, second, running = await two_tasks(h, started)

    async def parked() -> bool:
        record = await h.store.get_task(second)
        return record.lease_owner is None and record.wake_at is not None

    await wait_until(parked, 30, what="the second task parked")
    assert (await h.store.get_task(second)).reason == "held back by limit provider: 1 of 1 in use"
    release.set()
    await running
    assert claims[second] == 2  # parked once, claimed again when the slot was let go
    assert (await h.get(second)).snapshot.result == "done"
    await h.close()


async def test_a_pause_reaches_a_task_waiting_in_memory_for_a_slot(pg: str) -> None:
    h = tt.Harness(pg, settings=fast_settings(slot_wait=60.0))
    release, started = asyncio.Event(), []
    one_slot_app(h, release, started)
    first, second, running = await two_tasks(h, started)
    await h.emit(tt.Event("user_interrupt", second, {}))

    async def paused() -> bool:
        return (await h.store.get_task(second)).status is tt.Status.PAUSED

    await wait_until(paused, 30, what="the waiting task paused")  # long before slot_wait
    assert started == [first]  # its call never started
    release.set()
    await running
    assert (await h.store.get_task(second)).status is tt.Status.PAUSED
    await h.resume(second)
    await h.run_until_idle(concurrency=2, timeout=30)
    assert (await h.get(second)).snapshot.result == "done"
    await h.close()


async def test_a_model_answer_is_committed_before_its_call_waits_for_a_slot(pg: str) -> None:
    """A kill while a call waits in memory must not cost the model's answer: the plan is in
    the store before the wait begins."""
    h = tt.Harness(pg, settings=fast_settings(slot_wait=60.0))
    release, started = asyncio.Event(), []
    one_slot_app(h, release, started)
    _, second, running = await two_tasks(h, started)
    stored = (await h.get(second)).snapshot  # read from the store, not from the runner
    planned = stored.frame.agenda[0] if stored.frame.agenda else None
    assert planned is not None and planned.action["name"] == "hold"  # the paid answer is kept
    release.set()
    await running
    await h.close()


async def test_a_slot_let_go_in_one_worker_reaches_a_task_waiting_in_another(
        pg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    slot_wait = 120.0  # far longer than the test may take: a wait not handed the slot fails it
    release, started = asyncio.Event(), []
    first_worker = tt.Harness(pg, settings=fast_settings(slot_wait=slot_wait))
    second_worker = tt.Harness(pg, settings=fast_settings(slot_wait=slot_wait))
    for h in (first_worker, second_worker):
        one_slot_app(h, release, started)
    claims = count_claims(second_worker, monkeypatch)
    notices: list[str] = []
    wait_for_change = second_worker.store.wait_for_change

    async def noted(*args: Any, **kwargs: Any) -> frozenset[str] | None:
        changed = await wait_for_change(*args, **kwargs)
        notices.extend(changed or ())
        return changed

    monkeypatch.setattr(second_worker.store, "wait_for_change", noted)
    first = await first_worker.submit("holder")
    stop = asyncio.Event()
    serving = asyncio.create_task(first_worker.serve(concurrency=1, stop=stop))
    await wait_until(lambda: started == [first], 30, "the first task in its call")
    second = await second_worker.submit("holder")
    waiting = asyncio.create_task(second_worker.run_until_idle(concurrency=1, timeout=60))
    await wait_until(lambda: in_line(second_worker, 1), 30, "the second task in line")
    record = await second_worker.store.get_task(second)
    assert record.lease_owner is not None and record.wake_at is None  # in memory, not parked
    release.set()
    await asyncio.wait_for(waiting, 60)  # not slot_wait: the notice handed the slot over
    assert started == [first, second]
    assert claims == {second: 1}
    assert SLOT_NOTICE + second in notices
    assert (await second_worker.get(second)).snapshot.result == "done"
    stop.set()
    await serving
    await first_worker.close()
    await second_worker.close()

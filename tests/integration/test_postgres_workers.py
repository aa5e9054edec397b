"""R13, R19 on PostgreSQL: what only a shared server adds (the conformance suite covers the rest)."""

from __future__ import annotations

import asyncio
import time

import pytest

import tether as tt

pytestmark = pytest.mark.postgres


def app(url: str, poll: float) -> tt.Harness:
    h = tt.Harness(url, settings=tt.Settings(poll_interval=poll))

    @h.agent("echo")
    class Echo(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.input.get("wait") and t.last_event is None:
                return tt.Wait("approval")
            return tt.Finish(t.input)

    return h


async def test_r19_an_idle_worker_is_woken_by_notify_not_by_its_poll(pg_url: str) -> None:
    """R19: a worker polling only every 60 s picks up a task submitted, and an approval sent,
    by another process at once: the store NOTIFYs idle workers when either commits."""
    worker, sender = app(pg_url, poll=60), app(pg_url, poll=60)
    stop = asyncio.Event()
    serving = asyncio.create_task(worker.serve(stop=stop))
    await asyncio.sleep(0.5)  # the worker is idle, listening
    tid = await sender.submit("echo", {"wait": True})
    end = time.monotonic() + 20
    while (await sender.get(tid)).record.status is not tt.Status.WAITING:
        assert time.monotonic() < end, "the new task was not picked up without a poll"
        await asyncio.sleep(0.05)
    await sender.emit(tt.Event("approval", tid, {"ok": True}))
    while (await sender.get(tid)).record.status is not tt.Status.COMPLETED:
        assert time.monotonic() < end, "the approval did not wake the worker without a poll"
        await asyncio.sleep(0.05)
    stop.set()
    await serving
    await worker.close()
    await sender.close()


async def test_r03_a_listener_that_starts_again_says_anything_may_have_changed(
        pg_url: str) -> None:
    """R3: a notice sent while a worker was not listening (its LISTEN connection broke and
    came back) is lost; so the first look after LISTEN starts says "anything may have
    changed" (None), and the worker then passes every running task's events on."""
    from tether.store.postgres import PostgresStore

    store = PostgresStore(pg_url)
    assert await store.wait_for_change(0.05, 0.05) is None  # LISTEN just started
    assert await store.wait_for_change(0.05, 0.05) == frozenset()  # nothing since
    assert store._listener is not None
    await store._listener.close()  # the connection breaks
    with pytest.raises(tt.StoreError):
        await store.wait_for_change(0.05, 0.05)
    assert await store.wait_for_change(0.05, 0.05) is None  # listening again
    await store.close()

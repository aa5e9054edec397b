"""A pytest conformance suite for the :class:`tether.store.base.Store` protocol (R13).

Every backend must pass it. Subclass :class:`StoreConformance` in a test module
and provide a ``store`` fixture yielding a fresh, empty store::

    from tether.store.conformance import StoreConformance

    class TestMyStore(StoreConformance):
        @pytest.fixture
        async def store(self, tmp_path):
            store = open_store(f"sqlite:///{tmp_path}/t.db")
            yield store
            await store.close()

Backends that persist across reopening (everything but ``memory://``) should
subclass :class:`DurableStoreConformance` instead and also provide
``reopen_store``: a zero-argument callable opening a *new* store on the same
data (R6, R19: dedup and events survive a restart).

Each test states the requirement it checks. Payloads are built with the real
data classes (``TaskRecord``, ``Checkpoint``, ``Snapshot(...).dumps()``), so the
suite exercises what the runner actually writes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from tether.model import IdempotencyRecord, OutcomeStatus, Status
from tether.store.base import HistoryRow, Store
from tether.store.conformance.helpers import claim, commit, event, limits, make_task
from tether.store.conformance.inbox import InboxConformance
from tether.store.conformance.named_limits import LimitConformance
from tether.store.conformance.retention import RetentionConformance
from tether.store.conformance.schedules import ScheduleConformance
from tether.store.conformance.tasks import TaskConformance

__all__ = ["DurableStoreConformance", "StoreConformance"]


class StoreConformance(TaskConformance, InboxConformance, LimitConformance,
                       RetentionConformance, ScheduleConformance):
    """Behaviour every :class:`Store` backend must show. Needs a ``store`` fixture."""

    pytestmark = [pytest.mark.asyncio]


class DurableStoreConformance(StoreConformance):
    """Extra checks for backends whose data outlives the store object (R6, R19).

    Needs a ``reopen_store`` fixture: a callable opening a new store on the
    same data as ``store``.
    """

    async def test_dedup_survives_reopening(
        self, store: Store, reopen_store: Callable[[], Store]
    ) -> None:
        """R6, R19: dedup is durable: after a restart the same source_event_id is still dropped."""
        now = time.time()
        await make_task(store, "t1")
        first = await store.add_event(event("t1", payload="once", source_event_id="ext-1"), 1,
                                      limits(), now)
        await store.close()
        again = reopen_store()
        try:
            receipt = await again.add_event(event("t1", payload="twice", source_event_id="ext-1"),
                                            1, limits(), now + 10)
            assert receipt.accepted is False and receipt.outcome == "duplicate"
            assert receipt.event_id == first.event_id
            [stored] = await again.pending_events("t1")
            assert stored.event.payload == "once"
        finally:
            await again.close()

    async def test_everything_survives_reopening(
        self, store: Store, reopen_store: Callable[[], Store]
    ) -> None:
        """R13, R19: tasks, versions, history, events, idempotency and the log outlive the store."""
        now = time.time()
        await make_task(store, "t1")
        receipt = await store.add_event(event("t1", payload="hi"), 1, limits(), now)
        lease = await claim(store, "t1", now)
        record = IdempotencyRecord("t1:f:0", "t1", "send", "h", OutcomeStatus.SUCCEEDED, {"id": 1})
        await commit(store, lease, Status.WAITING, now,
                     history=[HistoryRow(0, 1, {"role": "user", "content": "hi"})],
                     idempotency=[record], recovery_log=[{"resume_strategy": "restart"}])
        await store.close()
        again = reopen_store()
        try:
            task = await again.get_task("t1")
            assert task.status is Status.WAITING and task.head_version == 2
            assert [v for v, _, _ in await again.list_versions("t1")] == [1, 2]
            assert await again.read_history("t1", [[0, -1]]) == [{"role": "user", "content": "hi"}]
            assert [e.event.id for e in await again.pending_events("t1")] == [receipt.event_id]
            stored = await again.get_idempotency("t1:f:0")
            assert stored is not None and stored.result == {"id": 1}
            assert await again.list_recovery_log("t1") == [{"resume_strategy": "restart"}]
        finally:
            await again.close()

    async def test_an_event_stored_elsewhere_is_seen_as_a_change(
        self, store: Store, reopen_store: Callable[[], Store]
    ) -> None:
        """R3, E1: a worker watching the store learns that another process stored an event
        (so a P0 reaches a running task at once): the ids it names include the task, or the
        backend says only that something changed (None). Nothing stored: an empty set."""
        now = time.time()
        await make_task(store, "t1")
        await store.wait_for_change(0.01, 0.005)  # now listening (a first look may say None)
        assert await store.wait_for_change(0.01, 0.005) == frozenset()
        elsewhere = reopen_store()
        try:
            watching = asyncio.create_task(store.wait_for_change(10.0, 0.005))
            await asyncio.sleep(0)  # the watch has taken its baseline
            await elsewhere.add_event(event("t1", payload="stop"), 0, limits(), now)
            changed = await watching
        finally:
            await elsewhere.close()
        assert changed is None or "t1" in changed

    async def test_an_event_stored_between_two_looks_is_seen_by_the_second(
        self, store: Store, reopen_store: Callable[[], Store]
    ) -> None:
        """R3, E1: what another process stores while the watcher acts on its last look (it
        passes events on, then looks again) is seen by the next look, not lost in between."""
        await make_task(store, "t1")
        await store.wait_for_change(0.01, 0.005)  # now listening (a first look may say None)
        assert await store.wait_for_change(0.01, 0.005) == frozenset()
        elsewhere = reopen_store()
        try:
            await elsewhere.add_event(event("t1", payload="stop"), 0, limits(), time.time())
        finally:
            await elsewhere.close()
        changed = await store.wait_for_change(2.0, 0.005)
        assert changed is None or "t1" in changed

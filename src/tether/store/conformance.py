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

import time
from collections.abc import Callable
from typing import Any

import pytest

from tether.errors import (
    InboxFull,
    LeaseLost,
    TaskClosed,
    TaskNotFound,
    TetherError,
    VersionNotFound,
)
from tether.model import Event, IdempotencyRecord, Snapshot, Status, TaskRecord
from tether.store.base import Checkpoint, Claim, HistoryRow, InboxLimits, Store

__all__ = ["DurableStoreConformance", "StoreConformance"]

LEASE = 30.0
"""Lease length used by the suite; tests move ``now`` past it to simulate expiry."""

KEEP = 10


def limits(
    *,
    capacity: int = 1000,
    refusable: bool = False,
    coalesce: str | None = None,
    window: float = 1.5,
    wakes_needs_human: bool = False,
    reopens: frozenset[Status] = frozenset(),
) -> InboxLimits:
    """Inbox limits with suite defaults (content events: not refusable, never coalesced)."""
    return InboxLimits(
        capacity=capacity,
        refusable=refusable,
        coalesce=coalesce,
        window=window,
        wakes_needs_human=wakes_needs_human,
        reopens=reopens,
    )


def head(task_id: str, status: Status = Status.PENDING, step: int = 0, **extra: Any) -> bytes:
    """A real snapshot head for *task_id* (deterministic bytes for the same arguments)."""
    extra.setdefault("created_at", 1000.0)
    return Snapshot(task_id=task_id, agent="echo", input={"q": task_id}, status=status, step=step,
                    **extra).dumps()


async def make_task(store: Store, task_id: str, created_at: float | None = None) -> TaskRecord:
    """Create a pending task with its version-1 head."""
    at = time.time() if created_at is None else created_at
    record = TaskRecord(task_id=task_id, agent="echo", status=Status.PENDING, created_at=at,
                        updated_at=at, head_version=1)
    await store.create_task(record, head(task_id))
    return record


async def claim(store: Store, task_id: str, now: float, worker: str = "w1") -> Claim:
    """Claim *task_id*, failing the test if it cannot be claimed."""
    got = await store.claim_task(task_id, worker, now, LEASE)
    assert got is not None, f"task {task_id} should be claimable at {now}"
    assert got.task_id == task_id
    return got


async def commit(
    store: Store,
    lease: Claim,
    status: Status,
    now: float,
    *,
    step: int = 1,
    keep: int = KEEP,
    **fields: Any,
) -> int:
    """Commit a checkpoint moving the task to *status*; returns the new version."""
    checkpoint = Checkpoint(head=head(lease.task_id, status, step), status=status, **fields)
    return await store.commit(lease, checkpoint, keep, now + LEASE)


async def park(store: Store, task_id: str, status: Status, now: float, **fields: Any) -> None:
    """Claim, move the task to *status* and release it cleanly."""
    lease = await claim(store, task_id, now)
    await commit(store, lease, status, now, **fields)
    await store.release(lease)


def event(task_id: str, type_: str = "user_message", payload: Any = None,
          source_event_id: str | None = None) -> Event:
    return Event(type=type_, task_id=task_id, payload=payload, source_event_id=source_event_id)


class StoreConformance:
    """Behaviour every :class:`Store` backend must show. Needs a ``store`` fixture."""

    pytestmark = [pytest.mark.asyncio]

    # ------------------------------------------------------------------ tasks

    async def test_create_and_get_task(self, store: Store) -> None:
        """R13: a created task is readable with its index row and version-1 head."""
        record = await make_task(store, "t1", created_at=1000.0)
        got = await store.get_task("t1")
        assert got == record
        assert got.head_version == 1
        assert got.lease_owner is None and got.lease_until is None
        version, data = await store.load_head("t1")
        assert version == 1
        assert data == head("t1")
        snap = Snapshot.loads(data, "t1", version)
        assert snap.task_id == "t1" and snap.input == {"q": "t1"}

    async def test_get_unknown_task_raises_task_not_found_naming_it(self, store: Store) -> None:
        """R13: asking for a task that does not exist raises TaskNotFound naming the id."""
        with pytest.raises(TaskNotFound, match="ghost"):
            await store.get_task("ghost")

    async def test_create_duplicate_task_raises_tether_error_and_keeps_original(
        self, store: Store
    ) -> None:
        """R13: creating a task id twice is refused with a TetherError; the first task is intact."""
        original = await make_task(store, "dup", created_at=1000.0)
        clash = TaskRecord("dup", "other", Status.PENDING, 2000.0, 2000.0, 1)
        with pytest.raises(TetherError):
            await store.create_task(clash, head("dup", step=99))
        assert await store.get_task("dup") == original
        assert (await store.load_head("dup"))[1] == head("dup")

    async def test_list_tasks_newest_first_with_status_filter_and_limit(self, store: Store) -> None:
        """R2: listings show tasks newest first, optionally of one status, up to a limit."""
        now = time.time()
        await make_task(store, "old", created_at=now - 30)
        await make_task(store, "mid", created_at=now - 20)
        await make_task(store, "new", created_at=now - 10)
        await park(store, "mid", Status.WAITING, now)
        assert [t.task_id for t in await store.list_tasks()] == ["new", "mid", "old"]
        assert [t.task_id for t in await store.list_tasks(limit=2)] == ["new", "mid"]
        assert [t.task_id for t in await store.list_tasks(Status.PENDING)] == ["new", "old"]
        waiting = await store.list_tasks(Status.WAITING)
        assert [t.task_id for t in waiting] == ["mid"]
        assert waiting[0].status is Status.WAITING
        assert await store.list_tasks(Status.COMPLETED) == []

    async def test_count_by_status(self, store: Store) -> None:
        """R2: counts of tasks per status."""
        now = time.time()
        for name in ("a", "b", "c"):
            await make_task(store, name)
        await park(store, "c", Status.COMPLETED, now)
        assert await store.count_by_status() == {"pending": 2, "completed": 1}

    async def test_wake_all_makes_parked_tasks_claimable(self, store: Store) -> None:
        """R26, E7: wake_all marks every task of a status due; each becomes claimable once."""
        now = time.time()
        for name in ("a", "b", "c"):
            await make_task(store, name)
        await park(store, "a", Status.NEEDS_HUMAN, now)
        await park(store, "b", Status.NEEDS_HUMAN, now)
        await park(store, "c", Status.WAITING, now)
        assert await store.claim("w2", now + 1, LEASE) is None
        assert await store.wake_all(Status.NEEDS_HUMAN, now + 2) == 2
        assert await store.wake_all(Status.PAUSED, now + 2) == 0
        first = await store.claim("w2", now + 3, LEASE)
        second = await store.claim("w2", now + 3, LEASE)
        assert first is not None and second is not None
        assert {first.task_id, second.task_id} == {"a", "b"}
        assert await store.claim("w2", now + 3, LEASE) is None

    # ------------------------------------------------------------------ leases

    async def test_claim_returns_none_without_work(self, store: Store) -> None:
        """E7: an empty store (or one with only idle tasks) has nothing to claim."""
        assert await store.claim("w1", time.time(), LEASE) is None
        await make_task(store, "idle")
        await park(store, "idle", Status.WAITING, time.time())
        assert await store.claim("w1", time.time() + 1, LEASE) is None

    async def test_claim_leases_task_once_until_it_expires(self, store: Store) -> None:
        """R13, E5: a live lease keeps other workers out; after it expires the fence moves on."""
        now = time.time()
        await make_task(store, "t1")
        first = await store.claim("w1", now, LEASE)
        assert first is not None and first.task_id == "t1" and not first.crashed
        record = await store.get_task("t1")
        assert record.lease_owner == "w1"
        assert record.lease_until == pytest.approx(now + LEASE)
        assert await store.claim("w2", now + 1, LEASE) is None
        assert await store.claim_task("t1", "w2", now + 1, LEASE) is None
        second = await store.claim("w2", now + LEASE + 1, LEASE)
        assert second is not None and second.task_id == "t1"
        assert second.fence > first.fence
        assert (await store.get_task("t1")).lease_owner == "w2"

    async def test_claim_task_unknown_raises_task_not_found(self, store: Store) -> None:
        """R13: claiming a task that does not exist raises TaskNotFound."""
        with pytest.raises(TaskNotFound, match="ghost"):
            await store.claim_task("ghost", "w1", time.time(), LEASE)

    async def test_crashed_when_running_lease_expired(self, store: Store) -> None:
        """E5: a running task whose lease expired (a crash) is claimed with crashed=True."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        await commit(store, lease, Status.RUNNING, now)
        again = await store.claim("w2", now + 2 * LEASE, LEASE)
        assert again is not None and again.task_id == "t1"
        assert again.crashed is True

    async def test_crashes_counted_at_claim_and_reset_by_progress(self, store: Store) -> None:
        """R12: each expired lease is counted by the store when the task is claimed again, even
        if the claimer dies before committing; a commit that made progress starts the count again."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        await commit(store, lease, Status.RUNNING, now)
        counts = []
        for n in range(1, 4):
            later = now + n * 3 * LEASE
            taken = await store.claim("w2", later, LEASE)
            assert taken is not None and taken.crashed
            counts.append(taken.crashes)
            lease = taken
        assert counts == [1, 2, 3]
        await commit(store, lease, Status.RUNNING, now + 12 * LEASE, progress=True)
        again = await store.claim("w3", now + 20 * LEASE, LEASE)
        assert again is not None and again.crashed and again.crashes == 1

    async def test_not_crashed_after_clean_release(self, store: Store) -> None:
        """E5: a cleanly released lease is not a crash, and the task is claimable at once."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        await commit(store, lease, Status.RUNNING, now)
        await store.release(lease)
        released = await store.get_task("t1")
        assert released.lease_owner is None and released.lease_until is None
        again = await store.claim_task("t1", "w2", now + 1, LEASE)
        assert again is not None
        assert again.crashed is False
        assert again.fence > lease.fence

    async def test_stale_commit_raises_lease_lost_and_writes_nothing(self, store: Store) -> None:
        """R13, E5: a worker whose lease was taken over can never land a write."""
        now = time.time()
        await make_task(store, "t1")
        await store.add_event(event("t1", payload="hi"), 1, limits(), now)
        [pending] = await store.pending_events("t1")
        assert pending.event.id is not None
        stale = await claim(store, "t1", now, worker="w1")
        fresh = await claim(store, "t1", now + 2 * LEASE, worker="w2")
        assert fresh.fence > stale.fence
        before = await store.get_task("t1")
        checkpoint = Checkpoint(
            head=head("t1", Status.COMPLETED, 7),
            status=Status.COMPLETED,
            history=[HistoryRow(0, 1, {"role": "assistant", "content": "late"})],
            events_done=[(pending.event.id, "applied")],
            idempotency=[IdempotencyRecord("t1:f:1", "t1", "pay", "h", "succeeded", 1)],
            recovery_log=[{"task_id": "t1", "resume_strategy": "late"}],
            reason="stale",
        )
        with pytest.raises(LeaseLost):
            await store.commit(stale, checkpoint, KEEP, now + 3 * LEASE)
        assert await store.get_task("t1") == before
        assert [v for v, _, _ in await store.list_versions("t1")] == [1]
        assert await store.read_history("t1", [[0, -1]]) == []
        assert [e.event.id for e in await store.pending_events("t1")] == [pending.event.id]
        assert await store.get_idempotency("t1:f:1") is None
        assert await store.list_idempotency("t1") == []
        assert await store.list_recovery_log("t1") == []
        assert await commit(store, fresh, Status.RUNNING, now + 2 * LEASE) == 2

    async def test_stale_renew_and_release_raise_lease_lost(self, store: Store) -> None:
        """E5: renewing or releasing a lease another worker took over raises LeaseLost."""
        now = time.time()
        await make_task(store, "t1")
        stale = await claim(store, "t1", now, worker="w1")
        await claim(store, "t1", now + 2 * LEASE, worker="w2")
        before = await store.get_task("t1")
        with pytest.raises(LeaseLost):
            await store.renew(stale, now + 10 * LEASE)
        with pytest.raises(LeaseLost):
            await store.release(stale)
        assert await store.get_task("t1") == before

    async def test_renew_extends_lease(self, store: Store) -> None:
        """E5: a renewed lease keeps other workers out past its first expiry."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        await store.renew(lease, now + 3 * LEASE)
        assert (await store.get_task("t1")).lease_until == pytest.approx(now + 3 * LEASE)
        assert await store.claim_task("t1", "w2", now + 2 * LEASE, LEASE) is None
        assert await store.claim("w2", now + 2 * LEASE, LEASE) is None
        assert await store.claim_task("t1", "w2", now + 4 * LEASE, LEASE) is not None

    async def test_renew_after_release_raises_lease_lost(self, store: Store) -> None:
        """E5: a released lease is no longer ours; renewing it must not re-take the task."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        await store.release(lease)
        with pytest.raises(LeaseLost):
            await store.renew(lease, now + 10 * LEASE)
        assert (await store.get_task("t1")).lease_until is None
        assert await store.claim_task("t1", "w2", now + 1, LEASE) is not None

    async def test_commit_for_unknown_task_raises_task_not_found(self, store: Store) -> None:
        """R13: a commit naming a task that does not exist raises TaskNotFound."""
        bogus = Claim("ghost", 1, crashed=False)
        with pytest.raises(TaskNotFound):
            await store.commit(bogus, Checkpoint(head=head("ghost"), status=Status.RUNNING), KEEP, 0.0)

    # ------------------------------------------------------------------ checkpoints

    async def test_commit_writes_new_versions(self, store: Store) -> None:
        """R14: every commit writes a new version; the task row follows the newest head."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        assert await commit(store, lease, Status.RUNNING, now, step=1) == 2
        assert await commit(store, lease, Status.WAITING, now, step=2, reason="approval",
                            wake_at=now + 100) == 3
        record = await store.get_task("t1")
        assert record.head_version == 3
        assert record.status is Status.WAITING
        assert record.reason == "approval"
        assert record.lease_until == pytest.approx(now + LEASE)
        assert record.updated_at >= record.created_at
        version, data = await store.load_head("t1")
        assert version == 3 and Snapshot.loads(data, "t1", 3).step == 2
        _, older = await store.load_head("t1", 2)
        assert Snapshot.loads(older, "t1", 2).step == 1
        assert Snapshot.loads(older, "t1", 2).status is Status.RUNNING

    async def test_commit_prunes_to_keep_and_pruned_version_is_not_found(self, store: Store) -> None:
        """R14: only the newest `keep` versions are kept; a pruned one raises VersionNotFound."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        for step in range(1, 6):
            await commit(store, lease, Status.RUNNING, now, step=step, keep=3)
        assert [v for v, _, _ in await store.list_versions("t1")] == [4, 5, 6]
        with pytest.raises(VersionNotFound, match="t1"):
            await store.load_head("t1", 1)
        with pytest.raises(VersionNotFound):
            await store.load_head("t1", 3)
        with pytest.raises(VersionNotFound):
            await store.load_head("t1", 99)
        version, data = await store.load_head("t1", 4)
        assert version == 4 and Snapshot.loads(data, "t1", 4).step == 3
        assert (await store.load_head("t1"))[0] == 6

    async def test_load_head_of_unknown_task_raises_task_not_found(self, store: Store) -> None:
        """R13: loading the head of a task that does not exist raises TaskNotFound, any version."""
        with pytest.raises(TaskNotFound):
            await store.load_head("ghost")
        with pytest.raises(TaskNotFound):
            await store.load_head("ghost", 1)

    async def test_list_versions_oldest_first_with_time_and_size(self, store: Store) -> None:
        """R14: kept versions come with timestamps and sizes, oldest first."""
        now = time.time()
        await make_task(store, "t1", created_at=now)
        lease = await claim(store, "t1", now)
        big = Checkpoint(head=head("t1", Status.RUNNING, 1, signals={"x": "y" * 500}),
                         status=Status.RUNNING)
        await store.commit(lease, big, KEEP, now + LEASE)
        versions = await store.list_versions("t1")
        assert [v for v, _, _ in versions] == [1, 2]
        assert versions[0][1] == pytest.approx(now)
        assert versions[1][1] >= versions[0][1]
        assert versions[0][2] == len(head("t1"))
        assert versions[1][2] == len(big.head)
        assert await store.list_versions("ghost") == []

    # ------------------------------------------------------------------ history

    async def test_history_branches_follow_segments(self, store: Store) -> None:
        """R8, R14: history is append-only; a rollback reads the old branch up to a point,
        then the new epoch."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        old = [HistoryRow(0, seq, {"role": "user", "n": f"e0-{seq}"}) for seq in range(1, 6)]
        await commit(store, lease, Status.RUNNING, now, history=old)
        epoch = await store.next_epoch("t1")
        assert epoch >= 1
        new = [HistoryRow(epoch, seq, {"role": "assistant", "n": f"e1-{seq}"}) for seq in (4, 5)]
        await commit(store, lease, Status.RUNNING, now, history=new)
        branch = await store.read_history("t1", [[0, 3], [epoch, -1]])
        assert [e["n"] for e in branch] == ["e0-1", "e0-2", "e0-3", "e1-4", "e1-5"]
        whole_old = await store.read_history("t1", [[0, -1]])
        assert [e["n"] for e in whole_old] == [f"e0-{s}" for s in range(1, 6)]
        assert whole_old[0] == {"role": "user", "n": "e0-1"}
        assert [e["n"] for e in await store.read_history("t1", [[0, 2]])] == ["e0-1", "e0-2"]
        assert await store.read_history("t1", [[7, -1]]) == []

    async def test_next_epoch_is_new_every_time(self, store: Store) -> None:
        """R14: each rollback gets a branch number never used before by that task."""
        await make_task(store, "t1")
        await make_task(store, "t2")
        first = await store.next_epoch("t1")
        second = await store.next_epoch("t1")
        assert first >= 1 and second > first
        assert await store.next_epoch("t2") >= 1
        with pytest.raises(TaskNotFound):
            await store.next_epoch("ghost")

    # ------------------------------------------------------------------ events

    async def test_add_event_stores_it_durably(self, store: Store) -> None:
        """R3, R19: an accepted event is stored with its type, payload, priority and source id."""
        now = time.time()
        await make_task(store, "t1")
        receipt = await store.add_event(event("t1", payload={"text": "hi"}, source_event_id="s1"),
                                        1, limits(), now)
        assert receipt.accepted is True
        assert receipt.outcome == "stored"
        assert receipt.coalesced == 0
        [stored] = await store.pending_events("t1")
        assert stored.event.id == receipt.event_id
        assert stored.event.type == "user_message"
        assert stored.event.task_id == "t1"
        assert stored.event.payload == {"text": "hi"}
        assert stored.event.source_event_id == "s1"
        assert stored.event.created_at == pytest.approx(now)
        assert stored.priority == 1
        assert stored.status == "pending"
        assert stored.coalesce is None
        assert [e.event.id for e in await store.list_events("t1")] == [receipt.event_id]

    async def test_add_event_for_unknown_task_raises_task_not_found(self, store: Store) -> None:
        """R3: an event for a task that does not exist is refused, naming the task."""
        with pytest.raises(TaskNotFound, match="ghost"):
            await store.add_event(event("ghost"), 1, limits(), time.time())

    async def test_dedup_by_source_event_id_per_task(self, store: Store) -> None:
        """R6: an event whose source_event_id was already stored for the task is dropped."""
        now = time.time()
        await make_task(store, "t1")
        await make_task(store, "t2")
        first = await store.add_event(event("t1", payload=1, source_event_id="x"), 1, limits(), now)
        again = await store.add_event(event("t1", payload=2, source_event_id="x"), 1, limits(), now)
        assert first.accepted and not again.accepted
        assert again.outcome == "duplicate"
        assert again.event_id == first.event_id
        events = await store.list_events("t1")
        assert [e.event.payload for e in events] == [1]
        other = await store.add_event(event("t2", payload=3, source_event_id="x"), 1, limits(), now)
        assert other.accepted and other.event_id != first.event_id
        no_id = [await store.add_event(event("t1", payload=4), 1, limits(), now) for _ in range(2)]
        assert all(r.accepted for r in no_id)
        assert len(await store.list_events("t1")) == 3

    async def test_dedup_remembers_processed_events(self, store: Store) -> None:
        """R6: an event already processed (applied) is still a duplicate when re-sent."""
        now = time.time()
        await make_task(store, "t1")
        first = await store.add_event(event("t1", source_event_id="x"), 1, limits(), now)
        lease = await claim(store, "t1", now)
        await commit(store, lease, Status.RUNNING, now, events_done=[(first.event_id, "applied")])
        assert await store.pending_events("t1") == []
        again = await store.add_event(event("t1", source_event_id="x"), 1, limits(), now + 60)
        assert again.accepted is False and again.outcome == "duplicate"
        assert await store.pending_events("t1") == []
        [only] = await store.list_events("t1")
        assert only.status == "applied"

    async def test_coalescing_keeps_only_newest_pending_within_window(self, store: Store) -> None:
        """R6, E2: events sharing a coalescing class inside the window collapse to the newest."""
        now = time.time()
        await make_task(store, "t1")
        rule = limits(coalesce="progress", window=2.0)
        r1 = await store.add_event(event("t1", "progress", 1), 3, rule, now)
        r2 = await store.add_event(event("t1", "progress", 2), 3, rule, now + 0.5)
        r3 = await store.add_event(event("t1", "progress", 3), 3, rule, now + 1.0)
        assert r1.coalesced == 0 and r2.coalesced == 1 and r3.coalesced == 1
        assert all(r.accepted for r in (r1, r2, r3))
        [pending] = await store.pending_events("t1")
        assert pending.event.id == r3.event_id and pending.event.payload == 3
        assert pending.coalesce == "progress"
        statuses = {e.event.id: e.status for e in await store.list_events("t1")}
        assert statuses == {r1.event_id: "coalesced", r2.event_id: "coalesced",
                            r3.event_id: "pending"}

    async def test_coalescing_class_shared_across_types(self, store: Store) -> None:
        """E2: a tool timeout, a retry and a degrade signal in one class become one instruction."""
        now = time.time()
        await make_task(store, "t1")
        rule = limits(coalesce="call_recovery", refusable=True)
        for offset, type_ in enumerate(("tool_timeout", "retry", "degrade")):
            await store.add_event(event("t1", type_, {"n": offset}), 2, rule, now + offset * 0.1)
        await store.add_event(event("t1", "model_error"), 2, limits(coalesce="model_recovery"), now)
        pending = await store.pending_events("t1")
        assert sorted(e.event.type for e in pending) == ["degrade", "model_error"]

    async def test_coalescing_outside_window_keeps_both(self, store: Store) -> None:
        """R6: only events inside the window coalesce; an older one stays pending."""
        now = time.time()
        await make_task(store, "t1")
        rule = limits(coalesce="progress", window=1.0)
        first = await store.add_event(event("t1", "progress", 1), 3, rule, now)
        second = await store.add_event(event("t1", "progress", 2), 3, rule, now + 5)
        assert second.coalesced == 0
        assert [e.event.id for e in await store.pending_events("t1")] == [first.event_id,
                                                                          second.event_id]

    async def test_content_events_are_never_coalesced(self, store: Store) -> None:
        """E2: events with coalesce=None (user messages) are never dropped, however close."""
        now = time.time()
        await make_task(store, "t1")
        for n in range(3):
            receipt = await store.add_event(event("t1", "user_message", f"msg {n}"), 1, limits(), now)
            assert receipt.coalesced == 0
        pending = await store.pending_events("t1")
        assert [e.event.payload for e in pending] == ["msg 0", "msg 1", "msg 2"]
        assert all(e.coalesce is None for e in pending)

    async def test_coalescing_is_per_task(self, store: Store) -> None:
        """R6: coalescing collapses events of one task only."""
        now = time.time()
        await make_task(store, "t1")
        await make_task(store, "t2")
        rule = limits(coalesce="progress")
        await store.add_event(event("t1", "progress", 1), 3, rule, now)
        receipt = await store.add_event(event("t2", "progress", 2), 3, rule, now)
        assert receipt.coalesced == 0
        assert len(await store.pending_events("t1")) == 1
        assert len(await store.pending_events("t2")) == 1

    async def test_backpressure_refuses_only_refusable_events(self, store: Store) -> None:
        """R7: past capacity low-priority events are refused with InboxFull; P0/P1 always taken."""
        now = time.time()
        await make_task(store, "t1")
        low = limits(capacity=2, refusable=True)
        high = limits(capacity=2, refusable=False)
        await store.add_event(event("t1", "tool_error", 1), 2, low, now)
        await store.add_event(event("t1", "tool_error", 2), 2, low, now)
        with pytest.raises(InboxFull, match="t1"):
            await store.add_event(event("t1", "heartbeat", 3, source_event_id="hb"), 4, low, now)
        assert len(await store.list_events("t1")) == 2
        taken = await store.add_event(event("t1", "cancel", 4), 0, high, now)
        assert taken.accepted
        assert len(await store.pending_events("t1")) == 3
        # the refused event was not remembered: it is accepted once the inbox drains
        lease = await claim(store, "t1", now)
        done = [(e.event.id, "applied") for e in await store.pending_events("t1")
                if e.event.id is not None]
        await commit(store, lease, Status.RUNNING, now, events_done=done)
        retried = await store.add_event(event("t1", "heartbeat", 3, source_event_id="hb"), 4, low, now)
        assert retried.accepted and retried.outcome == "stored"

    async def test_closed_tasks_take_no_events(self, store: Store) -> None:
        """R11: completed and cancelled tasks refuse events with TaskClosed; nothing is stored."""
        now = time.time()
        for name, status in (("done", Status.COMPLETED), ("gone", Status.CANCELLED)):
            await make_task(store, name)
            await park(store, name, status, now)
            for rule in (limits(), limits(wakes_needs_human=True)):
                with pytest.raises(TaskClosed, match=name):
                    await store.add_event(event(name), 0, rule, now)
            assert await store.list_events(name) == []

    async def test_failed_task_takes_only_control_events(self, store: Store) -> None:
        """R26: a failed task refuses ordinary events but takes control events (resume, rollback)
        and wakes for them."""
        now = time.time()
        await make_task(store, "t1")
        await park(store, "t1", Status.FAILED, now)
        with pytest.raises(TaskClosed):
            await store.add_event(event("t1", "user_message"), 1, limits(), now)
        receipt = await store.add_event(event("t1", "resume"), 0,
                                        limits(wakes_needs_human=True,
                                               reopens=frozenset({Status.FAILED})), now + 1)
        assert receipt.accepted
        woken = await store.claim("w2", now + 2, LEASE)
        assert woken is not None and woken.task_id == "t1"

    async def test_waiting_task_becomes_claimable_after_event(self, store: Store) -> None:
        """E7, R16: a waiting task costs nothing until an event arrives, then it is claimable."""
        now = time.time()
        await make_task(store, "t1")
        await park(store, "t1", Status.WAITING, now)
        assert await store.claim("w2", now + 1, LEASE) is None
        await store.add_event(event("t1", "approval", {"ok": True}), 1, limits(), now + 2)
        woken = await store.claim("w2", now + 3, LEASE)
        assert woken is not None and woken.task_id == "t1"
        assert woken.crashed is False
        assert await store.claim("w3", now + 4, LEASE) is None

    async def test_wake_at_fires_when_due(self, store: Store) -> None:
        """E6: a waiting task with a due time is claimable at (not before) that time."""
        now = time.time()
        await make_task(store, "t1")
        await park(store, "t1", Status.WAITING, now, wake_at=now + 100)
        assert (await store.get_task("t1")).status is Status.WAITING
        assert await store.claim("w2", now + 50, LEASE) is None
        due = await store.claim("w2", now + 101, LEASE)
        assert due is not None and due.task_id == "t1"

    async def test_needs_human_wakes_only_for_control_events(self, store: Store) -> None:
        """R26: a task parked for a person ignores ordinary events but wakes for resume."""
        now = time.time()
        await make_task(store, "t1")
        await park(store, "t1", Status.NEEDS_HUMAN, now, reason="outcome unknown: pay")
        assert (await store.get_task("t1")).reason == "outcome unknown: pay"
        await store.add_event(event("t1", "user_message", "hello?"), 1, limits(), now + 1)
        assert await store.claim("w2", now + 2, LEASE) is None
        await store.add_event(event("t1", "resume"), 0, limits(wakes_needs_human=True), now + 3)
        woken = await store.claim("w2", now + 4, LEASE)
        assert woken is not None and woken.task_id == "t1"

    async def test_pending_events_most_urgent_first_then_oldest(self, store: Store) -> None:
        """R4: the inbox is drained by priority (P0 first), then in arrival order."""
        now = time.time()
        await make_task(store, "t1")
        sent = [("progress", 3), ("user_message", 1), ("cancel", 0), ("approval", 1),
                ("heartbeat", 4), ("user_interrupt", 0)]
        for type_, priority in sent:
            await store.add_event(event("t1", type_), priority, limits(), now)
        pending = await store.pending_events("t1")
        assert [e.event.type for e in pending] == [
            "cancel", "user_interrupt", "user_message", "approval", "progress", "heartbeat"]
        assert [e.priority for e in pending] == [0, 0, 1, 1, 3, 4]
        assert [e.event.type for e in await store.list_events("t1")] == [t for t, _ in sent]

    async def test_events_done_leave_the_inbox_but_stay_listed(self, store: Store) -> None:
        """R5, R19: a commit records what became of each event; processed rows stay stored."""
        now = time.time()
        await make_task(store, "t1")
        ids = []
        for n in range(3):
            receipt = await store.add_event(event("t1", payload=n), 1, limits(), now)
            ids.append(receipt.event_id)
        lease = await claim(store, "t1", now)
        await commit(store, lease, Status.RUNNING, now,
                     events_done=[(ids[0], "applied"), (ids[1], "ignored")])
        assert [e.event.id for e in await store.pending_events("t1")] == [ids[2]]
        statuses = [e.status for e in await store.list_events("t1")]
        assert statuses == ["applied", "ignored", "pending"]

    # ------------------------------------------------------------------ idempotency, recovery log

    async def test_idempotency_records_round_trip(self, store: Store) -> None:
        """R10, E3: an idempotency record keeps its key, tool, args hash, outcome and result."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        started = IdempotencyRecord("t1:f1:0", "t1", "refund", "abc123", "started", attempts=1)
        other = IdempotencyRecord("t1:f1:1", "t1", "lookup", "def456", "failed",
                                  error="ToolTimeout: slow", attempts=2)
        await commit(store, lease, Status.RUNNING, now, idempotency=[started, other])
        got = await store.get_idempotency("t1:f1:0")
        assert got is not None
        assert (got.key, got.task_id, got.tool, got.args_hash, got.status, got.result,
                got.error, got.attempts) == ("t1:f1:0", "t1", "refund", "abc123", "started",
                                             None, None, 1)
        assert got.updated_at > 0
        result = {"refund_id": "r-9", "amount": 12.5, "items": [1, 2], "ok": True}
        done = IdempotencyRecord("t1:f1:0", "t1", "refund", "abc123", "succeeded", result,
                                 attempts=1)
        await commit(store, lease, Status.RUNNING, now, idempotency=[done])
        got = await store.get_idempotency("t1:f1:0")
        assert got is not None and got.status == "succeeded" and got.result == result
        failed = await store.get_idempotency("t1:f1:1")
        assert failed is not None and failed.error == "ToolTimeout: slow" and failed.attempts == 2
        listed = await store.list_idempotency("t1")
        assert sorted((r.key, r.status) for r in listed) == [("t1:f1:0", "succeeded"),
                                                             ("t1:f1:1", "failed")]
        assert await store.get_idempotency("t1:f1:9") is None
        assert await store.list_idempotency("t2") == []

    async def test_recovery_log_round_trip(self, store: Store) -> None:
        """R23: recovery records come back whole, oldest first, per task."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        first = {"task_id": "t1", "checkpoint_version": 1, "event_id": None,
                 "resume_strategy": "restart", "recovery_attempt": 1}
        second = {"task_id": "t1", "checkpoint_version": 2, "event_id": 7,
                  "resume_strategy": "pause", "recovery_attempt": 0, "detail": "user_interrupt"}
        third = {"task_id": "t1", "checkpoint_version": 3, "event_id": None,
                 "resume_strategy": "retry", "recovery_attempt": 2}
        await commit(store, lease, Status.RUNNING, now, recovery_log=[first, second])
        await commit(store, lease, Status.RUNNING, now, recovery_log=[third])
        assert await store.list_recovery_log("t1") == [first, second, third]
        assert await store.list_recovery_log("t2") == []


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
        record = IdempotencyRecord("t1:f:0", "t1", "send", "h", "succeeded", {"id": 1})
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

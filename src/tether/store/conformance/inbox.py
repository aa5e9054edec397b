"""Conformance: the event inbox, idempotency records and the recovery log (R6, R7, R10, R19, R23)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from tether.errors import (
    InboxFull,
    InboxMoved,
    InvalidInput,
    LeaseLost,
    TaskClosed,
    TaskNotFound,
)
from tether.model import EventStatus, IdempotencyRecord, OutcomeStatus, Status
from tether.store.base import Checkpoint, HistoryRow, Store
from tether.store.conformance.helpers import (
    KEEP,
    LEASE,
    claim,
    commit,
    event,
    head,
    limits,
    make_task,
    park,
)


class InboxConformance:
    """Events, idempotency, recovery log. Needs a ``store`` fixture."""

    async def test_count_pending_events_is_the_inbox_depth_over_all_tasks(
            self, store: Store) -> None:
        """R7, R23: stored and not yet applied, over every task (the /metrics inbox depth)."""
        await make_task(store, "a")
        await make_task(store, "b")
        assert await store.count_pending_events() == 0
        await store.add_event(event("a"), 1, limits(), time.time())
        await store.add_event(event("b"), 1, limits(), time.time())
        assert await store.count_pending_events() == 2

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
        await commit(store, lease, Status.RUNNING, now, events_done=[(first.event_id, EventStatus.APPLIED)])
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
        rule = limits(coalesce="recovery", window=1.0)
        first = await store.add_event(event("t1", "tool_error", 1), 2, rule, now)
        second = await store.add_event(event("t1", "tool_error", 2), 2, rule, now + 5)
        assert second.coalesced == 0
        assert [e.event.id for e in await store.pending_events("t1")] == [first.event_id,
                                                                          second.event_id]

    async def test_state_only_events_keep_only_the_newest_at_any_age(self, store: Store) -> None:
        """R4, R7: P3/P4 events only update state, so a newer one of the same type replaces a
        pending older one whatever its age: a parked task's inbox cannot fill with heartbeats."""
        now = time.time()
        await make_task(store, "t1")
        rule = limits(coalesce="heartbeat", window=1.0, capacity=2, refusable=True)
        for n in range(5):
            receipt = await store.add_event(event("t1", "heartbeat", n), 4, rule, now + 10 * n)
            assert receipt.accepted
        pending = await store.pending_events("t1")
        assert [e.event.payload for e in pending] == [4]
        urgent = await store.add_event(event("t1", "tool_error"), 2, limits(refusable=True,
                                                                            capacity=2), now + 60)
        assert urgent.accepted

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
        done = [(e.event.id, EventStatus.APPLIED) for e in await store.pending_events("t1")
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
                     events_done=[(ids[0], EventStatus.APPLIED), (ids[1], EventStatus.IGNORED)])
        assert [e.event.id for e in await store.pending_events("t1")] == [ids[2]]
        statuses = [e.status for e in await store.list_events("t1")]
        assert statuses == ["applied", "ignored", "pending"]

    async def test_a_commit_that_reads_returns_the_inbox_as_it_stands_once_written(
            self, store: Store) -> None:
        """R5, R13, issue 30: commit_reading writes as commit does and hands back what
        pending_events would return right after it (or None, where the backend leaves the
        read to the caller): the events the step applied are gone, the others listed, most
        urgent first; a stale lease writes and reads nothing."""
        now = time.time()
        await make_task(store, "t1")
        ids = [(await store.add_event(event("t1", payload=n), priority, limits(), now)).event_id
               for n, priority in enumerate((2, 1, 0))]
        lease = await claim(store, "t1", now)
        checkpoint = Checkpoint(head=head("t1", Status.RUNNING, 1), status=Status.RUNNING,
                                events_done=[(ids[1], EventStatus.APPLIED)])
        version, pending = await store.commit_reading(lease, checkpoint, 10, now + LEASE)
        assert version == 2 == (await store.get_task("t1")).head_version
        now_pending = await store.pending_events("t1")
        assert [e.event.id for e in now_pending] == [ids[2], ids[0]]
        assert pending is None or pending == now_pending
        stale = dataclasses.replace(lease, fence=lease.fence - 1)
        with pytest.raises(LeaseLost):
            await store.commit_reading(stale, Checkpoint(head=head("t1", Status.RUNNING, 2),
                                                         status=Status.RUNNING), 10, now + LEASE)
        assert (await store.get_task("t1")).head_version == 2

    # ------------------------------------------------------------------ idempotency, recovery log

    async def test_idempotency_records_round_trip(self, store: Store) -> None:
        """R10, E3: an idempotency record keeps its key, tool, args hash, outcome and result."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        started = IdempotencyRecord("t1:f1:0", "t1", "refund", "abc123", OutcomeStatus.STARTED, attempts=1)
        other = IdempotencyRecord("t1:f1:1", "t1", "lookup", "def456", OutcomeStatus.FAILED,
                                  error="ToolTimeout: slow", attempts=2)
        await commit(store, lease, Status.RUNNING, now, idempotency=[started, other])
        got = await store.get_idempotency("t1:f1:0")
        assert got is not None
        assert (got.key, got.task_id, got.tool, got.args_hash, got.status, got.result,
                got.error, got.attempts) == ("t1:f1:0", "t1", "refund", "abc123", "started",
                                             None, None, 1)
        assert got.updated_at > 0
        result = {"refund_id": "r-9", "amount": 12.5, "items": [1, 2], "ok": True}
        done = IdempotencyRecord("t1:f1:0", "t1", "refund", "abc123", OutcomeStatus.SUCCEEDED, result,
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
        assert await store.idempotency_keys("t1") == {"t1:f1:0", "t1:f1:1"}
        assert await store.idempotency_keys("t2") == set()

    async def test_a_tasks_records_are_its_own_though_another_ids_begins_with_its(
            self, store: Store) -> None:
        """Issue 30 (R10): a task's records are found by their keys' prefix, its id and a
        colon; a task whose id begins with that ("t1:f1") is another task: its records are
        not listed, read back as keys or deleted with the first's."""
        now = time.time()
        for task_id, key in (("t1", "t1:f1:0"), ("t1:f1", "t1:f1:f1:0")):
            await make_task(store, task_id)
            lease = await claim(store, task_id, now)
            record = IdempotencyRecord(key, task_id, "refund", "h", OutcomeStatus.SUCCEEDED, 1)
            await commit(store, lease, Status.COMPLETED, now, idempotency=[record])
            await store.release(lease)
        assert await store.idempotency_keys("t1") == {"t1:f1:0"}
        assert [r.key for r in await store.list_idempotency("t1")] == ["t1:f1:0"]
        assert await store.idempotency_keys("t1:f1") == {"t1:f1:f1:0"}
        await store.delete_task("t1", now + 2 * LEASE)
        assert await store.get_idempotency("t1:f1:0") is None
        assert await store.idempotency_keys("t1:f1") == {"t1:f1:f1:0"}
        kept = await store.get_idempotency("t1:f1:f1:0")
        assert kept is not None and kept.task_id == "t1:f1"

    @pytest.mark.parametrize(("key", "owner"), [("t2:f1:0", "t1"), ("t1:f1:0", "t2"),
                                                ("t1-f1-0", "t1"), ("t1", "t1")])
    async def test_a_record_that_is_not_the_tasks_own_is_refused(
            self, store: Store, key: str, owner: str) -> None:
        """Issue 30 (R10): a checkpoint may hold only its task's records, keyed by its id and a
        colon (the prefix the task's records are found by); another is refused, naming it,
        and nothing of the checkpoint is written."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        version = await commit(store, lease, Status.RUNNING, now)
        stray = IdempotencyRecord(key, owner, "refund", "h", OutcomeStatus.STARTED, attempts=1)
        with pytest.raises(InvalidInput, match=f"{key!r}.*not this task's"):
            await commit(store, lease, Status.RUNNING, now, step=2, idempotency=[stray],
                         history=[HistoryRow(0, 1, {"role": "tool_call"})])
        assert (await store.get_task("t1")).head_version == version
        assert await store.get_idempotency(key) is None
        assert await store.read_history("t1", [[0, -1]]) == []

    async def test_a_checkpoint_made_on_what_the_inbox_held_is_not_written_once_it_moved(
            self, store: Store) -> None:
        """Issue 30 (R4, R10): a call's resume point is written only if the inbox holds
        nothing its runner has not read; an event stored after the read refuses it whole (no
        new version, no dialog row, no call record), and once the runner has read that event
        too (or this checkpoint consumes it) it is written."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        seen = (await store.add_event(event("t1", "note"), 3, limits(), now)).event_id
        started = IdempotencyRecord("t1:f1:0", "t1", "refund", "abc", OutcomeStatus.STARTED,
                                    attempts=1)
        row = HistoryRow(0, 1, {"role": "tool_call", "tool": "refund"})
        version = await commit(store, lease, Status.RUNNING, now, idempotency=[started],
                               history=[row], inbox_seen=frozenset({seen}))
        newer = (await store.add_event(event("t1", "user_message", {"text": "stop"}), 1,
                                       limits(), now)).event_id
        refused = [started, IdempotencyRecord("t1:f1:1", "t1", "refund", "abc",
                                              OutcomeStatus.STARTED, attempts=1)]
        with pytest.raises(InboxMoved, match="t1"):
            await commit(store, lease, Status.RUNNING, now, step=2, idempotency=refused,
                         history=[HistoryRow(0, 2, {"role": "tool_call"})],
                         inbox_seen=frozenset({seen}))
        assert (await store.get_task("t1")).head_version == version  # nothing of it written
        assert await store.get_idempotency("t1:f1:1") is None
        assert await store.read_history("t1", [[0, -1]]) == [row.entry]
        assert [e.event.id for e in await store.pending_events("t1")] == [newer, seen]
        consumed = await commit(store, lease, Status.RUNNING, now, step=2,
                                events_done=[(newer, EventStatus.APPLIED)],
                                inbox_seen=frozenset({seen}))
        assert consumed > version  # the event it consumes is not one it missed
        assert await commit(store, lease, Status.RUNNING, now, step=3, inbox_seen=frozenset(
            {seen, newer})) > consumed

    async def test_a_store_goes_on_writing_between_refused_checkpoints(
            self, store: Store) -> None:
        """R4, R10: a refusal leaves nothing behind in the store's connections. Checkpoints
        written and refused by turns, each reading the inbox in its round trip (a statement
        queued behind the refused one): every written one lands and reads what is pending."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        seen: frozenset[int] = frozenset()
        for step in range(1, 21, 2):
            version, pending = await store.commit_reading(lease, Checkpoint(
                head=head("t1", Status.RUNNING, step), status=Status.RUNNING,
                inbox_seen=seen), KEEP, now + LEASE)
            assert version == (await store.get_task("t1")).head_version
            assert pending is None or {e.event.id for e in pending} == seen
            arrived = (await store.add_event(event("t1", "note", step), 3, limits(),
                                             now)).event_id
            with pytest.raises(InboxMoved):  # made before the event arrived
                await store.commit_reading(lease, Checkpoint(
                    head=head("t1", Status.RUNNING, step + 1), status=Status.RUNNING,
                    inbox_seen=seen), KEEP, now + LEASE)
            seen |= {arrived}

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


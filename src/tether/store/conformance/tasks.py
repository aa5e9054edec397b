"""Conformance: the task index, leases and fencing, checkpoints, versions and history (R13, R14)."""

from __future__ import annotations

import time

import pytest

from tether.errors import (
    LeaseLost,
    TaskNotFound,
    TetherError,
    VersionNotFound,
)
from tether.model import EventStatus, IdempotencyRecord, OutcomeStatus, Snapshot, Status, TaskRecord
from tether.store.base import Checkpoint, Claim, HistoryRow, Store, TaskQuery
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


class TaskConformance:
    """Tasks, leases, checkpoints. Needs a ``store`` fixture."""

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

    async def test_find_tasks_pages_people_s_work_first_filtered_in_the_store(
            self, store: Store) -> None:
        """R2, R26: the console's list: by status, agent and a piece of the id or reason
        (case-insensitive; LIKE's wildcards are plain characters), people's work first,
        newest change first, page after page with no task twice and none left out."""
        now = time.time()
        for n in range(12):
            record = TaskRecord(f"job-{n:02d}", "echo" if n % 2 else "other", Status.PENDING,
                                now - 100 + n, now - 100 + n, 1)
            await store.create_task(record, head(record.task_id))
        await park(store, "job-03", Status.NEEDS_HUMAN, now, reason="Refund 100% done?")
        await park(store, "job-05", Status.WAITING, now)
        every = await store.find_tasks(TaskQuery(limit=100))
        assert [t.task_id for t in every[:2]] == ["job-03", "job-05"]  # people's work first
        pending = [t.task_id for t in every[2:]]
        assert pending == sorted(pending, reverse=True)  # newest first within a status
        pages = [await store.find_tasks(TaskQuery(offset=o, limit=5)) for o in (0, 5, 10)]
        assert [t.task_id for page in pages for t in page] == [t.task_id for t in every]
        echo = await store.find_tasks(TaskQuery(agent="echo", status=Status.PENDING))
        assert {t.task_id for t in echo} == {"job-01", "job-07", "job-09", "job-11"}
        assert [t.task_id for t in await store.find_tasks(TaskQuery(text="JOB-1"))] == [
            "job-11", "job-10"]
        assert [t.task_id for t in await store.find_tasks(TaskQuery(text="100%"))] == ["job-03"]
        assert await store.find_tasks(TaskQuery(text="%")) == await store.find_tasks(
            TaskQuery(text="100%"))  # a % is a character, not "anything"
        assert await store.find_tasks(TaskQuery(text="job_0")) == []  # so is _
        assert await store.find_tasks(TaskQuery(offset=12)) == []

    async def test_count_by_status(self, store: Store) -> None:
        """R2: counts of tasks per status."""
        now = time.time()
        for name in ("a", "b", "c"):
            await make_task(store, name)
        await park(store, "c", Status.COMPLETED, now)
        assert await store.count_by_status() == {"pending": 2, "completed": 1}

    async def test_integrity_check_finds_nothing_wrong_with_a_store_in_use(
            self, store: Store) -> None:
        """Issue 13: integrity_check returns [] for a sound store: empty, and after tasks,
        commits past the kept versions, events, history and idempotency records."""
        assert await store.integrity_check() == []
        now = time.time()
        for name in ("a", "b", "c"):
            await make_task(store, name)
        lease = await claim(store, "a", now)
        for step in range(1, 5):
            await commit(store, lease, Status.RUNNING, now, step=step, keep=2,
                         history=[HistoryRow(0, step, {"role": "tool", "content": step})],
                         idempotency=[IdempotencyRecord(f"a:f:{step}", "a", "t", "h",
                                                        OutcomeStatus.SUCCEEDED, step)])
        await store.add_event(event("b", payload="hi"), 1, limits(), now)
        await park(store, "c", Status.COMPLETED, now)
        assert await store.integrity_check() == []

    async def test_ping_answers_when_the_store_can_take_a_write(self, store: Store) -> None:
        """Issue 13: ping returns on a store that works (no StoreUnavailable), changing nothing."""
        await make_task(store, "t1")
        before = await store.get_task("t1")
        await store.ping()
        assert await store.get_task("t1") == before

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

    async def test_claims_made_together_never_hand_one_task_to_two(self, store: Store) -> None:
        """A worker claims for its free slots side by side (one transaction in SQLite): every
        task goes to exactly one claim, and the claims beyond the work find none."""
        import asyncio

        now = time.time()
        for n in range(5):
            await make_task(store, f"t{n}", created_at=now - 10 + n)
        claims = await asyncio.gather(*(store.claim("w1", now, LEASE) for _ in range(8)))
        taken = [c.task_id for c in claims if c is not None]
        assert sorted(taken) == [f"t{n}" for n in range(5)]
        assert claims.count(None) == 3
        assert await store.claim("w2", now, LEASE) is None

    async def test_a_batch_claim_takes_the_soonest_due_up_to_its_size(self, store: Store
                                                                      ) -> None:
        """R13, E7: one batch claim takes at most its size, the soonest due first, never a
        busy task; a second batch takes the rest; batches made side by side never hand one
        task to two; with no work left a batch is empty."""
        import asyncio

        now = time.time()
        for n in range(9):
            await make_task(store, f"t{n}", created_at=now - 20 + n)
        first = await store.claim_many("w1", now, LEASE, 3, busy=("t0",))
        assert sorted(c.task_id for c in first) == ["t1", "t2", "t3"]
        assert all(c.started and not c.crashed for c in first)
        for held in first:
            record = await store.get_task(held.task_id)
            assert record.lease_owner == "w1" and record.status is Status.RUNNING
        side_by_side = await asyncio.gather(*(store.claim_many("w2", now, LEASE, 2)
                                              for _ in range(4)))
        taken = [c.task_id for batch in side_by_side for c in batch]
        assert sorted(taken) == ["t0", "t4", "t5", "t6", "t7", "t8"]
        assert await store.claim_many("w3", now, LEASE, 5) == []
        later = await store.claim_many("w3", now + LEASE + 1, LEASE, 2)
        assert len(later) == 2 and all(c.crashed for c in later)

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

    async def test_a_claim_starts_a_pending_task_and_only_a_pending_one(self, store: Store
                                                                        ) -> None:
        """R2: the claim of a pending task shows it running at once (in the claim's own
        transaction: no second write); a task already running (its holder died) keeps its
        status, reason and due time, and its claim says it started nothing."""
        now = time.time()
        record = TaskRecord("later", "echo", Status.PENDING, now, now, 1)
        await store.create_task(record, head("later"), wake_at=now + 5)
        started = await store.claim("w1", now + 6, LEASE)
        assert started is not None and started.task_id == "later" and started.started
        shown = await store.get_task("later")
        assert (shown.status, shown.reason, shown.wake_at) == (Status.RUNNING, None, None)
        await commit(store, started, Status.RUNNING, now + 7, wake_at=now + 3600)
        taken = await store.claim("w2", now + 7 + 2 * LEASE, LEASE)
        assert taken is not None and taken.crashed and not taken.started
        again = await store.get_task("later")
        assert again.status is Status.RUNNING and again.wake_at == pytest.approx(now + 3600)
        await make_task(store, "direct")
        direct = await store.claim_task("direct", "w3", now, LEASE)
        assert direct is not None and direct.started
        assert (await store.get_task("direct")).status is Status.RUNNING

    # ------------------------------------------------------------------ due times (E6)

    async def test_a_scheduled_task_is_claimed_only_once_due(self, store: Store) -> None:
        """E6: ``create_task(wake_at=)`` (a scheduled start): nobody claims it before then."""
        now = time.time()
        record = TaskRecord("later", "echo", Status.PENDING, now, now, 1)
        await store.create_task(record, head("later"), wake_at=now + 60)
        assert (await store.get_task("later")).wake_at == pytest.approx(now + 60)
        assert await store.claim("w1", now + 59, LEASE) is None
        due = await store.claim("w1", now + 61, LEASE)
        assert due is not None and due.task_id == "later" and not due.crashed

    async def test_a_running_task_parked_until_a_back_off_ends_wakes_then_or_on_an_event(
            self, store: Store) -> None:
        """E6: a running task released with a future wake_at (a long retry back-off) is not
        claimable before it, unless a P0-P2 event arrives; a P3 signal does not wake it."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        await store.set_status(lease, Status.RUNNING, None, wake_at=now + 60)
        await store.release(lease)
        assert await store.claim("w2", now + 1, LEASE) is None
        await store.add_event(event("t1", "progress"), 3, limits(coalesce="progress"), now + 1)
        assert await store.claim("w2", now + 2, LEASE) is None
        await store.add_event(event("t1", "retry"), 2, limits(), now + 2)
        woken = await store.claim("w2", now + 3, LEASE)
        assert woken is not None and woken.task_id == "t1" and not woken.crashed

    async def test_a_dead_holders_task_is_recovered_at_once_whatever_its_due_time(
            self, store: Store) -> None:
        """E5, E6: a running task committed with a future wake_at whose worker then died is
        recovered as soon as the lease expires, not left until the due time."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        await commit(store, lease, Status.RUNNING, now, wake_at=now + 3600)
        taken = await store.claim("w2", now + 2 * LEASE, LEASE)
        assert taken is not None and taken.task_id == "t1" and taken.crashed

    async def test_a_dead_workers_task_is_claimed_before_older_new_work(self, store: Store) -> None:
        """R13, E5: recovery comes first: a task whose worker died is claimed before a backlog
        of pending tasks, however old, so it never waits behind new work."""
        now = time.time()
        await make_task(store, "backlog", created_at=now - 100)
        await make_task(store, "orphan", created_at=now)
        lease = await claim(store, "orphan", now)
        await commit(store, lease, Status.RUNNING, now)
        first = await store.claim("w2", now + 2 * LEASE, LEASE)
        assert first is not None and first.task_id == "orphan" and first.crashed

    async def test_blobs_are_stored_once_with_the_task_or_checkpoint_that_brings_them(
            self, store: Store) -> None:
        """R20: large values arrive with create_task or a commit, in the same transaction, and
        the same digest twice is one value; unknown digests are simply absent."""
        now = time.time()
        record = TaskRecord("t1", "echo", Status.PENDING, now, now, 1)
        await store.create_task(record, head("t1"), blobs={"sha256:a": b"A" * 100})
        lease = await claim(store, "t1", now)
        await commit(store, lease, Status.RUNNING, now,
                     blobs={"sha256:a": b"A" * 100, "sha256:b": b"B" * 200})
        found = await store.load_blobs(["sha256:a", "sha256:b", "sha256:none"])
        assert found == {"sha256:a": b"A" * 100, "sha256:b": b"B" * 200}
        assert await store.load_blobs([]) == {}

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

    async def test_leased_tasks_are_the_unfinished_ones_a_worker_holds(self, store: Store
                                                                      ) -> None:
        """Issue 29: a task claimed and not yet committed (its claim started it: a worker
        killed before its first checkpoint leaves it so) is leased as much as one that
        committed; released and finished tasks are not, and the soonest lease end comes
        first."""
        now = time.time()
        for task_id in ("claimed", "running", "parked", "free"):
            await make_task(store, task_id)
        await claim(store, "claimed", now + 1, worker="w2")
        running = await claim(store, "running", now)
        await commit(store, running, Status.RUNNING, now)
        await park(store, "parked", Status.WAITING, now)
        assert [(t.task_id, t.status, t.lease_owner) for t in await store.leased_tasks()] == [
            ("running", Status.RUNNING, "w1"), ("claimed", Status.RUNNING, "w2")]
        assert [t.task_id for t in await store.leased_tasks(limit=1)] == ["running"]

    async def test_a_lease_broken_for_a_dead_holder_is_claimable_at_once(self, store: Store
                                                                         ) -> None:
        """Issue 29: a worker that knows the holder is dead ends its lease; the task is claimed
        now, as a crash, and the fence moves on. Only the holder named: another's lease, or
        one already released, is left alone."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        await commit(store, lease, Status.RUNNING, now)
        holder = (await store.get_task("t1")).lease_owner
        assert holder is not None
        assert not await store.break_lease("t1", "someone-else")
        assert await store.claim("w2", now + 1, LEASE) is None  # still held
        assert await store.break_lease("t1", holder)
        taken = await store.claim("w2", now + 1, LEASE)
        assert taken is not None and taken.task_id == "t1" and taken.crashed
        assert taken.fence > lease.fence
        assert not await store.break_lease("t1", holder)  # not its lease any more

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
            events_done=[(pending.event.id, EventStatus.APPLIED)],
            idempotency=[IdempotencyRecord("t1:f:1", "t1", "pay", "h", OutcomeStatus.SUCCEEDED, 1)],
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

    async def test_release_with_hold_keeps_the_wake_for_later(self, store: Store) -> None:
        """E6, E8: a worker backing off (hold_until) neither takes the task's wake away nor
        lets it be claimed again before the hold ends; afterwards it is due again."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        await commit(store, lease, Status.WAITING, now, wake_at=now + 1)
        await store.release(lease)
        woken = await store.claim("w2", now + 2, LEASE)
        assert woken is not None
        await store.release(woken, hold_until=now + 50)
        assert await store.claim("w3", now + 10, LEASE) is None
        later = await store.claim("w3", now + 60, LEASE)
        assert later is not None and later.task_id == "t1"

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

    async def test_lowering_keep_drops_the_versions_beyond_it(self, store: Store) -> None:
        """R14: keep_versions may be lowered between runs; the next commit keeps only the new
        number (a store that reuses the row of the version it retires must still drop the
        rest)."""
        now = time.time()
        await make_task(store, "t1")
        lease = await claim(store, "t1", now)
        for step in range(1, 6):
            await commit(store, lease, Status.RUNNING, now, step=step, keep=5)
        assert [v for v, _, _ in await store.list_versions("t1")] == [2, 3, 4, 5, 6]
        await commit(store, lease, Status.RUNNING, now, step=6, keep=2)
        assert [v for v, _, _ in await store.list_versions("t1")] == [6, 7]
        version, data = await store.load_head("t1", 7)
        assert version == 7 and Snapshot.loads(data, "t1", 7).step == 6

    async def test_commits_of_many_tasks_at_once_each_land_or_fail_alone(
            self, store: Store) -> None:
        """Checkpoints of tasks running side by side may share a transaction (group commit):
        each good one lands whole, and a stale one fails with LeaseLost writing nothing."""
        import asyncio

        now = time.time()
        leases = []
        for n in range(6):
            await make_task(store, f"t{n}")
            leases.append(await claim(store, f"t{n}", now))
        stale = leases[3]
        await claim(store, "t3", now + 2 * LEASE, worker="w2")

        def checkpoint(n: int) -> Checkpoint:
            return Checkpoint(head=head(f"t{n}", Status.RUNNING, 1), status=Status.RUNNING,
                              history=[HistoryRow(0, 1, {"role": "tool", "content": n})],
                              idempotency=[IdempotencyRecord(f"t{n}:f:0", f"t{n}", "pay", "h",
                                                             OutcomeStatus.SUCCEEDED, n)])

        results = await asyncio.gather(
            *(store.commit(lease, checkpoint(n), KEEP, now + LEASE)
              for n, lease in enumerate(leases)), return_exceptions=True)
        assert isinstance(results[3], LeaseLost) and stale.task_id == "t3"
        assert [r for n, r in enumerate(results) if n != 3] == [2] * 5
        for n in (0, 1, 2, 4, 5):
            assert (await store.get_task(f"t{n}")).head_version == 2
            assert await store.read_history(f"t{n}", [[0, -1]]) == [{"role": "tool", "content": n}]
            record = await store.get_idempotency(f"t{n}:f:0")
            assert record is not None and record.result == n
        assert [v for v, _, _ in await store.list_versions("t3")] == [1]
        assert await store.read_history("t3", [[0, -1]]) == []
        assert await store.get_idempotency("t3:f:0") is None

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
        then the new epoch. Counting a branch's rows (what a runner does at load, R20) gives
        what reading them gives."""
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
        for segments in ([[0, 3], [epoch, -1]], [[0, -1]], [[0, 2]], [[7, -1]], [[0, 0]],
                         [[0, 3], [epoch, 4]], [[epoch, -1]]):
            assert await store.count_history("t1", segments) == len(
                await store.read_history("t1", segments)), segments
        assert await store.count_history("ghost", [[0, -1]]) == 0

    async def test_a_task_created_paused_is_written_whole_before_any_worker_sees_it(
            self, store: Store) -> None:
        """R14: how a fork is written through this protocol: created paused (no worker
        claims it), its lever takes it with claim_task, commits the copied dialog and the
        status it goes on in, and releases it; only then does a worker claim it."""
        now = time.time()
        record = TaskRecord("fork", "echo", Status.PAUSED, now, now, 1, reason="being forked")
        await store.create_task(record, head("fork", Status.PAUSED))
        assert await store.claim("w1", now, LEASE) is None
        lever = await claim(store, "fork", now, worker="fork:lever")
        rows = [HistoryRow(0, seq, {"role": "user", "n": seq}) for seq in range(1, 4)]
        await commit(store, lever, Status.RUNNING, now, history=rows, progress=True)
        await store.release(lever)
        got = await store.get_task("fork")
        assert (got.status, got.reason, got.head_version) == (Status.RUNNING, None, 2)
        assert [e["n"] for e in await store.read_history("fork", [[0, -1]])] == [1, 2, 3]
        worker = await store.claim("w1", now, LEASE)
        assert worker is not None and worker.task_id == "fork" and not worker.crashed

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


"""Conformance: deleting a task, finished tasks past their retention, and collecting the
large values no kept version refers to (issue 19, R20)."""

from __future__ import annotations

import time

import pytest

from tether import blobs
from tether.errors import LeaseLost, TaskHeld, TaskNotFound
from tether.model import Status, TaskRecord
from tether.store.base import HistoryRow, Store
from tether.store.conformance.helpers import LEASE, claim, commit, event, head, limits, make_task
from tether.store.retention_steps import GRACE


async def finished(store: Store, task_id: str, status: Status, at: float) -> None:
    """A task that ran (a dialog row, an event, a recovery record) and finished at *at*."""
    await make_task(store, task_id, created_at=at)
    await store.add_event(event(task_id), 1, limits(), at)
    lease = await claim(store, task_id, at)
    await commit(store, lease, status, at, history=[HistoryRow(0, 1, {"role": "user"})],
                 recovery_log=[{"resume_strategy": "resume", "at": at}])
    await store.release(lease)


class RetentionConformance:
    """Deleting. Needs a ``store`` fixture."""

    async def test_delete_removes_everything_the_task_stored(self, store: Store) -> None:
        """Issue 19: a deleted task leaves no row behind; another task is untouched."""
        now = time.time()
        await finished(store, "gone", Status.COMPLETED, now)
        await finished(store, "kept", Status.COMPLETED, now)
        await store.delete_task("gone", now)
        with pytest.raises(TaskNotFound, match="gone"):
            await store.get_task("gone")
        assert await store.list_versions("gone") == []
        assert await store.read_history("gone", [[0, -1]]) == []
        assert await store.list_events("gone") == []
        assert await store.list_recovery_log("gone") == []
        assert [t.task_id for t in await store.list_tasks()] == ["kept"]
        assert len(await store.read_history("kept", [[0, -1]])) == 1
        with pytest.raises(TaskNotFound):
            await store.delete_task("gone", now)
        await make_task(store, "gone")  # the id can be used again, from scratch
        assert (await store.get_task("gone")).head_version == 1

    async def test_a_claim_on_a_deleted_task_never_writes_to_its_successor(
            self, store: Store) -> None:
        """Issue 26, R13: a worker paused past its lease on a task that was then deleted and
        submitted again under its id holds a fence the new task never reaches (fences start
        from the creation time, not 0): its late write is refused, the new task untouched."""
        now = time.time()
        await make_task(store, "again", created_at=now)
        stale = await claim(store, "again", now, worker="paused")
        await commit(store, stale, Status.COMPLETED, now)  # then paused before letting go
        await store.delete_task("again", now + 2 * LEASE)
        await make_task(store, "again", created_at=now + 2 * LEASE + 1)
        await claim(store, "again", now + 2 * LEASE + 2, worker="w2")  # as often as the old one
        with pytest.raises(LeaseLost):
            await commit(store, stale, Status.COMPLETED, now + 2 * LEASE + 3, step=7)
        record = await store.get_task("again")  # as its own claim left it: started, version 1
        assert (record.status, record.head_version) == (Status.RUNNING, 1)

    async def test_a_task_held_by_a_live_lease_is_not_deleted(self, store: Store) -> None:
        """Issue 19: deleting never races the worker that holds the task."""
        now = time.time()
        await make_task(store, "busy")
        await claim(store, "busy", now)
        with pytest.raises(TaskHeld, match="w1"):
            await store.delete_task("busy", now)
        assert (await store.get_task("busy")).lease_owner == "w1"
        with pytest.raises(TaskHeld):  # running: even once the lease ran out, recovery owns it
            await store.delete_task("busy", now + LEASE + 1)

    async def test_purge_deletes_finished_tasks_past_their_status_s_cutoff(
            self, store: Store) -> None:
        """Issue 19: retention per status; tasks still open, held or recent stay."""
        now = time.time()
        await finished(store, "old-done", Status.COMPLETED, now)
        await finished(store, "old-failed", Status.FAILED, now)
        await make_task(store, "open", created_at=now)
        cutoff = time.time() + 1e-6  # the store stamps a change with its own clock
        await finished(store, "new-done", Status.COMPLETED, now)
        deleted = await store.purge_finished({"completed": cutoff}, time.time())
        assert deleted == ["old-done"]
        assert sorted(t.task_id for t in await store.list_tasks()) == [
            "new-done", "old-failed", "open"]
        assert await store.purge_finished({"completed": cutoff, "failed": cutoff},
                                          time.time(), limit=5) == ["old-failed"]

    async def test_collect_blobs_keeps_what_a_kept_version_refers_to(self, store: Store) -> None:
        """R20, issue 19: large values of deleted tasks (and of pruned versions) go; those
        a kept head refers to stay, shared or not."""
        big_kept, big_gone = "k" * 5000, "g" * 5000
        old = time.time() - GRACE - 10
        kept_head, kept_blobs = blobs.layered(head("kept", signals={"doc": big_kept}), 1000)
        gone_head, gone_blobs = blobs.layered(head("gone", signals={"doc": big_gone}), 1000)
        for task_id, stored, large in (("kept", kept_head, kept_blobs),
                                       ("gone", gone_head, gone_blobs)):
            record = TaskRecord(task_id, "echo", Status.COMPLETED, old, old, 1)
            await store.create_task(record, stored, blobs=large)
        await store.delete_task("gone", time.time())
        assert await store.collect_blobs(time.time()) == 1
        assert await store.load_blobs(set(kept_blobs)) == kept_blobs
        assert await store.load_blobs(set(gone_blobs)) == {}
        assert await store.collect_blobs(time.time()) == 0

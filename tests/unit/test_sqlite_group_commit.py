"""Group commit in the SQLite store (issue 7): checkpoints of tasks running side by side
share one transaction (one fsync), a lone task is not held back, and a checkpoint handed in
is written even if its caller is cancelled before the batch commits (R13)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

import tether as tt
from tether.errors import LeaseLost
from tether.model import Status
from tether.store import SQLiteStore
from tether.store.base import Checkpoint
from tether.store.conformance.helpers import LEASE, claim, head, make_task


def count_statements(store: SQLiteStore, *wanted: str) -> list[list[str]]:
    seen: list[list[str]] = [[] for _ in wanted]

    def note(sql: str) -> None:
        if sql in wanted:
            seen[wanted.index(sql)].append(sql)

    store._db.set_trace_callback(note)
    return seen


def count_commits(store: SQLiteStore) -> list[str]:
    return count_statements(store, "COMMIT")[0]


def checkpoint(task_id: str, step: int) -> Checkpoint:
    return Checkpoint(head=head(task_id, Status.RUNNING, step), status=Status.RUNNING)


async def test_checkpoints_of_tasks_committing_together_share_one_transaction(
        tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "t.db"))
    now = time.time()
    leases = []
    for n in range(20):
        await make_task(store, f"t{n}")
        leases.append(await claim(store, f"t{n}", now))
    commits = count_commits(store)
    versions = await asyncio.gather(*(store.commit(lease, checkpoint(lease.task_id, 1), 10,
                                                   now + LEASE) for lease in leases))
    assert versions == [2] * 20
    assert len(commits) == 1
    await store.commit(leases[0], checkpoint("t0", 2), 10, now + LEASE)  # alone: its own
    assert len(commits) == 2
    await store.close()


async def test_a_cancelled_caller_s_checkpoint_is_still_written(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "t.db"))
    now = time.time()
    await make_task(store, "a")
    await make_task(store, "b")
    lease_a, lease_b = await claim(store, "a", now), await claim(store, "b", now)
    leader = asyncio.ensure_future(store.commit(lease_a, checkpoint("a", 1), 10, now + LEASE))
    follower = asyncio.ensure_future(store.commit(lease_b, checkpoint("b", 1), 10, now + LEASE))
    await asyncio.sleep(0)  # both have handed their checkpoints in; the leader is yielding
    follower.cancel()
    assert await leader == 2
    assert follower.cancelled()
    reopened = SQLiteStore(str(tmp_path / "t.db"))
    assert (await reopened.get_task("b")).head_version == 2
    await reopened.close()
    await store.close()


async def test_many_tasks_run_by_one_worker_need_far_fewer_transactions_than_steps(
        tmp_path: Path) -> None:
    """The whole harness: 50 tasks of 5 quick steps at concurrency 50 make ~300 checkpoints
    but share transactions; every task still completes with its whole dialog."""
    h = tt.Harness(f"sqlite:///{tmp_path / 'h.db'}")

    @h.tool()
    async def work(ctx: tt.ToolContext, n: int) -> int:
        return n

    @h.agent("stepper")
    class Stepper(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.ToolCall("work", {"n": task.step}) if task.step < 5 else tt.Finish(task.step)

    ids = [await h.submit("stepper") for _ in range(50)]
    store = h.store
    assert isinstance(store, SQLiteStore)
    said: list[str] = []
    store._db.set_trace_callback(said.append)
    await h.run_until_idle(concurrency=50)
    assert await store.count_by_status() == {"completed": 50}
    for task_id in ids:
        history = await h.history(task_id)
        assert [row["content"] for row in history if row.get("role") == "tool"] == [0, 1, 2, 3, 4]
    checkpoints = sum(s.startswith("SELECT fence") and "AS newest" in s for s in said)
    assert checkpoints >= 50 * 6  # five steps and the finish, at least one each
    transactions = said.count("COMMIT")  # the 50 claims included; one each, without group commit
    assert transactions < 50 + checkpoints / 2, f"{transactions} transactions, {checkpoints}" \
        " checkpoints"
    await h.close()


async def test_releases_of_tasks_ending_together_share_one_transaction(tmp_path: Path) -> None:
    """A worker recovering many tasks ends them together: their releases share a commit, and
    a stale lease among them fails alone (issue 15)."""
    store = SQLiteStore(str(tmp_path / "t.db"))
    now = time.time()
    leases = []
    for n in range(10):
        await make_task(store, f"t{n}")
        leases.append(await claim(store, f"t{n}", now))
    stale = dataclasses.replace(leases[3], fence=leases[3].fence - 1)
    commits = count_commits(store)
    found = await asyncio.gather(*(store.release(lease) for lease in [*leases[:3], stale,
                                                                     *leases[4:]]),
                                 return_exceptions=True)
    assert len(commits) == 1
    assert isinstance(found[3], LeaseLost)
    assert [found[n] for n in range(10) if n != 3] == [None] * 9
    owners = [(await store.get_task(f"t{n}")).lease_owner for n in range(10)]
    assert owners == [None, None, None, "w1", *[None] * 6]
    await store.close()


async def test_a_lone_checkpoint_takes_no_savepoint_and_fails_whole(tmp_path: Path) -> None:
    """One checkpoint in its transaction (one task committing, the common case) runs no
    savepoint: its failure rolls back a transaction that holds nothing else. A stale lease
    is refused with nothing written, and the next checkpoint is written as usual."""
    store = SQLiteStore(str(tmp_path / "t.db"))
    now = time.time()
    await make_task(store, "t")
    lease = await claim(store, "t", now)
    commits, savepoints = count_statements(store, "COMMIT", "SAVEPOINT checkpoint")
    assert await store.commit(lease, checkpoint("t", 1), 10, now + LEASE) == 2
    assert (len(commits), len(savepoints)) == (1, 0)
    stale = dataclasses.replace(lease, fence=lease.fence - 1)
    with pytest.raises(LeaseLost):
        await store.commit(stale, checkpoint("t", 2), 10, now + LEASE)
    assert (await store.get_task("t")).head_version == 2
    assert not store._db.in_transaction
    assert await store.commit(lease, checkpoint("t", 2), 10, now + LEASE) == 3
    await store.close()

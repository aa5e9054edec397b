"""R13 on PostgreSQL (issue 15): a checkpoint is one ``tether_checkpoint`` call, and the
checkpoints of tasks committing side by side share one transaction, as on SQLite. A stale
fence in a batch fails only its own task; a cancelled caller's checkpoint is still written."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Collection
from typing import Any

import psycopg
import pytest

import services
from tether.errors import InboxMoved, LeaseLost, StoreError, TaskNotFound
from tether.model import EventStatus, Status
from tether.store.base import Checkpoint, Claim
from tether.store.conformance.helpers import LEASE, claim, event, head, limits, make_task
from tether.store.postgres import PostgresStore

pytestmark = pytest.mark.postgres


def checkpoint(task_id: str, step: int) -> Checkpoint:
    return Checkpoint(head=head(task_id, Status.RUNNING, step), status=Status.RUNNING)


def writers_of(url: str, version: int) -> dict[str, int]:
    """The transaction (xmin) that wrote each task's snapshot row *version*."""
    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT task_id, xmin::text::bigint FROM snapshots"
                             " WHERE version = %s", (version,)).fetchall()
    return {task_id: xid for task_id, xid in found}


async def leased(store: PostgresStore, names: list[str]) -> list[Claim]:
    now = time.time()
    for name in names:
        await make_task(store, name)
    return [await claim(store, name, now) for name in names]


async def test_checkpoints_committing_together_share_one_transaction(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    leases = await leased(store, [f"t{n}" for n in range(12)])
    now = time.time()
    versions = await asyncio.gather(*(store.commit(lease, checkpoint(lease.task_id, 1), 10,
                                                   now + LEASE) for lease in leases))
    assert versions == [2] * 12
    assert len(set(writers_of(pg_url, 2).values())) == 1
    await store.commit(leases[0], checkpoint("t0", 2), 10, now + LEASE)  # alone: its own
    assert writers_of(pg_url, 3)["t0"] not in set(writers_of(pg_url, 2).values())
    await store.close()


async def test_a_stale_fence_in_a_batch_fails_only_its_own_task(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    a, b, c = await leased(store, ["a", "b", "c"])
    stale = dataclasses.replace(b, fence=b.fence - 1)
    now = time.time()
    found = await asyncio.gather(
        store.commit(a, checkpoint("a", 1), 10, now + LEASE),
        store.commit(stale, checkpoint("b", 1), 10, now + LEASE),
        store.commit(c, checkpoint("c", 1), 10, now + LEASE),
        store.commit(dataclasses.replace(a, task_id="gone"), checkpoint("gone", 1), 10, now + LEASE),
        return_exceptions=True)
    assert found[0] == 2 and found[2] == 2
    assert isinstance(found[1], LeaseLost) and f"stale (now {b.fence})" in str(found[1])
    assert isinstance(found[3], TaskNotFound)
    assert (await store.get_task("b")).head_version == 1  # nothing of it landed
    assert set(writers_of(pg_url, 2)) == {"a", "c"}
    await store.close()


async def test_a_cancelled_caller_s_checkpoint_is_still_written(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    a, b = await leased(store, ["a", "b"])
    now = time.time()
    leader = asyncio.ensure_future(store.commit(a, checkpoint("a", 1), 10, now + LEASE))
    follower = asyncio.ensure_future(store.commit(b, checkpoint("b", 1), 10, now + LEASE))
    await asyncio.sleep(0)  # both have handed their checkpoints in; the leader is yielding
    follower.cancel()
    assert await leader == 2
    assert follower.cancelled()
    assert (await store.get_task("b")).head_version == 2
    await store.close()


async def test_a_leader_cancelled_while_it_gathers_its_batch_still_sends_it(pg_url: str) -> None:
    """A worker cancels a task whose lease was lost; if that task led a batch and was
    cancelled while gathering it, the batch is still sent and later checkpoints of the store
    are not left waiting behind it (found by the levers chaos test: tasks stuck running)."""
    store = PostgresStore(pg_url)
    a, b, c = await leased(store, ["a", "b", "c"])
    now = time.time()
    leader = asyncio.ensure_future(store.commit(a, checkpoint("a", 1), 10, now + LEASE))
    follower = asyncio.ensure_future(store.commit(b, checkpoint("b", 1), 10, now + LEASE))
    await asyncio.sleep(0)  # both have handed their checkpoints in; the leader is yielding
    leader.cancel()
    assert await asyncio.wait_for(follower, 10) == 2
    assert leader.cancelled()
    assert (await store.get_task("a")).head_version == 2  # handed in, so written
    later = store.commit(c, checkpoint("c", 1), 10, now + LEASE)
    assert await asyncio.wait_for(later, 10) == 2
    await store.close()


async def test_a_connection_stays_usable_whichever_refused_checkpoint_it_met(
        pg_url: str) -> None:
    """R4, R10 (CI failure after issue 30's pipelined inbox read): a checkpoint refused by the
    server aborts the pipeline, so the inbox read queued behind it is skipped. Had psycopg
    chosen that read to be prepared then, it would think it prepared and every later step on
    the connection would fail ("prepared statement does not exist"). One connection, a
    refusal after each number of written steps, and the step after it must be written."""
    for written_before in range(9):
        store = PostgresStore(pg_url, max_size=1)
        name = f"t{written_before}"
        await make_task(store, name)
        lease = await claim(store, name, time.time())
        seen: frozenset[int] = frozenset()
        for step in range(1, written_before + 1):
            await store.commit_reading(lease, reading(name, step, seen), 10, time.time() + LEASE)
        arrived = (await store.add_event(event(name, "note"), 3, limits(), time.time())).event_id
        with pytest.raises(InboxMoved):
            await store.commit_reading(lease, reading(name, 100, seen), 10, time.time() + LEASE)
        version, pending = await store.commit_reading(lease, reading(name, 101, {arrived}), 10,
                                                      time.time() + LEASE)
        assert version == written_before + 2
        assert [e.event.id for e in pending or ()] == [arrived]
        await store.close()


async def test_a_connection_stays_usable_after_batches_with_a_stale_fence(pg_url: str) -> None:
    """The batch path: a stale fence first in its batch aborts the transaction (every call
    queued behind it skipped), round after round on one connection; the rest of each batch
    is written on its own, and the batches after it together. (psycopg forgets its prepared
    statements when it sees the rollback, so this path never met the failure above; the
    test keeps it that way should the batch ever roll back to a savepoint instead.)"""
    store = PostgresStore(pg_url, max_size=1)
    stale, *good = await leased(store, [f"t{n}" for n in range(8)])
    stale = dataclasses.replace(stale, fence=stale.fence - 1)
    for step in range(1, 6):
        found = await asyncio.gather(
            *(store.commit(lease, checkpoint(lease.task_id, step), 10, time.time() + LEASE)
              for lease in (stale, *good)), return_exceptions=True)
        assert isinstance(found[0], LeaseLost)
        assert found[1:] == [step + 1] * len(good)
    assert await asyncio.gather(*(store.commit(lease, checkpoint(lease.task_id, 6), 10,
                                               time.time() + LEASE) for lease in good)
                                ) == [7] * len(good)
    assert len(set(writers_of(pg_url, 7).values())) == 1
    await store.close()


def reading(task_id: str, step: int, seen: Collection[int]) -> Checkpoint:
    return Checkpoint(head=head(task_id, Status.RUNNING, step), status=Status.RUNNING,
                      inbox_seen=frozenset(seen))


async def test_a_claim_a_renewal_and_a_release_are_one_round_trip_each(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """R13 (issue 30): a lease's bookkeeping is one statement in autocommit, no BEGIN and
    COMMIT around it (three round trips a claim and four a release before); a stale fence
    still refuses, with the fence it found, and changes nothing."""
    store = PostgresStore(pg_url)
    await make_task(store, "t")
    sent: list[str] = []
    execute, begin = psycopg.AsyncCursor.execute, psycopg.AsyncTransaction.__aenter__

    async def counted(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query).split()[0])
        return await execute(cursor, query, *args, **kwargs)

    async def counted_begin(transaction: Any) -> Any:
        sent.append("BEGIN")
        return await begin(transaction)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted)
    monkeypatch.setattr(psycopg.AsyncTransaction, "__aenter__", counted_begin)
    [lease] = await store.claim_many("w", time.time(), LEASE, 4)
    await store.renew(lease, time.time() + 2 * LEASE)
    await store.release(lease)
    assert sent == ["WITH", "UPDATE", "UPDATE"]
    before = await store.get_task("t")
    with pytest.raises(LeaseLost, match=f"stale \\(now {lease.fence + 1}\\)"):
        await store.renew(lease, time.time() + 5 * LEASE)
    with pytest.raises(LeaseLost):
        await store.release(lease)
    with pytest.raises(TaskNotFound):
        await store.release(dataclasses.replace(lease, task_id="gone"))
    assert await store.get_task("t") == before
    await store.close()


async def test_a_connection_whose_statement_cache_went_wrong_is_not_lent_again(
        pg_url: str) -> None:
    """Defence in depth for the failure above: however psycopg's cache of prepared
    statements came to disagree with the server (here the server is made to forget them
    behind psycopg's back), the store call that meets it fails once with a StoreError, and
    the connection is closed, not given back: the next call gets a fresh one and works."""
    store = PostgresStore(pg_url, max_size=1)
    await make_task(store, "t")
    for _ in range(8):  # past psycopg's threshold: the task read is now a prepared statement
        await store.get_task("t")
    async with store._pool.connection() as conn:
        names = [row[0] for row in await (await conn.execute(
            "SELECT name FROM pg_prepared_statements", prepare=False)).fetchall()]
        assert names, "nothing was prepared: the test proves nothing"
        for name in names:
            await conn.execute(f'DEALLOCATE "{name}"', prepare=False)
    with pytest.raises(StoreError, match="does not exist"):
        await store.get_task("t")
    assert (await store.get_task("t")).task_id == "t"
    assert (await store.get_task("t")).task_id == "t"
    await store.close()


async def test_a_checkpoint_and_the_inbox_after_it_are_one_statement(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """R5, R13 (issue 30, migration 12): a step's commit and the read of the task's pending
    events after it are one statement, not two in a pipeline; the events come back most
    urgent first, those the checkpoint consumed left out, and none is an empty list."""
    store = PostgresStore(pg_url)
    await make_task(store, "t")
    lease = await claim(store, "t", time.time())
    sent = services.statements_sent(monkeypatch)
    assert await store.commit_reading(lease, checkpoint("t", 1), 10, time.time() + LEASE) == (2, [])
    assert len(sent) == 1 and "tether_checkpoint_reading" in sent[0]
    now = time.time()
    low, high, done = [(await store.add_event(event("t", f"e{n}"), priority, limits(), now)).event_id
                       for n, priority in enumerate((3, 1, 2))]
    sent.clear()
    consuming = dataclasses.replace(checkpoint("t", 2), events_done=[(done, EventStatus.APPLIED)])
    version, pending = await store.commit_reading(lease, consuming, 10, time.time() + LEASE)
    assert len(sent) == 1
    assert version == 3 and [e.event.id for e in pending] == [high, low]
    assert [e.event.type for e in pending] == ["e1", "e0"]
    await store.close()

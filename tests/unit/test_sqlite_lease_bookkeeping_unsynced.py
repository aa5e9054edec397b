"""R12, R13 (issue 30's commit floor): on a SQLite file in WAL mode set to fsync every
commit, a lease's bookkeeping alone (a claim, a renewal, a release) commits without the
fsync, and everything else (a task created, a checkpoint, a batch a release shares with
one) with it. The level in force at each COMMIT is replayed from the statements the
connection ran; a store set otherwise is left alone. That a SIGKILL loses no such commit is
tests/chaos/test_r13_an_unsynced_claim_survives_a_kill.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tether.model import Status
from tether.store import SQLiteStore
from tether.store.base import Checkpoint
from tether.store.conformance.helpers import LEASE, claim, head, make_task

LEVELS = {"0": "OFF", "1": "NORMAL", "2": "FULL", "3": "EXTRA"}


class Commits:
    """The synchronous level each COMMIT of *store* ran at, replayed from its statements."""

    def __init__(self, store: SQLiteStore) -> None:
        self.level = LEVELS[str(store.pragma("synchronous"))]
        self.levels: list[str] = []
        store._db.set_trace_callback(self._note)

    def _note(self, sql: str) -> None:
        words = sql.replace("=", " ").split()
        if words[:2] == ["PRAGMA", "synchronous"] and len(words) == 3:
            self.level = LEVELS.get(words[2], words[2].upper())
        elif words == ["COMMIT"]:
            self.levels.append(self.level)

    def take(self) -> list[str]:
        taken, self.levels = self.levels, []
        return taken


def running(step: int) -> Checkpoint:
    return Checkpoint(head=head("t1", Status.RUNNING, step), status=Status.RUNNING)


@pytest.mark.parametrize("level", ["FULL", "EXTRA"])
async def test_a_lease_s_bookkeeping_alone_commits_without_the_fsync(
        tmp_path: Path, level: str) -> None:
    store = SQLiteStore(str(tmp_path / "t.db"), synchronous=level)
    commits = Commits(store)
    now = time.time()
    await make_task(store, "t1")
    assert commits.take() == [level]  # a submit is acknowledged: durable
    lease = await claim(store, "t1", now)
    assert commits.take() == ["NORMAL"]
    await store.renew(lease, now + 2 * LEASE)
    assert commits.take() == ["NORMAL"]
    await store.commit(lease, running(1), 10, now + LEASE)
    assert commits.take() == [level]  # a checkpoint, before any tool call: durable
    await store.release(lease)
    assert commits.take() == ["NORMAL"]
    taken = await store.claim_many("w2", time.time(), LEASE, 4)
    assert [c.task_id for c in taken] == ["t1"] and commits.take() == ["NORMAL"]
    assert LEVELS[str(store.pragma("synchronous"))] == level  # the file's level is back
    await store.close()


async def test_a_release_sharing_a_batch_with_a_checkpoint_commits_with_the_fsync(
        tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "t.db"))
    now = time.time()
    await make_task(store, "t1")
    await make_task(store, "t2")
    first, second = await claim(store, "t1", now), await claim(store, "t2", now)
    commits = Commits(store)
    await asyncio.gather(store.commit(first, running(1), 10, now + LEASE),
                         store.release(second))
    assert commits.take() == ["FULL"]  # one transaction, holding a checkpoint
    await asyncio.gather(store.release(first), store.claim_many("w2", time.time(), LEASE, 1))
    assert commits.take() == ["NORMAL"]  # bookkeeping only, together
    assert (await store.get_task("t2")).lease_owner == "w2"
    await store.close()


@pytest.mark.parametrize("path,level", [("file", "NORMAL"), ("file", "OFF"),
                                        (":memory:", "FULL")])
async def test_a_store_that_does_not_fsync_every_commit_is_left_as_it_is(
        tmp_path: Path, path: str, level: str) -> None:
    """A file set to NORMAL or OFF has nothing to skip; an in-memory database is not in WAL
    mode, where an unsynced commit could corrupt a file on a power cut."""
    store = SQLiteStore(str(tmp_path / "t.db") if path == "file" else path, synchronous=level)
    seen: list[str] = []
    store._db.set_trace_callback(seen.append)
    await make_task(store, "t1")
    lease = await claim(store, "t1", time.time())
    await store.release(lease)
    assert not [sql for sql in seen if sql.startswith("PRAGMA synchronous")]
    assert seen.count("COMMIT") == 3
    await store.close()

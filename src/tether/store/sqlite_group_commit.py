"""Group commit for the SQLite store: checkpoints (and claims) of tasks running side by
side share one transaction, and so one fsync.

A durable commit costs about one fsync whatever it holds, so a worker recovering or
running many tasks at once was bound by fsyncs, one per checkpoint. Here the first
checkpoint to arrive leads: it yields to the event loop once, so that every other task
ready to commit adds its checkpoint, then writes them all in one transaction, each
inside its own savepoint. A checkpoint that fails (a stale lease, a bad row) is rolled
back alone and its task alone gets the error; the others are written. Each caller
returns only once the transaction holding its checkpoint has committed, so nothing is
acknowledged before it is durable, and a checkpoint handed in is written even if its
caller is cancelled meanwhile (as a commit that had begun always was).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from tether.errors import StoreError
from tether.store.sqlite_faults import classify

T = TypeVar("T")


@contextmanager
def write_transaction(db: sqlite3.Connection, path: str,
                      unsynced: Synced | None = None) -> Iterator[sqlite3.Connection]:
    """One write transaction, taken with the write lock up front (BEGIN IMMEDIATE: a read
    that upgrades to a write would get SQLITE_BUSY despite the busy timeout). Every failure
    rolls back and is a StoreError naming the file: StoreUnavailable when the lock was held
    past the busy timeout, CorruptStore when the file is damaged (see sqlite_faults).
    With *unsynced*, it commits without an fsync (see :class:`Synced`)."""
    if unsynced is None:
        with _write_transaction(db, path):
            yield db
        return
    db.execute("PRAGMA synchronous = NORMAL")
    try:
        with _write_transaction(db, path):
            yield db
    finally:
        db.execute(f"PRAGMA synchronous = {unsynced.level}")


@dataclass(frozen=True)
class Synced:
    """The file's durable level (FULL or EXTRA, in WAL mode), which a lease's bookkeeping
    (a claim, a renewal, a release) may commit without: its WAL frames are written but not
    fsync'd. A SIGKILL loses nothing (the frames are in the operating system's cache); a
    power cut may lose such commits made after the last durable one, never corrupting the
    file, and the next durable commit (every checkpoint, before any tool call) makes all
    earlier frames durable with it, since a WAL is synced whole. What such a loss costs: a
    claim undone (nothing of the task was written since, so it is claimed again), or a
    release undone (the task looks held until its lease ends, then is taken over)."""

    level: str


@contextmanager
def _write_transaction(db: sqlite3.Connection, path: str) -> Iterator[sqlite3.Connection]:
    try:
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        raise classify(exc, path, "; nothing was written") from exc
    try:
        yield db
    except sqlite3.Error as exc:
        _roll_back(db)
        raise classify(exc, path, "; nothing was written") from exc
    except BaseException:
        _roll_back(db)
        raise
    try:
        db.execute("COMMIT")
    except sqlite3.Error as exc:
        _roll_back(db)
        raise classify(exc, path, "; it could not commit, nothing was written") from exc


def _roll_back(db: sqlite3.Connection) -> None:
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):  # a damaged file may fail this too
            db.execute("ROLLBACK")


@dataclass
class _Pending:
    write: Callable[[sqlite3.Connection], Any]
    durable: bool = True
    done: asyncio.Future[Any] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class GroupCommit:
    """Batches the checkpoint writes of one SQLite connection."""

    def __init__(self, db: sqlite3.Connection, path: str, synced: Synced | None = None) -> None:
        self._db = db
        self._path = path
        self._synced = synced
        """The level a batch of lease bookkeeping alone may commit without (None: every
        commit is as the file is set)."""
        self._queue: list[_Pending] = []

    async def write(self, write: Callable[[sqlite3.Connection], T], durable: bool = True) -> T:
        """Run *write* inside a shared transaction; returns its result once committed. Not
        *durable* (a lease's bookkeeping): its batch, if it holds nothing else, commits
        without an fsync (:class:`Synced`)."""
        pending = _Pending(write, durable)
        self._queue.append(pending)
        if len(self._queue) == 1:
            try:
                await asyncio.sleep(0)  # the other tasks ready to commit join this batch
            finally:
                batch, self._queue = self._queue, []
                try:
                    self._commit(batch)
                except BaseException as exc:  # no follower may be left waiting forever
                    self._fail(batch, StoreError(f"SQLite store {self._path!r}: {exc!r}"))
                    raise
        return cast(T, await pending.done)

    def _unsynced(self, batch: list[_Pending]) -> Synced | None:
        return None if any(pending.durable for pending in batch) else self._synced

    def _commit(self, batch: list[_Pending]) -> None:
        if len(batch) == 1:
            self._commit_alone(batch[0])
            return
        try:
            with write_transaction(self._db, self._path, self._unsynced(batch)) as db:
                results = [self._one(db, pending) for pending in batch]
        except StoreError as error:
            self._fail(batch, error)
            return
        for pending, result in zip(batch, results, strict=True):
            if not pending.done.done():
                if isinstance(result, BaseException):
                    pending.done.set_exception(result)
                else:
                    pending.done.set_result(result)

    def _commit_alone(self, pending: _Pending) -> None:
        """A checkpoint with the transaction to itself (one task committing at a time, the
        common case): no savepoint, since its failure rolls back a transaction that holds
        nothing else; two statements fewer a step."""
        try:
            with write_transaction(self._db, self._path, self._unsynced([pending])) as db:
                result = pending.write(db)
        except Exception as exc:  # rolled back; an SQLite error comes as a StoreError
            if not pending.done.done():
                pending.done.set_exception(exc)
            return
        if not pending.done.done():
            pending.done.set_result(result)

    def _one(self, db: sqlite3.Connection, pending: _Pending) -> Any:
        """One checkpoint inside its savepoint: written, or rolled back alone."""
        db.execute("SAVEPOINT checkpoint")
        try:
            result = pending.write(db)
        except Exception as exc:  # this checkpoint's own failure: its caller gets it
            db.execute("ROLLBACK TO checkpoint")
            db.execute("RELEASE checkpoint")
            if isinstance(exc, sqlite3.Error):
                return classify(exc, self._path, "; nothing was written")
            return exc
        db.execute("RELEASE checkpoint")
        return result

    @staticmethod
    def _fail(batch: list[_Pending], error: Exception) -> None:
        for pending in batch:
            if not pending.done.done():
                pending.done.set_exception(error)

"""Store faults are classified (issue 13): what passes by itself is StoreUnavailable, damage is
CorruptStore, the rest StoreError; a real SQLite write lock held by another process past the
busy timeout is StoreUnavailable while reads go on; PostgreSQL's errors are sorted the same
way (psycopg's exception classes, no server needed)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from tether.errors import CorruptStore, StoreError, StoreUnavailable
from tether.model import Status, TaskRecord
from tether.store import SQLiteStore
from tether.store.conformance.helpers import head, make_task
from tether.store.sqlite_faults import classify


def _error(kind: type[sqlite3.Error], text: str, code: int) -> sqlite3.Error:
    error = kind(text)
    error.sqlite_errorcode = code  # type: ignore[attr-defined]
    return error


@pytest.mark.parametrize(("error", "expected"), [
    (_error(sqlite3.OperationalError, "database is locked", sqlite3.SQLITE_BUSY),
     StoreUnavailable),
    (_error(sqlite3.OperationalError, "database table is locked", sqlite3.SQLITE_LOCKED),
     StoreUnavailable),
    (_error(sqlite3.OperationalError, "database or disk is full", sqlite3.SQLITE_FULL),
     StoreUnavailable),
    (_error(sqlite3.DatabaseError, "database disk image is malformed", sqlite3.SQLITE_CORRUPT),
     CorruptStore),
    (_error(sqlite3.DatabaseError, "file is not a database", sqlite3.SQLITE_NOTADB),
     CorruptStore),
    (_error(sqlite3.OperationalError, "attempt to write a readonly database",
            sqlite3.SQLITE_READONLY), StoreError),
    (sqlite3.OperationalError("no such table: tasks"), StoreError),
])
def test_sqlite_errors_are_classified(error: sqlite3.Error, expected: type[StoreError]) -> None:
    got = classify(error, "/data/t.db", "; nothing was written")
    assert type(got) is expected and "/data/t.db" in str(got)


async def test_a_write_lock_held_past_the_busy_timeout_is_store_unavailable(
        tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = SQLiteStore(str(path), busy_timeout_ms=50)
    try:
        await make_task(store, "t1")
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreUnavailable, match="locked"):
                await store.ping()
            with pytest.raises(StoreUnavailable):
                await store.create_task(TaskRecord("t2", "echo", Status.PENDING, 1.0, 1.0, 1),
                                        head("t2"))
            with pytest.raises(StoreUnavailable):
                await store.claim("w1", time.time(), 30)
            assert (await store.get_task("t1")).task_id == "t1"  # reads go on
            again = SQLiteStore(str(path), busy_timeout_ms=50)  # opening needs no write lock
            await again.close()
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        await store.ping()
        assert (await store.claim("w1", time.time(), 30)) is not None
    finally:
        await store.close()


@pytest.mark.parametrize(("make", "transient"), [
    (lambda p, e: e.AdminShutdown("terminating connection due to administrator command"), True),
    (lambda p, e: e.SerializationFailure("could not serialize access"), True),
    (lambda p, e: e.DeadlockDetected("deadlock detected"), True),
    (lambda p, e: e.CannotConnectNow("the database system is starting up"), True),
    (lambda p, e: e.TooManyConnections("sorry, too many clients already"), True),
    (lambda p, e: p.OperationalError('connection failed: connection to server at "10.0.0.1",'
                                     " port 5432 failed: Connection refused"), True),
    (lambda p, e: p.OperationalError("consuming input failed: server closed the connection"
                                     " unexpectedly"), True),
    (lambda p, e: p.OperationalError("connection failed: FATAL:  the database system is"
                                     " shutting down"), True),
    (lambda p, e: p.OperationalError('connection failed: FATAL:  password authentication'
                                     ' failed for user "tether"'), False),
    (lambda p, e: p.OperationalError('connection failed: FATAL:  database "x" does not exist'),
     False),
    (lambda p, e: e.UndefinedTable('relation "tasks" does not exist'), False),
    (lambda p, e: e.InsufficientPrivilege("permission denied for table tasks"), False),
])
def test_postgres_errors_are_classified(make: object, transient: bool) -> None:
    psycopg = pytest.importorskip("psycopg")
    from tether.store.postgres_faults import classify as classify_pg

    error = make(psycopg, psycopg.errors)  # type: ignore[operator]
    got = classify_pg(error, "postgresql://tether:***@db/tether")
    assert isinstance(got, StoreUnavailable) is transient, (error, got)
    assert "postgresql://tether:***@db/tether" in str(got)


def test_an_empty_pool_is_store_unavailable() -> None:
    pytest.importorskip("psycopg")
    from psycopg_pool import PoolTimeout

    from tether.store.postgres_faults import classify as classify_pg

    assert isinstance(classify_pg(PoolTimeout("couldn't get a connection after 5.00 sec"), "pg"),
                      StoreUnavailable)

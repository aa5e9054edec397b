"""Every store backend passes the Store conformance suite (R13, R14, R19)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

import services
from tether.settings import Settings
from tether.store import (
    ReadStore,
    SnapshotReads,
    SQLiteStore,
    Store,
    WorkerStore,
    open_store,
    queries,
)
from tether.store.conformance import DurableStoreConformance, StoreConformance
from tether.store.redis_cache import CachedStore


def _sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tether.db'}"


def _url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if backend == "memory":
        return "memory://"
    if backend == "postgres":
        return str(request.getfixturevalue("pg_url"))  # skipped (or failed in CI) if absent
    return _sqlite_url(tmp_path)


class TestStoreConformance(StoreConformance):
    """R13: the conformance suite on every backend: memory://, a SQLite file, PostgreSQL."""

    @pytest.fixture(params=["memory", "sqlite-file", "postgres", "postgres+redis"])
    async def store(self, request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
        if request.param == "postgres+redis":
            cache = services.redis_url()
            store: Store = CachedStore(open_store(_url("postgres", request, tmp_path)), cache,
                                       prefix=f"tether-test-{uuid.uuid4().hex[:8]}")
            yield store
            await store.close()
            services.clear_redis(cache, store.prefix)  # type: ignore[attr-defined]
            return
        store = open_store(_url(request.param, request, tmp_path))
        yield store
        await store.close()


class TestPostgresDurability(DurableStoreConformance):
    """R6, R19: the PostgreSQL backend, including a second store (another process) on it."""

    @pytest.fixture
    async def store(self, pg_url: str) -> AsyncIterator[Store]:
        store = open_store(pg_url)
        yield store
        await store.close()

    @pytest.fixture
    def reopen_store(self, pg_url: str) -> Callable[[], Store]:
        return lambda: open_store(pg_url)


class TestSQLiteFileDurability(DurableStoreConformance):
    """R6, R19: the SQLite file backend, including reopening the same file."""

    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        store = open_store(_sqlite_url(tmp_path))
        yield store
        await store.close()

    @pytest.fixture
    def reopen_store(self, tmp_path: Path) -> Callable[[], Store]:
        return lambda: open_store(_sqlite_url(tmp_path))


def _members(protocol: type) -> set[str]:
    """The methods a protocol itself declares (not those it inherits)."""
    return {name for name in vars(protocol) if not name.startswith("_")}


async def test_store_is_both_reads_the_worker_s_path_people_s_reads_and_a_lifecycle() -> None:
    """R13: the Store protocol splits by who asks: what both read (SnapshotReads), the path
    that moves tasks (WorkerStore), what people read (ReadStore) and the lifecycle. Each
    method is in exactly one part, and every backend (and the cache) has all of them."""
    parts = [_members(part) for part in (SnapshotReads, WorkerStore, ReadStore, Store)]
    every = set().union(*parts)
    assert sum(len(part) for part in parts) == len(every)  # no method in two parts
    assert parts[0] == {"get_task", "load_head", "load_blobs", "read_history", "list_versions"}
    assert parts[3] == {"migrate", "close"}
    assert {"claim", "commit", "add_event"} <= parts[1]
    assert {"list_tasks", "list_events", "integrity_check"} <= parts[2]
    inner = open_store("memory://")
    cached = CachedStore(inner, "redis://127.0.0.1:6379/0")  # connects only when used
    try:
        for store in (inner, cached):
            assert all(callable(getattr(store, name)) for name in every)
    finally:
        await cached.close()


def test_shared_sql_takes_psycopg_placeholders() -> None:
    """R13: SQL written once with ``?`` runs on PostgreSQL as ``%s``, a literal ``%`` doubled."""
    assert queries.pyformat("SELECT 1 FROM tasks WHERE task_id = ? AND reason LIKE '5%'") == (
        "SELECT 1 FROM tasks WHERE task_id = %s AND reason LIKE '5%%'")
    assert queries.pyformat(queries.wake_in(2)).endswith("status IN (%s, %s)")


async def test_sqlite_file_defaults_to_wal_and_synchronous_full(tmp_path: Path) -> None:
    """R13: the embedded store is durable by default: WAL journal, synchronous=FULL (2)."""
    store = open_store(_sqlite_url(tmp_path))
    try:
        assert isinstance(store, SQLiteStore)
        assert str(store.pragma("journal_mode")).lower() == "wal"
        assert store.pragma("synchronous") == 2
    finally:
        await store.close()


async def test_sqlite_synchronous_normal_from_settings(tmp_path: Path) -> None:
    """R12, R13: Settings(sqlite_synchronous="NORMAL") gives synchronous=NORMAL (1), still WAL."""
    store = open_store(_sqlite_url(tmp_path), Settings(sqlite_synchronous="NORMAL"))
    try:
        assert isinstance(store, SQLiteStore)
        assert store.pragma("synchronous") == 1
        assert str(store.pragma("journal_mode")).lower() == "wal"
    finally:
        await store.close()


async def test_postgres_integrity_check_names_a_missing_head_and_a_missing_table(
        pg_url: str) -> None:
    """Issue 13: PostgreSQL's integrity_check names the task whose head row is gone, and a
    tether table that is missing; it finds nothing in a sound store."""
    import psycopg

    from tether.store.conformance.helpers import make_task

    store = open_store(pg_url)
    try:
        for name in ("t1", "t2"):
            await make_task(store, name)
        assert await store.integrity_check() == []
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("DELETE FROM snapshots WHERE task_id = 't2'")
        assert await store.integrity_check() == ["task t2: its head row (version 1) is missing"]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE blobs RENAME TO blobs_elsewhere")
        try:
            assert await store.integrity_check() == ["table blobs is missing"]
        finally:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute("ALTER TABLE blobs_elsewhere RENAME TO blobs")
    finally:
        await store.close()


async def test_postgres_server_away_is_unavailable_and_a_refused_login_is_not(
        pg_url: str) -> None:
    """Issue 13: a server that does not answer is StoreUnavailable (workers ride it out); a
    database the server says does not exist is a configuration error (plain StoreError)."""
    import socket

    from tether.errors import StoreError, StoreUnavailable

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    away = open_store(f"postgresql://tether@127.0.0.1:{closed_port}/tether")
    try:
        with pytest.raises(StoreUnavailable, match="unavailable for now"):
            await away.get_task("t1")
        with pytest.raises(StoreUnavailable):
            await away.ping()
    finally:
        await away.close()
    base = pg_url.rpartition("/")[0]
    wrong = open_store(f"{base}/no_such_database_{uuid.uuid4().hex[:8]}")
    try:
        with pytest.raises(StoreError, match="does not exist") as raised:
            await wrong.get_task("t1")
        assert not isinstance(raised.value, StoreUnavailable)
    finally:
        await wrong.close()

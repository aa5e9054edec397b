"""Stores: the protocols (:mod:`tether.store.base`), one module per backend, and what the SQL
backends share (``queries``, ``rows``, ``steps``, ``backend``)."""

from __future__ import annotations

from pathlib import Path

from tether.errors import StoreURLError
from tether.settings import Settings
from tether.store.base import (
    Checkpoint,
    Claim,
    HistoryRow,
    InboxLimits,
    LimitAnswer,
    LimitRequest,
    LimitUsage,
    ReadStore,
    ScheduleRecord,
    SnapshotReads,
    Store,
    StoredEvent,
    TaskQuery,
    WorkerStore,
)
from tether.store.sqlite import SQLiteStore

DEFAULT_URL = "sqlite:///tether.db"

__all__ = [
    "DEFAULT_URL",
    "Checkpoint",
    "Claim",
    "HistoryRow",
    "InboxLimits",
    "LimitAnswer",
    "LimitRequest",
    "LimitUsage",
    "ReadStore",
    "SQLiteStore",
    "ScheduleRecord",
    "SnapshotReads",
    "Store",
    "StoredEvent",
    "TaskQuery",
    "WorkerStore",
    "open_store",
]


def open_store(url: str | None, settings: Settings | None = None, cache: str | None = None) -> Store:
    """Open the store a URL names, with a Redis cache of snapshot heads in front if *cache*
    (a ``redis://`` URL) is given."""
    store = _open_backend(url, settings or Settings())
    if not cache:
        return store
    if not cache.startswith(("redis://", "rediss://", "unix://")):
        raise StoreURLError(f"cache URL {cache!r} is not a Redis URL (redis://host:6379/0)")
    from tether.store.redis_cache import CachedStore  # redis-py only when asked for

    return CachedStore(store, cache, ttl=(settings or Settings()).cache_ttl)


def _open_backend(url: str | None, settings: Settings) -> Store:
    """Open the store a URL names.

    ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db`` for a file;
    ``memory://`` for a private in-memory database (tests, trivial tasks);
    ``postgresql://user:password@host:5432/db`` for PostgreSQL (the ``postgres`` extra).
    """
    url = url or DEFAULT_URL
    if url in ("memory://", "memory:", "sqlite://:memory:", "sqlite:///:memory:"):
        return SQLiteStore(":memory:", synchronous="OFF")
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        if not path:
            raise StoreURLError(f"store URL {url!r} names no file; try sqlite:///tether.db")
        parent = Path(path).parent
        if not parent.is_dir():
            raise StoreURLError(f"store URL {url!r}: folder {str(parent)!r} does not exist")
        return SQLiteStore(path, synchronous=settings.sqlite_synchronous)
    if url.startswith(("postgresql://", "postgres://")):
        from tether.store.postgres import PostgresStore  # psycopg only when asked for

        return PostgresStore(url, max_size=settings.postgres_pool_size,
                             idle_tx_timeout=2 * settings.lease_seconds)
    scheme = url.split(":", 1)[0]
    raise StoreURLError(
        f"store URL {url!r} is not supported (scheme {scheme!r}); use sqlite:///path.db,"
        " postgresql://user@host/db or memory://"
    )

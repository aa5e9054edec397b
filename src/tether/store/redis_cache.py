"""Redis in front of a store: snapshot heads served from memory, the store still the truth (R13).

What is cached is each task's newest head, one entry per task under
``<prefix>:<store id>:head:<task id>``: written when a task is created or a worker commits
it, read when a worker loads the newest head after a claim (or a person reads a task's
newest version). Older versions (a rollback, a listing) are always read from the store.

An entry is served only once it has been checked against the store's task row. It carries
a label, the task's *incarnation* and *version*, and is used only if both equal the row's;
an entry that does not match is ignored, the store's head is used, and the entry is
replaced by it (or dropped). Three things keep one entry from standing for another head:

- **The store id** in the key (:func:`store_identity`): two stores sharing one Redis
  database (two SQLite files, two PostgreSQL databases, a copy of a store) never read each
  other's entries, whatever their task ids.
- **The incarnation**: the task row's ``created_at``. A deleted task's id can be used
  again (by a CLI without ``--cache``, by retention and a new submit); the new row is
  another incarnation, so the old task's entry is never served for it. A delete or purge
  made through the cache drops the entry at once; the label catches one made around it.
- **The version**: the row's ``head_version``. A write made around the cache (a lever
  from a process without ``--cache``) moves the row on and leaves an entry no row matches.

Why ``created_at`` is enough as the incarnation, without a creation id column (a schema
change): in one store (the store id settles which) a task id names at most one row at a
time, and a row's ``created_at`` never changes. A new incarnation is inserted only after
the old row was deleted, in a later transaction, stamped with the creating process's wall
clock (``time.time()`` at submit or fork: a float64 that resolves about 0.2 µs today). For
a stale entry to pass, the new row would have to carry the *same* float to the last bit
*and* be at the same version: the clock of the process that submits again, read after a
delete has committed, landing on the exact instant another process read for the old task.
A creation id column would make that certain instead of a sub-microsecond coincidence of
two clocks; it would need a migration of both schemas, and buy nothing else.

Round trips. After a claim (the worker's hot path) the row's version and incarnation come
with the :class:`~tether.store.base.Claim`, read in the transaction that took the lease;
while the lease holds only its holder commits, so a hit is one Redis GET and no store read
(before this check, a hit cost a store read of the row, then the GET). That row is used
once, by the first load, and only within half the lease from before the claim was asked. Elsewhere (a
person's ``get``) the task row is read side by side with the GET. A commit or create adds
one SET after the store's write, a delete or purge one DEL.

The cache holds no truth: Redis failing (restarted, unreachable, out of memory) is never
an error. The wrapper falls back to the store, counts the miss, and tries Redis again
later. Entries expire after ``ttl`` seconds, so only active tasks stay hot.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import socket
import struct
import time
import uuid
from collections.abc import Collection, Mapping, Sequence

from tether.errors import MissingExtra
from tether.model import TaskRecord
from tether.store.base import Checkpoint, Claim, Store, StoredEvent
from tether.store.sqlite import SQLiteStore

try:
    import redis.asyncio as aioredis
    from redis.exceptions import RedisError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("the Redis cache needs redis-py", "redis") from exc

log = logging.getLogger("tether.cache")
RETRY_AFTER = 5.0
"""Seconds to leave Redis alone after it failed, instead of paying a timeout per read."""
REMEMBERED_CLAIMS = 10_000
"""Claims whose task row is kept for the load that follows them (older ones are forgotten:
their load then reads the row from the store)."""
_LABEL = struct.Struct(">4sdq")
"""What an entry starts with: a format tag, the incarnation (created_at), the version."""
_TAG = b"th1\x00"
_PG_IDENTITY = """
SELECT s.system_identifier::text, d.oid::text, d.datname,
       CASE WHEN pg_is_in_recovery()
            THEN (SELECT upper(lpad(to_hex(timeline_id), 8, '0')) FROM pg_control_checkpoint())
            ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END
  FROM pg_control_system() s, pg_database d
 WHERE d.datname = current_database()
"""
"""A PostgreSQL database's identity: its cluster (system identifier, and the timeline, which
a restored backup or a promoted copy moves on), then the database in it (oid and name)."""

Row = tuple[float, int]
"""What an entry is checked against: the task row's (created_at, head_version)."""


def label(created_at: float, version: int) -> bytes:
    """The bytes an entry for this incarnation and version starts with."""
    return _LABEL.pack(_TAG, created_at, version)


def unlabel(entry: bytes) -> tuple[Row | None, bytes]:
    """An entry's (created_at, version) and head; None for bytes not written by this cache."""
    if len(entry) < _LABEL.size or not entry.startswith(_TAG):
        return None, b""
    _, created_at, version = _LABEL.unpack_from(entry)
    return (created_at, version), entry[_LABEL.size:]


async def store_identity(store: Store) -> str | None:
    """A short stable id of the store behind the cache (None: not known just now).

    SQLite: this machine, the file's absolute path and its inode (a file put in its place,
    a restored backup, is another store). PostgreSQL: the cluster's system identifier and
    timeline, and the database's oid and name (:data:`_PG_IDENTITY`). A private
    ``memory://`` store, or a backend this cache does not know, gets an id of its own for
    this process: its entries are never shared, which is always safe."""
    if isinstance(store, SQLiteStore):
        return _digest(_sqlite_identity(store.path))
    url = getattr(store, "url", None)
    if isinstance(url, str) and url.startswith(("postgresql://", "postgres://")):
        found = await _postgres_identity(url)
        return None if found is None else _digest(found)
    return _digest(f"private|{uuid.uuid4()}")


def _digest(identity: str) -> str:
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def _sqlite_identity(path: str) -> str:
    if path in ("", ":memory:"):
        return f"private|{uuid.uuid4()}"
    real = os.path.realpath(path)
    try:
        found = os.stat(real)
    except OSError:
        return f"private|{uuid.uuid4()}"
    return f"sqlite|{socket.gethostname()}|{real}|{found.st_dev}|{found.st_ino}"


async def _postgres_identity(url: str) -> str | None:
    import psycopg  # there is a PostgreSQL store, so the postgres extra is installed

    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True,
                                                         connect_timeout=3) as conn:
            try:
                row = await (await conn.execute(_PG_IDENTITY)).fetchone()
            except psycopg.Error:  # the control functions withheld (a managed server, say)
                info = conn.info
                return f"postgres|{info.host}|{info.port}|{info.dbname}"
            return "postgres|" + "|".join(str(part) for part in row or ())
    except (psycopg.Error, OSError) as exc:
        log.warning("Redis cache: cannot tell which PostgreSQL store this is (%s); reading"
                    " the store for %.0fs", exc, RETRY_AFTER)
        return None


class CachedStore:
    """A :class:`~tether.store.base.Store` that keeps each task's newest snapshot head in
    Redis, served only when it matches the store's task row (see the module)."""

    def __init__(self, inner: Store, url: str, ttl: float = 3600.0, prefix: str = "tether") -> None:
        self.inner = inner
        self.url = url
        self.ttl = int(ttl)
        self.prefix = prefix
        self.redis = aioredis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self.hits = 0
        self.misses = 0
        self.stale = 0
        """Entries found but not served: another incarnation's or an older version's."""
        self.errors = 0
        self.store_id: str | None = (  # a file's path is read now, whatever the cwd later
            _digest(_sqlite_identity(inner.path)) if isinstance(inner, SQLiteStore) else None)
        self._down_until = 0.0
        self._claimed: dict[str, tuple[float, Row]] = {}
        """Task id -> (until when, the row its claim read): the load after a claim checks
        the entry against this instead of reading the row again."""
        # Everything else is the store's own answer: bound here, so each keeps the inner
        # store's exact signature (checked against Store by mypy) without a wrapper per method.
        self.get_task = inner.get_task
        self.load_blobs = inner.load_blobs
        self.read_history = inner.read_history
        self.count_history = inner.count_history
        self.list_versions = inner.list_versions
        self.renew = inner.renew
        self.break_lease = inner.break_lease
        self.set_status = inner.set_status  # the head and its version stay
        self.next_epoch = inner.next_epoch
        self.add_event = inner.add_event
        self.pending_events = inner.pending_events
        self.get_idempotency = inner.get_idempotency
        self.idempotency_keys = inner.idempotency_keys
        self.wake_all = inner.wake_all
        self.wait_for_change = inner.wait_for_change
        self.ping = inner.ping
        self.clock = inner.clock
        self.list_tasks = inner.list_tasks
        self.leased_tasks = inner.leased_tasks
        self.find_tasks = inner.find_tasks
        self.hands_over_slots = inner.hands_over_slots
        self.acquire_limit = inner.acquire_limit
        self.release_limit = inner.release_limit
        self.graph_put = inner.graph_put  # LangGraph checkpoints are never cached
        self.graph_put_writes = inner.graph_put_writes
        self.graph_checkpoints = inner.graph_checkpoints
        self.graph_delete_threads = inner.graph_delete_threads
        self.graph_delete_runs = inner.graph_delete_runs
        self.graph_copy_thread = inner.graph_copy_thread
        self.graph_prune = inner.graph_prune
        self.block_limit = inner.block_limit
        self.spend_limit = inner.spend_limit
        self.limit_usage = inner.limit_usage
        self.collect_blobs = inner.collect_blobs
        self.put_schedule = inner.put_schedule
        self.claim_due_schedules = inner.claim_due_schedules
        self.advance_schedule = inner.advance_schedule
        self.delete_schedule = inner.delete_schedule
        self.list_schedules = inner.list_schedules
        self.count_by_status = inner.count_by_status
        self.count_pending_events = inner.count_pending_events
        self.list_events = inner.list_events
        self.list_idempotency = inner.list_idempotency
        self.list_recovery_log = inner.list_recovery_log
        self.integrity_check = inner.integrity_check  # the cache holds no truth to check
        self.migrate = inner.migrate

    # ------------------------------------------------------------------ Redis, failing softly

    async def namespace(self) -> str | None:
        """``<prefix>:<store id>``, every key's start; None while the store id is unknown."""
        if self.store_id is None:
            if time.monotonic() < self._down_until:
                return None
            self.store_id = await store_identity(self.inner)
            if self.store_id is None:
                self.errors += 1
                self._down_until = time.monotonic() + RETRY_AFTER
                return None
        return f"{self.prefix}:{self.store_id}"

    async def key(self, task_id: str) -> str | None:
        """The key of *task_id*'s entry (None while the store id is unknown)."""
        namespace = await self.namespace()
        return None if namespace is None else f"{namespace}:head:{task_id}"

    async def _get(self, key: str) -> bytes | None:
        if time.monotonic() < self._down_until:
            return None
        try:
            value = await self.redis.get(key)
            return value if isinstance(value, bytes) else None
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return None

    async def _put(self, task_id: str, row: Row, head: bytes) -> None:
        key = await self.key(task_id)
        if key is None or time.monotonic() < self._down_until:
            return
        try:
            await self.redis.set(key, label(*row) + head, ex=self.ttl)
        except (RedisError, OSError) as exc:
            self._failed(exc)

    async def _drop(self, task_ids: Sequence[str]) -> None:
        """Delete the entries of *task_ids* (a delete, a purge, an entry found stale)."""
        namespace = await self.namespace()
        if namespace is None or not task_ids or time.monotonic() < self._down_until:
            return
        try:
            await self.redis.delete(*(f"{namespace}:head:{task_id}" for task_id in task_ids))
        except (RedisError, OSError) as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        self._down_until = time.monotonic() + RETRY_AFTER
        log.warning("Redis cache %s unavailable (%s); reading the store for %.0fs", self.url,
                    exc, RETRY_AFTER)

    # ------------------------------------------------------------------ claims: the row, once

    def _remember(self, claim: Claim | None, until: float) -> None:
        """Keep the row *claim* read, for the load that follows it (a worker's restart)."""
        if claim is None or claim.head_version is None or claim.created_at is None:
            return
        self._claimed.pop(claim.task_id, None)
        while len(self._claimed) >= REMEMBERED_CLAIMS:
            del self._claimed[next(iter(self._claimed))]
        self._claimed[claim.task_id] = (until, (claim.created_at, claim.head_version))

    def _claimed_row(self, task_id: str) -> Row | None:
        """The row the claim of *task_id* read, if that claim was made here, its lease is
        surely still live, and nothing has been loaded or committed under it since."""
        until, row = self._claimed.pop(task_id, (0.0, None))
        return row if time.monotonic() < until else None

    async def claim(self, worker: str, now: float, lease: float,
                    busy: Collection[str] = ()) -> Claim | None:
        started = time.monotonic()  # half the lease from before asking: surely still ours
        claim = await self.inner.claim(worker, now, lease, busy)
        self._remember(claim, started + lease / 2)
        return claim

    async def claim_many(self, worker: str, now: float, lease: float, most: int,
                         busy: Collection[str] = ()) -> list[Claim]:
        started = time.monotonic()
        taken = await self.inner.claim_many(worker, now, lease, most, busy)
        for claim in taken:
            self._remember(claim, started + lease / 2)
        return taken

    async def claim_task(self, task_id: str, worker: str, now: float, lease: float) -> Claim | None:
        started = time.monotonic()
        claim = await self.inner.claim_task(task_id, worker, now, lease)
        self._remember(claim, started + lease / 2)
        return claim

    async def release(self, claim: Claim, hold_until: float | None = None) -> None:
        self._claimed.pop(claim.task_id, None)
        await self.inner.release(claim, hold_until)

    # ------------------------------------------------------------------ what the cache changes

    async def load_head(self, task_id: str, version: int | None = None) -> tuple[int, bytes]:
        """The newest head from Redis if its entry matches the task row; an older version
        (a rollback, a listing) always from the store, which knows whether it is still kept."""
        if version is not None:
            return await self.inner.load_head(task_id, version)
        row, key = self._claimed_row(task_id), await self.key(task_id)
        if key is None:
            self.misses += 1
            return await self.inner.load_head(task_id)
        if row is None:  # not just claimed here: read the row beside the entry
            record, entry = await asyncio.gather(self.inner.get_task(task_id), self._get(key))
            row = (record.created_at, record.head_version)
        else:
            entry = await self._get(key)
        found: Row | None = None
        if entry is not None:
            found, head = unlabel(entry)
            if found == row:
                self.hits += 1
                return row[1], head
            self.stale += 1
        self.misses += 1
        version, head = await self.inner.load_head(task_id)
        if version == row[1]:
            await self._put(task_id, row, head)  # replaces a stale entry
        elif found is not None and not (found[0] == row[0] and found[1] > row[1]):
            await self._drop([task_id])  # the row moved on meanwhile: no label to trust
        return version, head

    async def commit(self, claim: Claim, checkpoint: Checkpoint, keep: int, lease_until: float) -> int:
        self._claimed.pop(claim.task_id, None)
        version = await self.inner.commit(claim, checkpoint, keep, lease_until)
        await self._committed(claim, version, checkpoint.head)
        return version

    async def commit_reading(self, claim: Claim, checkpoint: Checkpoint, keep: int,
                             lease_until: float) -> tuple[int, list[StoredEvent] | None]:
        self._claimed.pop(claim.task_id, None)
        version, pending = await self.inner.commit_reading(claim, checkpoint, keep, lease_until)
        await self._committed(claim, version, checkpoint.head)
        return version, pending

    async def _committed(self, claim: Claim, version: int, head: bytes) -> None:
        """The head just made durable, cached under the claim's incarnation."""
        if claim.created_at is not None:
            await self._put(claim.task_id, (claim.created_at, version), head)

    async def create_task(self, record: TaskRecord, head: bytes, wake_at: float | None = None,
                          blobs: Mapping[str, bytes] | None = None) -> None:
        await self.inner.create_task(record, head, wake_at, blobs)
        await self._put(record.task_id, (record.created_at, 1), head)

    async def delete_task(self, task_id: str, now: float) -> None:
        await self.inner.delete_task(task_id, now)
        self._claimed.pop(task_id, None)
        await self._drop([task_id])

    async def purge_finished(self, cutoffs: Mapping[str, float], now: float,
                             limit: int = 500) -> list[str]:
        deleted = await self.inner.purge_finished(cutoffs, now, limit)
        await self._drop(deleted)
        return deleted

    async def close(self) -> None:
        try:
            await self.redis.aclose()
        finally:
            await self.inner.close()

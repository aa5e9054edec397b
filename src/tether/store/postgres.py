"""The PostgreSQL store: the shared source of truth for many workers on many machines (R13).

Same rows and the same rules as the SQLite store, over psycopg 3's async connection
pool. What PostgreSQL changes:

- Claims take a row with ``FOR UPDATE SKIP LOCKED``, so workers racing for work never
  wait on each other, and bump the task's fencing token in the same statement. Tasks
  whose worker died come first, then due and new work, oldest first.
- Every write for a task first locks its row (``SELECT ... FOR UPDATE``) and checks the
  fence, in the same transaction as the write: a worker paused past its lease (GC, a
  network partition, SIGSTOP) gets :class:`LeaseLost` and lands nothing.
- Events for one task are serialised by the same row lock, so dedup by
  ``source_event_id``, coalescing and capacity are decided one event at a time; the
  unique index is the last line of defence.
- Idle workers LISTEN on ``tether_work``; creating a task or storing an event NOTIFYs it
  when the transaction commits, so work sent through the table is picked up at once
  rather than at the next poll.
- The schema is created and upgraded by numbered migrations (``sql/postgres/NNNN_*.sql``),
  applied under an advisory lock by the first store that opens, or by ``tether migrate``.
- Leases are judged by one clock, the database server's: a claim, a renewal, a release
  with a hold and a commit set and compare ``lease_until`` against ``clock_timestamp()``
  (``statement_timestamp()`` in a claim, so the partial index still serves it), never
  against the wall clock of the worker asking. A time a caller passes for a lease is
  translated by that caller's own clock (``until - time.time()`` seconds from the server's
  now), so a worker whose clock runs 30 s behind holds its leases exactly as long as the
  others. Due times (``wake_at``: timers, back-offs, scheduled starts) are still the wall
  clock of the process that set them.
- Faults (``postgres_faults``): a server restarting or unreachable is StoreUnavailable;
  a broken connection makes the pool drop its idle connections that broke with it
  (``pool.check()``), and the pool reconnects on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import orjson

from tether.errors import (
    ConfigurationError,
    InboxFull,
    LeaseLost,
    StoreError,
    TaskClosed,
    TaskExists,
    TaskNotFound,
    VersionNotFound,
)
from tether.failpoints import failpoint
from tether.model import EmitReceipt, Event, IdempotencyRecord, Status, TaskRecord
from tether.store.base import (
    Checkpoint,
    Claim,
    InboxLimits,
    StoredEvent,
    statuses_woken,
    stranded_wake,
)

try:
    import psycopg
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ConfigurationError("the PostgreSQL store needs psycopg: pip install 'tether[postgres]'"
                             ) from exc

# after the check above: these need psycopg too
from tether.store import postgres_schema
from tether.store.postgres_faults import (
    classify,
    connection_lost,
    probe,
    quiet_pool_log,
)

_TASK_COLUMNS = ("task_id, agent, status, created_at, updated_at, head_version, reason,"
                 " lease_owner, lease_until, wake_at")
_OPEN = "('pending', 'running', 'waiting', 'paused', 'needs_human')"
_FINISHED = ("completed", "failed", "cancelled")
# The server's clock, plus how far ahead of its own clock the caller's "now" was.
_LEASE_NOW = "(date_part('epoch', statement_timestamp()) + %(ahead)s)"
_CLOCK = "date_part('epoch', clock_timestamp())"
_FREE = f"(lease_until IS NULL OR lease_until < {_LEASE_NOW}) AND task_id <> ALL(%(busy)s::text[])"
_CLAIMABLE = f"""{_FREE} AND (
    (status IN {_OPEN} AND (lease_owner IS NOT NULL OR wake_at <= %(now)s
                            OR (status IN ('pending', 'running') AND wake_at IS NULL)))
    OR (status IN ('failed', 'completed') AND wake_at <= %(now)s))"""
_TAKE = f"""
WITH chosen AS (
    SELECT task_id, lease_owner, status FROM tasks
     WHERE {{where}}
     ORDER BY lease_owner IS NULL, COALESCE(wake_at, created_at) LIMIT 1
     FOR UPDATE SKIP LOCKED
)
UPDATE tasks t SET lease_owner = %(worker)s, lease_until = {_LEASE_NOW} + %(lease)s,
       fence = t.fence + 1,
       crashes = t.crashes + CASE WHEN chosen.lease_owner IS NOT NULL
                                   AND chosen.status NOT IN {_FINISHED} THEN 1 ELSE 0 END
  FROM chosen WHERE t.task_id = chosen.task_id
RETURNING t.task_id, t.fence, t.crashes,
          chosen.lease_owner IS NOT NULL AND chosen.status NOT IN {_FINISHED}
"""
_OPEN_END = 1 << 62
_CHANNEL = "tether_work"
"""NOTIFY channel: a task was created or an event stored (sent when the transaction commits)."""
POOL_WAIT = 5.0
"""Seconds a store call waits for a pool connection (and the pool keeps reconnecting before
it gives up until asked again): an outage surfaces as StoreUnavailable within this."""



class PostgresStore:
    """A :class:`tether.store.base.Store` on a PostgreSQL database."""

    def __init__(self, url: str, min_size: int = 1, max_size: int = 10,
                 idle_tx_timeout: float = 30.0) -> None:
        self.url = url
        self.where = _redact(url)
        # A worker frozen inside a transaction (GC, SIGSTOP) would hold its task's row lock, and
        # SKIP LOCKED would keep every other worker off the task; PostgreSQL ends such a
        # transaction after idle_tx_timeout, so the task can be taken over once its lease ends.
        self._options = f"-c idle_in_transaction_session_timeout={int(idle_tx_timeout * 1000)}"
        self._pool = AsyncConnectionPool(url, min_size=min_size, max_size=max_size, open=False,
                                         timeout=POOL_WAIT, reconnect_timeout=POOL_WAIT,
                                         kwargs={"autocommit": True, "options": self._options,
                                                 "connect_timeout": 5})
        quiet_pool_log()
        self._pool_open = False
        self._ready = False
        self._opening = asyncio.Lock()
        self._listener: psycopg.AsyncConnection[Any] | None = None

    # ------------------------------------------------------------------ plumbing

    async def _open(self) -> None:
        if self._ready:
            return
        async with self._opening:
            if self._ready:
                return
            await self._open_pool()
            try:
                await self._apply_migrations()
            except psycopg.Error as exc:
                raise await self._fault(exc) from exc
            self._ready = True

    async def _open_pool(self) -> None:
        """Open the pool once the server answers (a login it refuses is a configuration
        error, a server away StoreUnavailable; the pool is not opened, so it can be later)."""
        if self._pool_open:
            return
        error = await probe(self.url, self.where, self._options)
        if error is not None:
            raise error
        await self._pool.open(wait=False)
        self._pool_open = True

    async def _fault(self, exc: psycopg.Error, outcome: str = "") -> StoreError:
        """The StoreError for *exc* (postgres_faults). A pool with no connection to give is
        asked why by connecting once; a broken connection makes the pool drop its idle
        connections that broke with it, so the next call gets a fresh one."""
        if isinstance(exc, PoolTimeout):
            why = await probe(self.url, self.where, self._options)
            return why or classify(exc, self.where, outcome)
        if connection_lost(exc):
            with contextlib.suppress(Exception):
                await self._pool.check()
            outcome = ""  # a commit may have landed before the connection broke
        return classify(exc, self.where, outcome)

    async def _apply_migrations(self) -> list[str]:
        async with self._pool.connection() as conn, conn.transaction():
            return await postgres_schema.apply_migrations(conn, self.where)

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """One write transaction; a database error becomes StoreError and nothing is written."""
        await self._open()
        try:
            async with self._pool.connection() as conn, conn.transaction():
                yield conn
        except psycopg.Error as exc:
            raise await self._fault(exc, "; nothing was written") from exc

    async def _rows(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        await self._open()
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(sql, params)
                return await cur.fetchall()
        except psycopg.Error as exc:
            raise await self._fault(exc) from exc

    async def _lock_task(self, conn: psycopg.AsyncConnection[Any], task_id: str,
                         columns: str = "status") -> tuple[Any, ...]:
        cur = await conn.execute(f"SELECT {columns} FROM tasks WHERE task_id = %s FOR UPDATE",
                                 (task_id,))
        row: tuple[Any, ...] | None = await cur.fetchone()
        if row is None:
            raise TaskNotFound(f"no task {task_id!r} in store {self.where}")
        return row

    async def _check_fence(self, conn: psycopg.AsyncConnection[Any], claim: Claim) -> int:
        fence, head = await self._lock_task(conn, claim.task_id, "fence, head_version")
        if fence != claim.fence:
            raise LeaseLost(
                f"task {claim.task_id}: lease fence {claim.fence} is stale (now {fence});"
                " another worker took the task over, so this write was refused")
        return int(head)

    # ------------------------------------------------------------------ tasks

    async def create_task(self, record: TaskRecord, head: bytes, wake_at: float | None = None,
                          blobs: Mapping[str, bytes] | None = None) -> None:
        async with self._tx() as conn:
            cur = await conn.execute(
                "INSERT INTO tasks (task_id, agent, status, created_at, updated_at, head_version,"
                " wake_at) VALUES (%s, %s, %s, %s, %s, 1, %s) ON CONFLICT (task_id) DO NOTHING",
                (record.task_id, record.agent, record.status.value, record.created_at,
                 record.updated_at, wake_at))
            if cur.rowcount == 0:
                raise TaskExists(f"a task with id {record.task_id!r} already exists; nothing was"
                                 " changed")
            await conn.execute(
                "INSERT INTO snapshots (task_id, version, created_at, head) VALUES (%s, 1, %s, %s)",
                (record.task_id, record.created_at, head))
            await _put_blobs(conn, blobs or {}, record.created_at)
            await conn.execute("SELECT pg_notify(%s, %s)", (_CHANNEL, record.task_id))

    async def get_task(self, task_id: str) -> TaskRecord:
        rows = await self._rows(f"SELECT {_TASK_COLUMNS} FROM tasks WHERE task_id = %s", (task_id,))
        if not rows:
            raise TaskNotFound(f"no task {task_id!r} in store {self.where}")
        return _task_record(rows[0])

    async def list_tasks(self, status: Status | None = None, limit: int = 1000) -> list[TaskRecord]:
        where, params = ("WHERE status = %s", (status.value,)) if status else ("", ())
        rows = await self._rows(f"SELECT {_TASK_COLUMNS} FROM tasks {where}"
                                " ORDER BY created_at DESC LIMIT %s", (*params, limit))
        return [_task_record(row) for row in rows]

    async def wake_all(self, status: Status, now: float) -> int:
        async with self._tx() as conn:
            cur = await conn.execute("UPDATE tasks SET wake_at = %s WHERE status = %s",
                                     (now, status.value))
            return cur.rowcount

    async def count_by_status(self) -> dict[str, int]:
        rows = await self._rows("SELECT status, COUNT(*) FROM tasks GROUP BY status")
        return {status: int(count) for status, count in rows}

    # ------------------------------------------------------------------ leases

    async def claim(self, worker: str, now: float, lease: float,
                    busy: Collection[str] = ()) -> Claim | None:
        return await self._take(_CLAIMABLE, {"now": now, "ahead": now - time.time(),
                                             "busy": list(busy), "worker": worker, "lease": lease})

    async def claim_task(self, task_id: str, worker: str, now: float, lease: float) -> Claim | None:
        await self.get_task(task_id)
        return await self._take(f"task_id = %(task_id)s AND (lease_until IS NULL"
                                f" OR lease_until < {_LEASE_NOW})",
                                {"ahead": now - time.time(), "task_id": task_id,
                                 "worker": worker, "lease": lease})

    async def _take(self, where: str, params: dict[str, Any]) -> Claim | None:
        async with self._tx() as conn:
            cur = await conn.execute(_TAKE.replace("{where}", where), params)
            row = await cur.fetchone()
        if row is None:
            return None
        return Claim(row[0], int(row[1]), crashed=bool(row[3]), crashes=int(row[2]))

    async def renew(self, claim: Claim, until: float) -> None:
        async with self._tx() as conn:
            await self._check_fence(conn, claim)
            await conn.execute(f"UPDATE tasks SET lease_until = {_CLOCK} + %s WHERE task_id = %s",
                               (until - time.time(), claim.task_id))

    async def release(self, claim: Claim, hold_until: float | None = None) -> None:
        async with self._tx() as conn:
            await self._check_fence(conn, claim)
            hold = None if hold_until is None else hold_until - time.time()
            await conn.execute(f"UPDATE tasks SET lease_owner = NULL, lease_until = {_CLOCK} + %s,"
                               " fence = fence + 1 WHERE task_id = %s", (hold, claim.task_id))

    async def set_status(self, claim: Claim, status: Status, reason: str | None,
                         wake_at: float | None = None) -> None:
        now = time.time()
        async with self._tx() as conn:
            await self._check_fence(conn, claim)
            await conn.execute("UPDATE tasks SET status = %s, reason = %s, updated_at = %s,"
                               " wake_at = %s WHERE task_id = %s",
                               (status.value, reason, now, wake_at, claim.task_id))
            await _settle_inbox(conn, claim.task_id, status, now, wake_at)

    # ------------------------------------------------------------------ checkpoints

    async def commit(self, claim: Claim, checkpoint: Checkpoint, keep: int, lease_until: float) -> int:
        now = time.time()
        task_id = claim.task_id
        async with self._tx() as conn:
            head = await self._check_fence(conn, claim)
            cur = await conn.execute("SELECT MAX(version) FROM snapshots WHERE task_id = %s",
                                     (task_id,))
            newest = (await cur.fetchone() or (None,))[0]
            version = max(head, newest or 0) + 1
            await conn.execute("INSERT INTO snapshots (task_id, version, created_at, head)"
                               " VALUES (%s, %s, %s, %s)", (task_id, version, now, checkpoint.head))
            failpoint("mid_checkpoint")
            await _put_blobs(conn, checkpoint.blobs, now)
            await _write_rows(conn, task_id, checkpoint, now)
            await conn.execute(
                "UPDATE tasks SET status = %s, updated_at = %s, head_version = %s, reason = %s,"
                f" wake_at = %s, lease_until = {_CLOCK} + %s, crashes = crashes * %s"
                " WHERE task_id = %s",
                (checkpoint.status.value, now, version, checkpoint.reason, checkpoint.wake_at,
                 lease_until - now, int(not checkpoint.progress), task_id))
            await _settle_inbox(conn, task_id, checkpoint.status, now, checkpoint.wake_at)
            if version > keep:
                await conn.execute("DELETE FROM snapshots WHERE task_id = %s AND version <= %s",
                                   (task_id, version - keep))
        return version

    async def load_head(self, task_id: str, version: int | None = None) -> tuple[int, bytes]:
        if version is None:
            rows = await self._rows(
                "SELECT s.version, s.head FROM tasks t JOIN snapshots s ON s.task_id = t.task_id"
                " AND s.version = t.head_version WHERE t.task_id = %s", (task_id,))
        else:
            rows = await self._rows("SELECT version, head FROM snapshots WHERE task_id = %s"
                                    " AND version = %s", (task_id, version))
        if not rows:
            record = await self.get_task(task_id)
            version = record.head_version if version is None else version  # named below
            kept = [v for v, _, _ in await self.list_versions(task_id)]
            raise VersionNotFound(f"task {task_id}: version {version} is not kept (kept: {kept})")
        return int(rows[0][0]), bytes(rows[0][1])

    async def load_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        rows = await self._rows("SELECT digest, data FROM blobs WHERE digest = ANY(%s::text[])",
                                (list(digests),))
        return {digest: bytes(data) for digest, data in rows}

    async def list_versions(self, task_id: str) -> list[tuple[int, float, int]]:
        rows = await self._rows("SELECT version, created_at, length(head) FROM snapshots"
                                " WHERE task_id = %s ORDER BY version", (task_id,))
        return [(int(v), float(at), int(size)) for v, at, size in rows]

    async def read_history(self, task_id: str, segments: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        first = 1
        for epoch, last in segments:
            upper = _OPEN_END if last < 0 else last
            rows = await self._rows("SELECT entry FROM history WHERE task_id = %s AND epoch = %s"
                                    " AND seq BETWEEN %s AND %s ORDER BY seq",
                                    (task_id, epoch, first, upper))
            entries.extend(orjson.loads(row[0]) for row in rows)
            first = upper + 1
        return entries

    async def next_epoch(self, task_id: str) -> int:
        async with self._tx() as conn:
            cur = await conn.execute("UPDATE tasks SET max_epoch = max_epoch + 1 WHERE task_id = %s"
                                     " RETURNING max_epoch", (task_id,))
            row = await cur.fetchone()
        if row is None:
            raise TaskNotFound(f"no task {task_id!r} in store {self.where}")
        return int(row[0])

    # ------------------------------------------------------------------ events

    async def add_event(self, event: Event, priority: int, limits: InboxLimits, now: float) -> EmitReceipt:
        async with self._tx() as conn:
            (status,) = await self._lock_task(conn, event.task_id)  # one event at a time per task
            if event.source_event_id is not None:
                cur = await conn.execute("SELECT id FROM events WHERE task_id = %s"
                                         " AND source_event_id = %s",
                                         (event.task_id, event.source_event_id))
                seen = await cur.fetchone()
                if seen:
                    return EmitReceipt(False, int(seen[0]), "duplicate")
            if Status(status).is_terminal and Status(status) not in limits.reopens:
                raise TaskClosed(f"task {event.task_id} is {status}; the event was not stored")
            supersedes = ("status = 'pending' AND priority >= %s AND ((coalesce_class = %s"
                          " AND created_at >= %s) OR (%s AND type = %s))")
            superseding = (priority, limits.coalesce, now - limits.window,
                           priority >= 3 and limits.coalesce is not None, event.type)
            classed = limits.coalesce is not None  # else nothing is superseded: no scans
            if limits.refusable:
                found = None
                if classed:
                    cur = await conn.execute(f"SELECT 1 FROM events WHERE task_id = %s AND"
                                             f" {supersedes} LIMIT 1", (event.task_id, *superseding))
                    found = await cur.fetchone()
                if found is None:
                    await _check_capacity(conn, event, limits)
            cur = await conn.execute(
                "INSERT INTO events (task_id, type, priority, payload, source_event_id,"
                " coalesce_class, control, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                " RETURNING id",
                (event.task_id, event.type, priority, orjson.dumps(event.payload),
                 event.source_event_id, limits.coalesce, limits.wakes_needs_human, now))
            event_id = int((await cur.fetchone() or (0,))[0])
            failpoint("event_stored")
            coalesced = 0
            if classed:
                cur = await conn.execute(
                    f"UPDATE events SET status = 'coalesced', done_at = %s WHERE task_id = %s"
                    f" AND id <> %s AND {supersedes}", (now, event.task_id, event_id, *superseding))
                coalesced = cur.rowcount
            wakeable = statuses_woken(priority, limits)
            if wakeable:
                await conn.execute("UPDATE tasks SET wake_at = %s WHERE task_id = %s"
                                   " AND status = ANY(%s)", (now, event.task_id, wakeable))
            await conn.execute("SELECT pg_notify(%s, %s)", (_CHANNEL, event.task_id))
        return EmitReceipt(True, event_id, "stored", coalesced)

    async def pending_events(self, task_id: str) -> list[StoredEvent]:
        return await self._events("WHERE task_id = %s AND status = 'pending'"
                                  " ORDER BY priority, id", (task_id,))

    async def count_pending_events(self) -> int:
        rows = await self._rows("SELECT COUNT(*) FROM events WHERE status = 'pending'")
        return int(rows[0][0])

    async def list_events(self, task_id: str) -> list[StoredEvent]:
        return await self._events("WHERE task_id = %s ORDER BY id", (task_id,))

    async def _events(self, where: str, params: tuple[Any, ...]) -> list[StoredEvent]:
        rows = await self._rows(
            "SELECT id, task_id, type, priority, payload, source_event_id, created_at, status,"
            f" coalesce_class FROM events {where}", params)
        return [StoredEvent(Event(type=r[2], task_id=r[1], payload=orjson.loads(r[4]),
                                  priority=r[3], source_event_id=r[5], id=int(r[0]),
                                  created_at=r[6]),
                            priority=r[3], status=r[7], coalesce=r[8]) for r in rows]

    # ------------------------------------------------------------------ idempotency, recovery log

    async def get_idempotency(self, key: str) -> IdempotencyRecord | None:
        rows = await self._idempotency("WHERE key = %s", (key,))
        return rows[0] if rows else None

    async def list_idempotency(self, task_id: str) -> list[IdempotencyRecord]:
        return await self._idempotency("WHERE task_id = %s ORDER BY updated_at", (task_id,))

    async def _idempotency(self, where: str, params: tuple[Any, ...]) -> list[IdempotencyRecord]:
        rows = await self._rows("SELECT key, task_id, tool, args_hash, status, result, error,"
                                f" attempts, updated_at FROM idempotency {where}", params)
        return [IdempotencyRecord(r[0], r[1], r[2], r[3], r[4],
                                  orjson.loads(r[5]) if r[5] is not None else None, r[6], r[7],
                                  r[8]) for r in rows]

    async def list_recovery_log(self, task_id: str) -> list[dict[str, Any]]:
        rows = await self._rows("SELECT record FROM recovery_log WHERE task_id = %s ORDER BY id",
                                (task_id,))
        return [orjson.loads(row[0]) for row in rows]

    async def wait_for_work(self, timeout: float) -> None:
        """LISTEN for new tasks and events (NOTIFY is sent when they commit), up to *timeout*."""
        await self._open()
        try:
            if self._listener is None:
                self._listener = await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, connect_timeout=5)
                await self._listener.execute(f"LISTEN {_CHANNEL}")
            async for _ in self._listener.notifies(timeout=timeout, stop_after=1):
                return
        except psycopg.Error as exc:  # the next look at the table finds the work anyway
            listener, self._listener = self._listener, None
            if listener is not None:
                with contextlib.suppress(Exception):
                    await listener.close()
            raise classify(exc, self.where, "; LISTEN failed") from exc

    async def migrate(self) -> list[str]:
        """Apply the migrations this database has not had yet; returns the files applied."""
        await self._open_pool()
        try:
            return await self._apply_migrations()
        except psycopg.Error as exc:
            raise await self._fault(exc) from exc

    async def ping(self) -> None:
        """One round trip on a pooled connection."""
        await self._rows("SELECT 1")

    async def integrity_check(self) -> list[str]:
        """Cheap checks of the tether tables (postgres_schema.problems); [] = nothing found."""
        await self._open()
        try:
            async with self._pool.connection() as conn:
                return await postgres_schema.problems(conn)
        except psycopg.Error as exc:
            raise await self._fault(exc) from exc

    async def close(self) -> None:
        if self._listener is not None:
            await self._listener.close()
        await self._pool.close()


async def _put_blobs(conn: psycopg.AsyncConnection[Any], blobs: Mapping[str, bytes],
                     now: float) -> None:
    if blobs:
        async with conn.cursor() as cur:
            await cur.executemany("INSERT INTO blobs (digest, data, created_at) VALUES (%s, %s, %s)"
                                  " ON CONFLICT (digest) DO NOTHING",
                                  [(digest, data, now) for digest, data in blobs.items()])


async def _write_rows(conn: psycopg.AsyncConnection[Any], task_id: str, checkpoint: Checkpoint,
                      now: float) -> None:
    """The dialog rows, consumed events, call records and recovery log of one checkpoint."""
    async with conn.cursor() as cur:
        if checkpoint.history:
            await cur.executemany(
                "INSERT INTO history (task_id, epoch, seq, entry) VALUES (%s, %s, %s, %s)",
                [(task_id, r.epoch, r.seq, orjson.dumps(r.entry)) for r in checkpoint.history])
        if checkpoint.events_done:
            await cur.executemany(
                "UPDATE events SET status = %s, done_at = %s WHERE id = %s AND task_id = %s",
                [(d, now, e, task_id) for e, d in checkpoint.events_done])
        if checkpoint.idempotency:
            await cur.executemany(
                "INSERT INTO idempotency (key, task_id, tool, args_hash, status, result, error,"
                " attempts, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (key) DO UPDATE SET task_id = EXCLUDED.task_id,"
                " tool = EXCLUDED.tool, args_hash = EXCLUDED.args_hash, status = EXCLUDED.status,"
                " result = EXCLUDED.result, error = EXCLUDED.error, attempts = EXCLUDED.attempts,"
                " updated_at = EXCLUDED.updated_at",
                [(r.key, r.task_id, r.tool, r.args_hash, r.status, orjson.dumps(r.result),
                  r.error, r.attempts, now) for r in checkpoint.idempotency])
        if checkpoint.recovery_log:
            await cur.executemany(
                "INSERT INTO recovery_log (task_id, at, record) VALUES (%s, %s, %s)",
                [(task_id, now, orjson.dumps(r)) for r in checkpoint.recovery_log])


async def _settle_inbox(conn: psycopg.AsyncConnection[Any], task_id: str, status: Status,
                        now: float, wake_at: float | None) -> None:
    """As in the SQLite store: events that came after the runner's last look are not stranded."""
    wakes = stranded_wake(status, wake_at, now)
    if wakes is None:
        return
    if status in (Status.COMPLETED, Status.CANCELLED):
        await conn.execute("UPDATE events SET status = 'ignored', done_at = %s WHERE task_id = %s"
                           " AND status = 'pending' AND NOT (control AND %s = 'completed')",
                           (now, task_id, status.value))
    cur = await conn.execute(f"SELECT 1 FROM events WHERE task_id = %s AND status = 'pending'"
                             f" AND {wakes} LIMIT 1", (task_id,))
    if await cur.fetchone():
        await conn.execute("UPDATE tasks SET wake_at = %s WHERE task_id = %s", (now, task_id))


async def _check_capacity(conn: psycopg.AsyncConnection[Any], event: Event,
                          limits: InboxLimits) -> None:
    cur = await conn.execute("SELECT COUNT(*) FROM events WHERE task_id = %s"
                             " AND status = 'pending'", (event.task_id,))
    pending = int((await cur.fetchone() or (0,))[0])
    if pending >= limits.capacity:
        raise InboxFull(
            f"task {event.task_id}: inbox holds {pending} pending events (capacity "
            f"{limits.capacity}); {event.type!r} is low priority and was refused, retry later")


def _task_record(row: tuple[Any, ...]) -> TaskRecord:
    return TaskRecord(row[0], row[1], Status(row[2]), row[3], row[4], int(row[5]), row[6], row[7],
                      row[8], row[9])


def _redact(url: str) -> str:
    """The URL without its password, for messages."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)

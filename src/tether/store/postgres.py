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

What it does as the SQLite store does is written once (the SQL in ``queries``, the algorithms
in ``steps``, row mappers in ``rows``, the methods in ``backend``); this module keeps psycopg's
I/O and the differences above.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import time
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from tether.errors import MissingExtra, StoreError, TaskNotFound
from tether.failpoints import failpoint
from tether.model import Status
from tether.store import limit_steps, rows, steps
from tether.store import queries as q
from tether.store.backend import SQLBackend
from tether.store.base import Checkpoint, Claim, LimitAnswer, LimitRequest, StoredEvent
from tether.store.steps import Notify, Statement, Steps

try:
    import psycopg
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("the PostgreSQL store needs psycopg", "postgres") from exc

# after the check above: these need psycopg too
from tether.store import postgres_checkpoint, postgres_schema
from tether.store.postgres_faults import (
    classify,
    connection_lost,
    probe,
    quiet_pool_log,
)

T = TypeVar("T")

# PostgreSQL's own statements (psycopg placeholders). Leases are judged by the server's clock:
# its time, plus how far ahead of its own clock the caller's "now" was.
_LEASE_NOW = "(date_part('epoch', statement_timestamp()) + %(ahead)s)"
_CLOCK = "date_part('epoch', clock_timestamp())"
# Claims take a row with FOR UPDATE SKIP LOCKED, so racing workers never wait on each other, and
# bump its fence in the same statement; the busy tasks come as an array parameter.
_FREE = f"(lease_until IS NULL OR lease_until < {_LEASE_NOW}) AND task_id <> ALL(%(busy)s::text[])"
_CLAIMABLE = f"""{_FREE} AND (
    (status IN {q.OPEN} AND (lease_owner IS NOT NULL OR wake_at <= %(now)s
                             OR (status IN ('pending', 'running') AND wake_at IS NULL)))
    OR (status IN ('failed', 'completed') AND wake_at <= %(now)s))"""
_TAKE = f"""
WITH chosen AS (
    SELECT task_id, lease_owner, status FROM tasks
     WHERE {{where}}
     ORDER BY lease_owner IS NULL, COALESCE(wake_at, created_at) LIMIT %(most)s
     FOR UPDATE SKIP LOCKED
)
UPDATE tasks t SET lease_owner = %(worker)s, lease_until = {_LEASE_NOW} + %(lease)s,
       fence = t.fence + 1,
       crashes = t.crashes + CASE WHEN chosen.lease_owner IS NOT NULL
                                   AND chosen.status NOT IN {q.FINISHED} THEN 1 ELSE 0 END,
       {q.start_pending(_LEASE_NOW, row="t.")}
  FROM chosen WHERE t.task_id = chosen.task_id
RETURNING t.task_id, t.fence, t.crashes, t.head_version, t.created_at,
          chosen.lease_owner IS NOT NULL AND chosen.status NOT IN {q.FINISHED} AS crashed,
          chosen.status = 'pending' AS started
"""
# A renewal and a release are one statement each, fenced in their WHERE (the row's lock is
# taken by the UPDATE, and READ COMMITTED re-checks the fence on the newest row version);
# only when no row matched is the task read, to say why.
_RENEW = f"UPDATE tasks SET lease_until = {_CLOCK} + %s WHERE task_id = %s AND fence = %s"
_BREAK = ("UPDATE tasks SET lease_until = 0 WHERE task_id = %s AND lease_owner = %s"
          " AND lease_until > 0")
_RELEASE = (f"UPDATE tasks SET lease_owner = NULL, lease_until = {_CLOCK} + %s, fence = fence + 1"
            " WHERE task_id = %s AND fence = %s")
_FENCE_NOW = "SELECT fence FROM tasks WHERE task_id = %s"
_BLOBS = "SELECT digest, data FROM blobs WHERE digest = ANY(%s::text[])"
_CHANNEL = "tether_work"
"""NOTIFY channel: a task was created or an event stored (sent when the transaction commits)."""
# A named limit's admission and release, each one call of migration 9's and 10's functions.
_ACQUIRE = ("SELECT * FROM tether_acquire_limit(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
            " %s, %s, %s)")
_RELEASE_LIMIT = "SELECT tether_release_limit(%s, %s, %s, %s, %s) AS first_waiter"
POOL_WAIT = 5.0
"""Seconds a store call waits for a pool connection (and the pool keeps reconnecting before
it gives up until asked again): an outage surfaces as StoreUnavailable within this."""


class PostgresStore(SQLBackend):
    """A :class:`tether.store.base.Store` on a PostgreSQL database."""

    SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    hands_over_slots = True  # a slot let go for a task a worker holds is NOTIFYed

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
        self._group = postgres_checkpoint.GroupCommit(self._pooled,
                                                      self._checkpoint_failure)

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
            error = why or classify(exc, self.where, outcome)
            error.waited = POOL_WAIT
            return error
        if connection_lost(exc):
            with contextlib.suppress(Exception):
                await self._pool.check()
            outcome = ""  # a commit may have landed before the connection broke
        return classify(exc, self.where, outcome)

    async def _apply_migrations(self) -> list[str]:
        async with self._pooled() as conn, conn.transaction():
            return await postgres_schema.apply_migrations(conn, self.where)

    @asynccontextmanager
    async def _pooled(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection, closed instead of given back when the server does not know a
        statement psycopg thinks it prepared on it: its statement cache no longer matches
        the server's, and lent again it would fail every use of that statement."""
        async with self._pool.connection() as conn:
            try:
                yield conn
            except psycopg.errors.InvalidSqlStatementName:
                await conn.close()
                raise

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection outside a transaction; a database error becomes StoreError."""
        await self._open()
        try:
            async with self._pooled() as conn:
                yield conn
        except psycopg.Error as exc:
            raise await self._fault(exc) from exc

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """One write transaction; a database error becomes StoreError and nothing is written."""
        await self._open()
        try:
            async with self._pooled() as conn, conn.transaction():
                yield conn
        except psycopg.Error as exc:
            raise await self._fault(exc, "; nothing was written") from exc

    async def _run(self, conn: psycopg.AsyncConnection[Any], work: Steps[T]) -> T:
        """Carry out shared steps on *conn*."""
        return await steps.run_async(work, functools.partial(_execute, conn), self._missing)

    async def _read(self, work: Steps[T]) -> T:
        async with self._connection() as conn:
            return await self._run(conn, work)

    async def _write(self, work: Steps[T]) -> T:
        async with self._tx() as conn:
            return await self._run(conn, work)

    async def _read_snapshot(self, work: Steps[T]) -> T:
        """A read-only REPEATABLE READ transaction: one snapshot for every statement."""
        return await self._repeatable(work, " READ ONLY")

    async def _write_snapshot(self, work: Steps[T]) -> T:
        """A REPEATABLE READ write transaction: every statement reads one snapshot."""
        return await self._repeatable(work)

    async def _repeatable(self, work: Steps[T], mode: str = "") -> T:
        async with self._tx() as conn:
            await conn.execute(f"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ{mode}")
            return await self._run(conn, work)

    async def _write_alone(self, work: Steps[T]) -> T:
        async with self._tx() as conn:
            await conn.execute("LOCK TABLE snapshots IN SHARE MODE")  # commits wait
            return await self._run(conn, work)

    async def _rows(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """One statement of PostgreSQL's own (psycopg placeholders) on a pooled connection."""
        async with self._connection() as conn:
            cur = await conn.execute(sql, params)
            return await cur.fetchall()

    def _missing(self, task_id: str, outcome: str = "") -> TaskNotFound:
        return TaskNotFound(f"no task {task_id!r} in store {self.where}{outcome}")

    async def _check_fence(self, conn: psycopg.AsyncConnection[Any], claim: Claim) -> int:
        """Lock the task's row for the transaction and check the fence; its head version."""
        row = await self._run(conn, steps.fence(claim))
        return int(row["head_version"])

    # ------------------------------------------------------------------ leases

    async def claim(self, worker: str, now: float, lease: float,
                    busy: Collection[str] = ()) -> Claim | None:
        taken = await self.claim_many(worker, now, lease, 1, busy)
        return taken[0] if taken else None

    async def claim_many(self, worker: str, now: float, lease: float, most: int,
                         busy: Collection[str] = ()) -> list[Claim]:
        return await self._take(_CLAIMABLE, {"now": now, "ahead": now - time.time(),
                                             "busy": list(busy), "worker": worker, "lease": lease,
                                             "most": most})

    async def claim_task(self, task_id: str, worker: str, now: float, lease: float) -> Claim | None:
        await self.get_task(task_id)
        taken = await self._take(f"task_id = %(task_id)s AND (lease_until IS NULL"
                                 f" OR lease_until < {_LEASE_NOW})",
                                 {"ahead": now - time.time(), "task_id": task_id,
                                  "worker": worker, "lease": lease, "most": 1})
        return taken[0] if taken else None

    async def _take(self, where: str, params: dict[str, Any]) -> list[Claim]:
        """One statement in autocommit (its own transaction): one round trip, not three."""
        async with self._connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(_TAKE.replace("{where}", where), params)
            rows = await cur.fetchall()
        return [Claim(row["task_id"], int(row["fence"]), crashed=bool(row["crashed"]),
                      crashes=int(row["crashes"]), head_version=int(row["head_version"]),
                      created_at=float(row["created_at"]), started=bool(row["started"]))
                for row in rows]

    # ------------------------------------------------------------------ named limits

    async def acquire_limit(self, request: LimitRequest, now: float) -> LimitAnswer:
        """The shared steps in one round trip (``tether_acquire_limit``, migration 9): the
        limit's row lock is held for one statement, not ten, so workers asking for the same
        limit do not queue behind each other's round trips."""
        rate, tokens = request.rate or (None, None), request.tokens or (None, None)
        row = await self._one(_ACQUIRE, (
            request.name, request.key, request.task_id, request.fence, request.holder,
            request.priority, request.concurrency, *rate, *tokens, limit_steps.size_of(request),
            now, limit_steps.BACKSTOP, _CHANNEL))
        if row["granted"]:
            return LimitAnswer(True)
        return limit_steps.held_back(request, float(row["retry_at"]), str(row["reason"]),
                                     float(row["amount"] or 0))

    async def release_limit(self, name: str, key: str, holder: str, now: float) -> str | None:
        row = await self._one(_RELEASE_LIMIT, (name, key, holder, now, _CHANNEL))
        return None if row["first_waiter"] is None else str(row["first_waiter"])

    async def _one(self, sql: str, params: tuple[Any, ...]) -> dict[str, Any]:
        """One statement of PostgreSQL's own on an autocommit connection (its own
        transaction, one round trip); its one row."""
        async with self._connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql, params)
            row = await cur.fetchone()
        assert row is not None, "a function call returns one row"
        return row

    async def renew(self, claim: Claim, until: float) -> None:
        await self._fenced(claim, _RENEW, (until - time.time(), claim.task_id, claim.fence))

    async def break_lease(self, task_id: str, holder: str) -> bool:
        async with self._tx() as conn:
            cur = await conn.execute(_BREAK, (task_id, holder))
            return cur.rowcount > 0

    async def release(self, claim: Claim, hold_until: float | None = None) -> None:
        hold = None if hold_until is None else hold_until - time.time()
        await self._fenced(claim, _RELEASE, (hold, claim.task_id, claim.fence))

    async def _fenced(self, claim: Claim, sql: str, params: tuple[Any, ...]) -> None:
        """One UPDATE of the task's row under *claim*'s fence, in autocommit (one round
        trip); when it matched no row, the task is read to raise TaskNotFound or LeaseLost."""
        async with self._connection() as conn:
            if (await conn.execute(sql, params)).rowcount:
                return
            row = await (await conn.execute(_FENCE_NOW, (claim.task_id,))).fetchone()
        if row is None:
            raise self._missing(claim.task_id)
        raise steps.lease_lost(claim, row[0])

    async def set_status(self, claim: Claim, status: Status, reason: str | None,
                         wake_at: float | None = None) -> None:
        async with self._tx() as conn:
            await self._check_fence(conn, claim)
            await self._run(conn, steps.set_status(claim.task_id, status, reason, time.time(), wake_at))

    # ------------------------------------------------------------------ checkpoints

    async def commit(self, claim: Claim, checkpoint: Checkpoint, keep: int, lease_until: float) -> int:
        """One ``tether_checkpoint`` call, sharing a transaction with the checkpoints of other
        tasks ready at the same moment (postgres_checkpoint)."""
        version, _ = await self._checkpoint(claim, checkpoint, keep, lease_until, read=False)
        return version

    async def commit_reading(self, claim: Claim, checkpoint: Checkpoint, keep: int,
                             lease_until: float) -> tuple[int, list[StoredEvent]]:
        """The checkpoint and the next tick's read of the inbox in one round trip."""
        version, found = await self._checkpoint(claim, checkpoint, keep, lease_until, read=True)
        return version, [rows.stored_event(row) for row in found or ()]

    async def _checkpoint(self, claim: Claim, checkpoint: Checkpoint, keep: int,
                          lease_until: float, read: bool) -> postgres_checkpoint.Written:
        steps.check_owned(claim.task_id, checkpoint.idempotency)
        params = postgres_checkpoint.call_params(claim, checkpoint, keep, lease_until, time.time())
        await self._open()
        failpoint("mid_checkpoint")  # killed here, nothing of the checkpoint was sent
        return await self._group.write(claim, params, read)

    async def _checkpoint_failure(self, exc: psycopg.Error, claim: Claim) -> Exception:
        """What a checkpoint's caller gets for the database error its call met."""
        if exc.sqlstate == postgres_checkpoint.TASK_MISSING:
            return self._missing(claim.task_id, "; nothing was written")
        if exc.sqlstate == postgres_checkpoint.LEASE_LOST:
            return steps.lease_lost(claim, exc.diag.message_primary)
        if exc.sqlstate == postgres_checkpoint.INBOX_MOVED:
            return steps.inbox_moved(claim.task_id)
        return await self._fault(exc, "; nothing was written")

    async def load_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        async with self._connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(_BLOBS, (list(digests),))
            return rows.blobs(await cur.fetchall())

    # ------------------------------------------------------------------ lifecycle

    async def wait_for_change(self, timeout: float, poll: float,
                              hurry: asyncio.Event | None = None) -> frozenset[str] | None:
        """LISTEN for new tasks and events (NOTIFY, sent when they commit, carries the task's
        id), up to *timeout*; *poll* and *hurry* are not needed: the server tells at once."""
        await self._open()
        try:
            if self._listener is None:
                self._listener = await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, connect_timeout=5)
                await self._listener.execute(f"LISTEN {_CHANNEL}")
                return None  # notices sent before it listened are lost: look at everything
            async for notice in self._listener.notifies(timeout=timeout, stop_after=1):
                return frozenset({notice.payload})
            return frozenset()
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

    async def clock(self) -> float:
        """The server's time: one clock for every worker, whatever each machine's says."""
        rows = await self._rows(f"SELECT {_CLOCK}")
        return float(rows[0][0])

    async def ping(self) -> None:
        """One round trip on a pooled connection."""
        await self._rows("SELECT 1")

    async def integrity_check(self) -> list[str]:
        """Cheap checks of the tether tables (postgres_schema.problems); [] = nothing found."""
        async with self._connection() as conn:
            return await postgres_schema.problems(conn)

    async def close(self) -> None:
        if self._listener is not None:
            await self._listener.close()
        await self._pool.close()


async def _execute(conn: psycopg.AsyncConnection[Any], statement: Statement | Notify) -> Any:
    """One statement of the shared steps, in psycopg's placeholders."""
    if isinstance(statement, Notify):  # idle workers LISTEN; it is sent when the transaction commits
        await conn.execute("SELECT pg_notify(%s, %s)", (_CHANNEL, statement.task_id))
        return None
    sql = q.pyformat(f"{statement.sql} FOR UPDATE" if statement.lock else statement.sql)
    async with conn.cursor(row_factory=dict_row) as cursor:
        if statement.many:
            await cursor.executemany(sql, statement.params)
            return cursor.rowcount
        await cursor.execute(sql, statement.params)
        if statement.result == "one":
            return await cursor.fetchone()
        if statement.result == "all":
            return await cursor.fetchall()
        return cursor.rowcount


def _redact(url: str) -> str:
    """The URL without its password, for messages."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)

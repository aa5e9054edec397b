"""PostgreSQL checkpoints in one round trip, and several tasks' checkpoints in one transaction.

A checkpoint is one call of the ``tether_checkpoint`` function (migration 3): the fence check,
the new head, the dialog rows, the call records, the task row and the inbox's settling, in
the order the SQLite store writes them. Called alone on an autocommit connection, it is its
own transaction: one round trip, where five were needed before (BEGIN, the fence, the newest
version, the writes, COMMIT). A commit that also reads the task's inbox after it (every step
does) calls ``tether_checkpoint_reading`` (migration 12), which returns the pending events
as well: still one statement.

Group commit, as the SQLite store does it: the first checkpoint to arrive leads, yields to the
event loop once so that every other task ready to commit joins it, then sends the batch as
one transaction in one pipeline (one round trip, one WAL flush). If anything in a batch fails
(a stale fence raises, and PostgreSQL then aborts the whole transaction), nothing of it
landed, and each checkpoint is sent again on its own, so only its own task gets its own
error. A checkpoint handed in is written even if its caller is cancelled meanwhile.

Checkpoints are prepared from their first use (``prepare=True``). Left to psycopg's threshold,
a statement whose turn to be prepared came in a pipeline that an earlier statement aborted
(a refused checkpoint, then the inbox read queued behind it, before migration 12) was
recorded as prepared though the server skipped it, and every later use of it on that
connection failed ("prepared statement does not exist"). Prepared from the start, its cache
entry is checked against its result and dropped when the pipeline aborted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import orjson
import psycopg
from psycopg.rows import dict_row

from tether.store import queries as q
from tether.store import steps
from tether.store.base import Checkpoint, Claim
from tether.store.postgres_faults import connection_lost

_ARGUMENTS = ("(%s::text, %s::bigint, %s::float8, %s::bigint, %s::bytea,"
              " %s::text, %s::text, %s::float8, %s::float8, %s::boolean, %s::text[], %s::bytea[],"
              " %s::int[], %s::int[], %s::bytea[], %s::bigint[], %s::text[], %s::text[],"
              " %s::text[], %s::text[], %s::text[], %s::text[], %s::bytea[], %s::text[],"
              " %s::int[], %s::bytea[], %s::text, %s::bigint[])")
CALL = f"SELECT tether_checkpoint{_ARGUMENTS}"
CALL_READING = f"SELECT * FROM tether_checkpoint_reading{_ARGUMENTS}"
"""The checkpoint and the task's pending events after it, in one statement (migration 12):
a row per event, each with the new ``version``, or one row of the version alone."""
_WAKES = {q.URGENT: "urgent", q.LEVERS: "levers"}
"""Which pending events wake the task after the write (steps.stranded_wake), as the function
names them."""
TASK_MISSING, LEASE_LOST, INBOX_MOVED = "TT404", "TT409", "TT412"
"""The SQLSTATEs ``tether_checkpoint`` raises."""
Written = tuple[int, list[dict[str, Any]] | None]
"""A checkpoint's new version, and the task's pending events once it was written (None: not
asked for)."""


def call_params(claim: Claim, checkpoint: Checkpoint, keep: int, lease_until: float,
                now: float) -> tuple[Any, ...]:
    """The arguments of one ``tether_checkpoint`` call, columns as arrays."""
    calls = checkpoint.idempotency
    wakes = steps.stranded_wake(checkpoint.status, checkpoint.wake_at, now)
    return (
        claim.task_id, claim.fence, now, keep, checkpoint.head,
        checkpoint.status.value, checkpoint.reason, checkpoint.wake_at, lease_until - now,
        checkpoint.progress,
        list(checkpoint.blobs), list(checkpoint.blobs.values()),
        [r.epoch for r in checkpoint.history], [r.seq for r in checkpoint.history],
        [orjson.dumps(r.entry) for r in checkpoint.history],
        [event_id for event_id, _ in checkpoint.events_done],
        [str(disposition) for _, disposition in checkpoint.events_done],
        [r.key for r in calls], [r.task_id for r in calls], [r.tool for r in calls],
        [r.args_hash for r in calls], [r.status for r in calls],
        [orjson.dumps(r.result) for r in calls], [r.error for r in calls],
        [r.attempts for r in calls],
        [orjson.dumps(r) for r in checkpoint.recovery_log],
        None if wakes is None else _WAKES[wakes],
        None if checkpoint.inbox_seen is None else sorted(checkpoint.inbox_seen),
    )


Connect = Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]]
"""Lends a pooled autocommit connection (database errors reach the caller as they are)."""
Failure = Callable[[psycopg.Error, Claim], Awaitable[Exception]]
"""The error a checkpoint's caller gets for a database error its call met."""


@dataclass
class _Pending:
    claim: Claim
    params: tuple[Any, ...]
    read: bool = False
    done: asyncio.Future[Written] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class GroupCommit:
    """Batches the checkpoints of one PostgreSQL store.

    *connect* lends a pooled autocommit connection; *failure* turns a database error met by
    one checkpoint into the error its caller gets.
    """

    def __init__(self, connect: Connect, failure: Failure) -> None:
        self._connect = connect
        self._failure = failure
        self._queue: list[_Pending] = []
        self._sending: set[asyncio.Task[None]] = set()
        """Batches on their way, held so that a leader's cancellation cannot lose one."""

    async def write(self, claim: Claim, params: tuple[Any, ...], read: bool = False) -> Written:
        """Write one checkpoint; its new version once the transaction holding it committed
        (and with *read*, the task's pending events then, in the same round trip).

        The leader takes the batch even when it is cancelled while it yields (a lease lost,
        a drain timeout): a batch left in the queue would make every later checkpoint of this
        store a follower of a leader that never sends, and each would wait forever."""
        pending = _Pending(claim, params, read)
        self._queue.append(pending)
        if len(self._queue) == 1:
            try:
                await asyncio.sleep(0)  # the other tasks ready to commit join this batch
            finally:
                batch, self._queue = self._queue, []
                sending = asyncio.ensure_future(self._send(batch))
                self._sending.add(sending)
                sending.add_done_callback(self._sent)
            await asyncio.shield(sending)
        return await pending.done

    def _sent(self, sending: asyncio.Task[None]) -> None:
        """A batch's error reached its callers through their futures; nothing more to do."""
        self._sending.discard(sending)
        if not sending.cancelled():
            sending.exception()

    async def _send(self, batch: list[_Pending]) -> None:
        try:
            if len(batch) == 1:
                await self._alone(batch[0])
            else:
                await self._together(batch)
        except BaseException as exc:  # no caller may be left waiting forever
            for pending in batch:
                if not pending.done.done():
                    pending.done.set_exception(exc)
            raise

    async def _alone(self, pending: _Pending) -> None:
        """One statement on an autocommit connection (its own transaction): one round trip."""
        try:
            async with self._connect() as conn:
                cursor = await _call(conn, pending)
                written = await _written(cursor, pending)
        except psycopg.Error as exc:
            _settle(pending, error=await self._failure(exc, pending.claim))
            return
        _settle(pending, written)

    async def _together(self, batch: list[_Pending]) -> None:
        """One transaction in one pipeline. If the server refused it (a stale fence in it),
        nothing landed and each is sent on its own; if the connection broke, a commit may
        have landed, so nothing is sent again and every caller hears of the failure."""
        try:
            async with self._connect() as conn:
                async with conn.pipeline(), conn.transaction():
                    cursors = [await _call(conn, pending) for pending in batch]
                written = [await _written(cursor, pending)
                           for cursor, pending in zip(cursors, batch, strict=True)]
        except psycopg.Error as exc:
            if exc.sqlstate is None or connection_lost(exc):
                for pending in batch:
                    _settle(pending, error=await self._failure(exc, pending.claim))
                return
            for pending in batch:
                await self._alone(pending)
            return
        for pending, each in zip(batch, written, strict=True):
            _settle(pending, each)


async def _call(conn: psycopg.AsyncConnection[Any], pending: _Pending
                ) -> psycopg.AsyncCursor[dict[str, Any]]:
    """Send *pending*'s checkpoint (with its inbox read if asked for), prepared from its first
    use (see the module docstring)."""
    cursor = conn.cursor(row_factory=dict_row)
    await cursor.execute(CALL_READING if pending.read else CALL, pending.params, prepare=True)
    return cursor


async def _written(cursor: psycopg.AsyncCursor[dict[str, Any]], pending: _Pending) -> Written:
    """The new version, and with a read, the pending events (the rows that carry one)."""
    found = await cursor.fetchall()
    if not pending.read:
        return int(found[0]["tether_checkpoint"]), None
    return int(found[0]["version"]), [row for row in found if row["id"] is not None]


def _settle(pending: _Pending, written: Written = (0, None),
            error: BaseException | None = None) -> None:
    if pending.done.done():  # its caller was cancelled: the checkpoint was written all the same
        return
    if error is not None:
        pending.done.set_exception(error)
    else:
        pending.done.set_result(written)

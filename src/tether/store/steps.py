"""What a SQL store does, written once as steps that any backend can carry out (R13).

The SQLite store talks to its file synchronously (no await inside a transaction, so no
coroutine interleaves with another's writes); the PostgreSQL store talks to its server
through psycopg's async API. So that deduplication, coalescing, inbox capacity, fencing and
the rest are decided by one piece of code rather than two copies that drift apart, each
algorithm here is a generator that *yields* the statements it wants run (:class:`Statement`,
SQL from :mod:`tether.store.queries`) and is *sent* each result. It does no I/O itself
("sans-I/O"): the SQLite store drives it with :func:`run`, the PostgreSQL store with
:func:`run_async`, each executing a statement in its own way.

A statement's result is what its ``result`` asks for: ``"one"`` a row or None, ``"all"``
a list of rows (rows are read by column name, :class:`tether.store.rows.Row`), ``"count"``
the number of rows it changed. A task that is not there is :class:`Missing`, which the
drivers turn into the backend's own error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeVar

import orjson

from tether.errors import (
    InboxFull,
    InboxMoved,
    InvalidInput,
    LeaseLost,
    TaskClosed,
    TaskExists,
    VersionNotFound,
)
from tether.failpoints import failpoint
from tether.model import EmitReceipt, Event, IdempotencyRecord, Status, TaskRecord
from tether.store import queries as q
from tether.store import rows
from tether.store.base import Checkpoint, Claim, InboxLimits, StoredEvent, TaskQuery

T = TypeVar("T")

OPEN_END = 1 << 62
"""The last sequence number of a history segment that runs to the end of its epoch."""


class Statement(NamedTuple):
    """One statement an algorithm wants run, with ``?`` placeholders (a named tuple: one is
    made for every statement a step runs, so it must be cheap to build)."""

    sql: str
    params: Sequence[Any] = ()
    """The parameters; with *many*, a list of parameter rows (executemany)."""
    result: Literal["one", "all", "count"] = "count"
    lock: bool = False
    """Lock the row read until the transaction ends. PostgreSQL appends ``FOR UPDATE`` (workers
    write side by side); SQLite ignores it: a write transaction there holds the file's one
    write lock already."""
    many: bool = False


@dataclass(frozen=True)
class Notify:
    """New work for a task was written: a backend that can tell idle workers at commit does
    (PostgreSQL: NOTIFY); one that cannot ignores it (SQLite: workers look again)."""

    task_id: str


Steps = Generator[Statement | Notify, Any, T]
"""An algorithm's steps, returning a *T* when done."""


class Missing(Exception):
    """The task the steps needed is not in the store: the driver raises the backend's own
    error instead (SQLite first rules out damage hiding the task)."""

    def __init__(self, task_id: str, outcome: str = "") -> None:
        super().__init__(task_id)
        self.task_id = task_id
        self.outcome = outcome
        """What it meant for the call, ending the message ("; the event was not stored")."""


def one(sql: str, *params: Any, lock: bool = False) -> Statement:
    """A statement whose first row (or None) is sent back."""
    return Statement(sql, params, "one", lock=lock)


def every(sql: str, *params: Any) -> Statement:
    """A statement whose rows are sent back."""
    return Statement(sql, params, "all")


def change(sql: str, *params: Any) -> Statement:
    """A statement whose count of changed rows is sent back."""
    return Statement(sql, params)


def change_many(sql: str, params: Sequence[Sequence[Any]]) -> Statement:
    """One statement run for each row of *params*."""
    return Statement(sql, params, many=True)


MissingError = Callable[[str, str], Exception]
"""A backend's error for a task that is not there, given its id and what it meant (outcome)."""


def run(steps: Steps[T], execute: Callable[[Statement | Notify], Any], missing: MissingError) -> T:
    """Carry out *steps* synchronously, sending each statement's result back."""
    result = None
    try:
        while True:
            result = execute(steps.send(result))
    except StopIteration as done:
        value: T = done.value
        return value
    except Missing as gone:
        raise missing(gone.task_id, gone.outcome) from None


async def run_async(steps: Steps[T], execute: Callable[[Statement | Notify], Awaitable[Any]],
                    missing: MissingError) -> T:
    """Carry out *steps* with an async driver, sending each statement's result back."""
    result = None
    try:
        while True:
            result = await execute(steps.send(result))
    except StopIteration as done:
        value: T = done.value
        return value
    except Missing as gone:
        raise missing(gone.task_id, gone.outcome) from None


# ------------------------------------------------------------------ tasks


def first_fence(created_at: float) -> int:
    """The fence a new task row starts with (see :func:`create_task`)."""
    return int(created_at * 1_000_000)


def create_task(record: TaskRecord, head: bytes, wake_at: float | None,
                blobs: Mapping[str, bytes]) -> Steps[None]:
    """The task row, its version-1 head and the large values it refers to.

    The fence starts at the creation time in microseconds, not at 0: a task deleted and
    submitted again under its id is another incarnation, and a worker that was paused past
    its lease on the old one must not hold a fence the new one reaches (each claim adds one,
    far fewer than the microseconds between a delete and the next create)."""
    created = yield change(q.INSERT_TASK, record.task_id, record.agent, record.status.value,
                           record.created_at, record.updated_at, wake_at,
                           first_fence(record.created_at), record.reason)
    if created == 0:
        raise TaskExists(f"a task with id {record.task_id!r} already exists; nothing was changed")
    yield change(q.INSERT_SNAPSHOT, record.task_id, 1, record.created_at, head)
    yield from put_blobs(blobs, record.created_at)
    yield Notify(record.task_id)


def get_task(task_id: str) -> Steps[TaskRecord]:
    row = yield one(q.GET_TASK, task_id)
    if row is None:
        raise Missing(task_id)
    return rows.task_record(row)


def list_tasks(status: Status | None, limit: int) -> Steps[list[TaskRecord]]:
    found = yield (every(q.LIST_TASKS_IN, status.value, limit) if status
                   else every(q.LIST_TASKS, limit))
    return [rows.task_record(row) for row in found]


def leased_tasks(limit: int) -> Steps[list[TaskRecord]]:
    found = yield every(q.LEASED_TASKS, limit)
    return [rows.task_record(row) for row in found]


def find_tasks(query: TaskQuery) -> Steps[list[TaskRecord]]:
    params: list[Any] = []
    if query.status is not None:
        params.append(query.status.value)
    if query.agent is not None:
        params.append(query.agent)
    if query.text:
        pattern = "%" + _like_escaped(query.text.lower()) + "%"
        params += [pattern, pattern]
    sql = q.find_tasks(query.status is not None, query.agent is not None, bool(query.text))
    found = yield every(sql, *params, query.limit, query.offset)
    return [rows.task_record(row) for row in found]


def _like_escaped(text: str) -> str:
    return text.replace("!", "!!").replace("%", "!%").replace("_", "!_")


def count_by_status() -> Steps[dict[str, int]]:
    found = yield every(q.COUNT_BY_STATUS)
    return {row["status"]: int(row["tasks"]) for row in found}


def wake_all(status: Status, now: float) -> Steps[int]:
    woken: int = yield change(q.WAKE_ALL, now, status.value)
    return woken


def next_epoch(task_id: str) -> Steps[int]:
    row = yield one(q.NEXT_EPOCH, task_id)
    if row is None:
        raise Missing(task_id)
    return int(row["max_epoch"])


def fence(claim: Claim) -> Steps[rows.Row]:
    """Lock the task's row and check that *claim* still holds it; returns the row
    (:data:`tether.store.queries.FENCE`: fence, head_version, status, wake_at, lease_until)."""
    row: rows.Row | None = yield one(q.FENCE, claim.task_id, lock=True)
    return fenced(claim, row)


def fenced(claim: Claim, row: rows.Row | None) -> rows.Row:
    """The task's row read by :data:`tether.store.queries.FENCE`, if *claim* still holds it."""
    if row is None:
        raise Missing(claim.task_id)
    if row["fence"] != claim.fence:
        raise lease_lost(claim, row["fence"])
    return row


def inbox_moved(task_id: str) -> InboxMoved:
    return InboxMoved(f"task {task_id}: events its runner has not read reached its inbox;"
                      " the checkpoint was not written (the runner reads them and goes on)")


def unseen_events(pending: Sequence[int], checkpoint: Checkpoint) -> bool:
    """Whether the inbox holds an event the checkpoint's condition does not allow (see
    :attr:`Checkpoint.inbox_seen`): pending, not among those seen, not consumed by it."""
    seen = checkpoint.inbox_seen
    if seen is None:
        return False
    consumed = {event_id for event_id, _ in checkpoint.events_done}
    return any(event_id not in seen and event_id not in consumed for event_id in pending)


def lease_lost(claim: Claim, fence_now: object) -> LeaseLost:
    """The error for a write under *claim* after another worker moved the fence to *fence_now*."""
    return LeaseLost(f"task {claim.task_id}: lease fence {claim.fence} is stale (now {fence_now});"
                     " another worker took the task over, so this write was refused")


def set_status(task_id: str, status: Status, reason: str | None, now: float,
               wake_at: float | None) -> Steps[None]:
    """Only the task row, under a fence the caller checked; then the inbox is settled."""
    yield change(q.SET_STATUS, status.value, reason, now, wake_at, task_id)
    yield from settle_inbox(task_id, status, now, wake_at)


# ------------------------------------------------------------------ checkpoints


def version_after(head: int, newest: rows.Row) -> int:
    """The next version number, given the task's head and a row whose ``newest`` is the
    task's newest version (:data:`tether.store.queries.NEWEST_VERSION`)."""
    return max(head, int(newest["newest"] or 0)) + 1


def put_blobs(blobs: Mapping[str, bytes], now: float) -> Steps[None]:
    """Large values by digest (R20): stored once, by whoever wrote them first."""
    if blobs:
        yield change_many(q.INSERT_BLOB, [(digest, data, now) for digest, data in blobs.items()])


def checkpoint_batches(task_id: str, checkpoint: Checkpoint, now: float) -> list[Statement]:
    """What one checkpoint adds beside its head: large values, dialog rows, consumed events,
    call records and the recovery log. Plain statements (none needs a result), so the
    SQLite store runs them directly and PostgreSQL pipelines them."""
    batches = []
    if checkpoint.blobs:
        batches.append(change_many(q.INSERT_BLOB, [(digest, data, now)
                                                   for digest, data in checkpoint.blobs.items()]))
    if checkpoint.history:
        batches.append(change_many(q.INSERT_HISTORY, [
            (task_id, r.epoch, r.seq, orjson.dumps(r.entry)) for r in checkpoint.history]))
    if checkpoint.events_done:
        batches.append(change_many(q.EVENT_DONE, [
            (disposition, now, event_id, task_id) for event_id, disposition in checkpoint.events_done]))
    if checkpoint.idempotency:
        batches.append(change_many(q.PUT_IDEMPOTENCY, [_idempotency_params(r, now)
                                                       for r in checkpoint.idempotency]))
    if checkpoint.recovery_log:
        batches.append(change_many(q.INSERT_RECOVERY, [(task_id, now, orjson.dumps(r))
                                                       for r in checkpoint.recovery_log]))
    return batches


def _idempotency_params(record: IdempotencyRecord, now: float) -> tuple[Any, ...]:
    return (record.key, record.task_id, record.tool, record.args_hash, record.status,
            orjson.dumps(record.result), record.error, record.attempts, now)


def stranded_wake(status: Status, wake_at: float | None, now: float) -> str | None:
    """After a commit (or status change) leaves a task in *status*: which of its pending events
    make it due at once, because they arrived after the runner's last look; None when nothing
    can be stranded (a running task that is not backing off)."""
    if status is Status.RUNNING and (wake_at is None or wake_at <= now):
        return None
    if status in (Status.WAITING, Status.PAUSED, Status.RUNNING):
        return q.URGENT
    return q.LEVERS


def settle_inbox(task_id: str, status: Status, now: float, wake_at: float | None) -> Steps[None]:
    """Events that arrived after the runner's last look must not be stranded by this write.

    A parked task with such events is due at once (a running one only matters when it is
    parked until a back-off ends); a finished one marks the events it can never apply as
    ignored (levers that may reopen it, like rollback, stay pending).
    """
    wakes = stranded_wake(status, wake_at, now)
    if wakes is None:
        return
    if status in (Status.COMPLETED, Status.CANCELLED):
        yield change(q.IGNORE_PENDING, now, task_id, status.value)
    if (yield one(q.pending_where(wakes), task_id)) is not None:
        yield change(q.WAKE_TASK, now, task_id)


# ------------------------------------------------------------------ reading snapshots


def load_head(task_id: str, version: int | None) -> Steps[tuple[int, bytes]]:
    """The head at *version* (None: the newest); an unknown task is :class:`Missing`, a
    version not kept :class:`VersionNotFound` naming those that are."""
    row = yield (one(q.NEWEST_HEAD, task_id) if version is None
                 else one(q.HEAD_AT, task_id, version))
    if row is None:
        record = yield from get_task(task_id)
        versions = yield from list_versions(task_id)
        kept = [number for number, _, _ in versions]
        wanted = record.head_version if version is None else version
        raise VersionNotFound(f"task {task_id}: version {wanted} is not kept (kept: {kept})")
    return int(row["version"]), bytes(row["head"])


def list_versions(task_id: str) -> Steps[list[tuple[int, float, int]]]:
    found = yield every(q.LIST_VERSIONS, task_id)
    return [rows.version(row) for row in found]


def read_history(task_id: str, segments: Sequence[Sequence[int]]) -> Steps[list[dict[str, Any]]]:
    """The dialog along a branch: each segment [epoch, last seq or -1] follows the one before."""
    entries: list[dict[str, Any]] = []
    first = 1
    for epoch, last in segments:
        upper = OPEN_END if last < 0 else last
        found = yield every(q.HISTORY, task_id, epoch, first, upper)
        entries.extend(orjson.loads(row["entry"]) for row in found)
        first = upper + 1
    return entries


def count_history(task_id: str, segments: Sequence[Sequence[int]]) -> Steps[int]:
    """How many rows :func:`read_history` would give for *segments*, without reading them."""
    count, first = 0, 1
    for epoch, last in segments:
        upper = OPEN_END if last < 0 else last
        row = yield one(q.COUNT_HISTORY, task_id, epoch, first, upper)
        count += int(row["n"]) if row is not None else 0
        first = upper + 1
    return count


# ------------------------------------------------------------------ events


def statuses_woken(priority: int, limits: InboxLimits) -> list[str]:
    """The task statuses a newly stored event makes due at once. P0-P2 wake a parked or
    backing-off task; P3/P4 only update state (R4); levers also reach what they may reopen."""
    woken = ["waiting", "paused", "running"] if priority <= 2 else []
    woken += [status.value for status in limits.reopens]
    if limits.wakes_needs_human:
        woken.append("needs_human")
    return woken


def add_event(event: Event, priority: int, limits: InboxLimits, now: float) -> Steps[EmitReceipt]:
    """Store an event: deduplicated by ``source_event_id``, refused by a finished task or a
    full inbox, coalesced with the older pending events it replaces, waking its task."""
    task = yield one(q.TASK_STATUS, event.task_id, lock=True)  # one event at a time per task
    if event.source_event_id is not None:
        seen = yield one(q.SEEN_EVENT, event.task_id, event.source_event_id)
        if seen is not None:
            return EmitReceipt(False, int(seen["id"]), "duplicate")
    if task is None:
        raise Missing(event.task_id, "; the event was not stored")
    status = Status(task["status"])
    if status.is_terminal and status not in limits.reopens:
        raise TaskClosed(f"task {event.task_id} is {status.value}; the event was not stored")
    superseding = (priority, limits.coalesce, now - limits.window,
                   priority >= 3 and limits.coalesce is not None, event.type)
    # Without a coalescing class nothing is superseded: skip the scans of the pending events
    # (with a long inbox, they made every send slower than the last).
    classed = limits.coalesce is not None
    if limits.refusable:  # a full inbox refuses it, unless it only replaces an older one
        replaces = (yield one(q.ANY_SUPERSEDED, event.task_id, *superseding)) if classed else None
        if replaces is None:
            yield from _check_capacity(event, limits)
    inserted = yield one(q.INSERT_EVENT, event.task_id, event.type, priority,
                         orjson.dumps(event.payload), event.source_event_id, limits.coalesce,
                         limits.wakes_needs_human, now)
    event_id = int(inserted["id"])
    failpoint("event_stored")
    coalesced: int = (yield change(q.COALESCE, now, event.task_id, event_id, *superseding)
                      ) if classed else 0
    wakeable = statuses_woken(priority, limits)
    if wakeable:  # P3/P4 only update state: they never wake a parked task (R4)
        yield change(q.wake_in(len(wakeable)), now, event.task_id, *wakeable)
    yield Notify(event.task_id)
    return EmitReceipt(True, event_id, "stored", coalesced)


def _check_capacity(event: Event, limits: InboxLimits) -> Steps[None]:
    row = yield one(q.COUNT_PENDING_OF, event.task_id)
    pending = int(row["pending"])
    if pending >= limits.capacity:
        raise InboxFull(
            f"task {event.task_id}: inbox holds {pending} pending events (capacity "
            f"{limits.capacity}); {event.type!r} is low priority and was refused, retry later")


def pending_events(task_id: str) -> Steps[list[StoredEvent]]:
    found = yield every(q.PENDING_EVENTS, task_id)
    return [rows.stored_event(row) for row in found]


def list_events(task_id: str) -> Steps[list[StoredEvent]]:
    found = yield every(q.LIST_EVENTS, task_id)
    return [rows.stored_event(row) for row in found]


def count_pending_events() -> Steps[int]:
    row = yield one(q.COUNT_PENDING)
    return int(row["pending"])


# ------------------------------------------------------------------ idempotency, recovery log


def get_idempotency(key: str) -> Steps[IdempotencyRecord | None]:
    row = yield one(q.GET_IDEMPOTENCY, key)
    return None if row is None else rows.idempotency_record(row)


def keys_of(task_id: str) -> tuple[str, str, str]:
    """The parameters of a query for a task's idempotency records (``queries._OF_TASK``):
    the keys from its id and a colon up to, not including, its id and a semicolon (the
    character after the colon), and the task itself."""
    return f"{task_id}:", f"{task_id};", task_id


def check_owned(task_id: str, records: Sequence[IdempotencyRecord]) -> None:
    """Refuse a record of another task, or one whose key does not begin with its task's id
    and a colon: the store finds a task's records by that prefix (loading, listing,
    deleting), so such a record would be lost to its task. Every key tether makes has it
    (``tether.tools.idempotency_key``, a fork's ``own_key``)."""
    for record in records:
        if record.task_id != task_id or not record.key.startswith(f"{task_id}:"):
            raise InvalidInput(f"task {task_id}: idempotency record {record.key!r} of task"
                               f" {record.task_id!r} is not this task's (its key must begin"
                               f" with {task_id + ':'!r}); nothing was written")


def idempotency_keys(task_id: str) -> Steps[set[str]]:
    found = yield every(q.IDEMPOTENCY_KEYS, *keys_of(task_id))
    return {str(row["key"]) for row in found}


def list_idempotency(task_id: str) -> Steps[list[IdempotencyRecord]]:
    found = yield every(q.LIST_IDEMPOTENCY, *keys_of(task_id))
    return [rows.idempotency_record(row) for row in found]


def list_recovery_log(task_id: str) -> Steps[list[dict[str, Any]]]:
    found = yield every(q.RECOVERY_LOG, task_id)
    return [orjson.loads(row["record"]) for row in found]

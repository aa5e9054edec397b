"""The embedded default store: one SQLite file, no server (R13).

WAL journal with ``synchronous=FULL`` by default, so an acknowledged event or
tool result survives power loss, not just a crash. A lease's bookkeeping alone (a claim,
a renewal, a release) commits without the fsync (``sqlite_group_commit.Synced``): nothing
depends on it surviving a power cut, and the next checkpoint syncs it. Every write transaction
starts with ``BEGIN IMMEDIATE`` so concurrent worker processes queue on the
write lock instead of failing with SQLITE_BUSY when a read upgrades.

Calls run inline on the event loop rather than in a thread: a small commit
costs ~0.2 ms, less than a hop to a worker thread and back, and no await
point inside a transaction means no interleaving between coroutines.

Faults (``sqlite_faults``): a write lock held by another process past the busy timeout is
:class:`StoreUnavailable` (workers ride it out); a damaged file is :class:`CorruptStore`,
naming the file and what to do, never a traceback or "no such task"; a file found damaged
(checked at open when small, ``sqlite_integrity``, or met later) refuses every write.

The file under the store (issue 26): the store remembers the file's identity (device and
inode) when it opens it and looks again with one ``os.stat`` in every write transaction,
under the write lock, and at the start of every claim round (so an idle worker notices
too): about 6 µs in a running worker, against a commit's hundreds. A file deleted or
replaced meanwhile (``rm``, ``mv``, a restore by rename) would take this connection's
writes into a file nobody else sees: the store raises :class:`StoreReplaced` (a
:class:`CorruptStore`, so a worker stops) and refuses every write from then on. A file
overwritten in place keeps its inode: that is damage, and met as damage.

Time: one machine, one clock. Leases, due times and event windows are compared with the
times each process reads from its own wall clock (``time.time()``). The processes sharing
a SQLite file all run on one machine (SQLite's locking is not safe over a network
filesystem), so they read the same clock and agree on every lease. If that clock is
stepped (NTP, by hand), every process sees the step at once: a step forward by more than a
lease makes held leases look expired, and another worker may take such a task over, which
the lease's fencing token keeps safe (the old holder's writes are refused) at the cost of
one counted recovery; a step back only makes leases last longer. For workers on several
machines use PostgreSQL, where leases are judged by the database server's clock.

What SQLite does as PostgreSQL does is written once (the SQL in ``queries``, the algorithms in
``steps``, row mappers in ``rows``, the methods in ``backend``); this module keeps SQLite's I/O
and what only SQLite does: claims through partial indexes, lease times by this machine's
clock, snapshot rows rewritten in place, group commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sqlite3
import time
import weakref
from collections.abc import Collection, Iterator
from typing import Any, TypeVar

import orjson

from tether.errors import StoreError, StoreReplaced, TetherError
from tether.failpoints import failpoint
from tether.model import IdempotencyRecord, Status, TaskRecord
from tether.store import queries as q
from tether.store import rows, sqlite_integrity, sqlite_schema, steps
from tether.store.backend import SQLBackend
from tether.store.base import Checkpoint, Claim, StoredEvent
from tether.store.sqlite_faults import Damage, guarded
from tether.store.sqlite_group_commit import GroupCommit, Synced, write_transaction
from tether.store.steps import Notify, Statement, Steps

T = TypeVar("T")

# SQLite's own way to claim (PostgreSQL takes a row with FOR UPDATE SKIP LOCKED instead).
# Claimable: not leased (or the lease expired), not among the tasks the asking worker is still
# running (its runner may only be slow), and with work to do. Each branch is a range scan of a
# partial index, so a claim stays cheap however many tasks wait or have finished (E7):
# pending and running tasks with no due time and no holder (a leased one is not even looked
# at, so a worker taking back 1,000 tasks does not step over the ones it already took, each
# claim; one whose holder's lease ran out is the orphaned branch's); open tasks whose due
# time came (a timer, a deadline, a scheduled start, a back-off, an event that woke them);
# tasks whose holder died (lease expired while still owned: recovered before any new work,
# so a dead worker's tasks never wait behind a backlog); finished tasks that a lever
# (rollback, resume) woke up.
# SQLite has no array parameters: the busy tasks come as one JSON list.
_NOT_BUSY = "task_id NOT IN (SELECT value FROM json_each(:busy))"
_FREE = f"(lease_until IS NULL OR lease_until < :now) AND {_NOT_BUSY}"
_BRANCHES = (
    f"""SELECT task_id, created_at AS due FROM tasks INDEXED BY tasks_unleased
         WHERE status IN ('pending', 'running') AND wake_at IS NULL AND lease_owner IS NULL
           AND {_FREE}""",
    f"""SELECT task_id, wake_at AS due FROM tasks INDEXED BY tasks_open
         WHERE status IN {q.OPEN} AND wake_at <= :now AND {_FREE}""",
    f"""SELECT task_id, 0 AS due FROM tasks INDEXED BY tasks_orphaned
         WHERE lease_owner IS NOT NULL AND lease_until < :now AND status IN {q.OPEN}
           AND {_NOT_BUSY}""",
    f"""SELECT task_id, wake_at AS due FROM tasks
         WHERE status IN ('failed', 'completed') AND wake_at <= :now AND {_FREE}""",
)
# Each branch is its own query stopping at a few rows in index order (as one compound query,
# SQLite sorted every matching row on each claim): a backlog is never sorted per claim.
_CANDIDATES = tuple(f"{branch} LIMIT :looked_at" for branch in _BRANCHES)
SPARE_CANDIDATES = 7
"""Candidates looked at beyond the tasks a claim asks for: other workers may take some of
them between the read and the lock."""
# The same test for one row, under the write lock (another worker may have just taken it).
_CLAIMABLE = f"""SELECT {q.TASK_COLUMNS} FROM tasks WHERE task_id = :task_id AND {_FREE} AND (
    (status IN {q.OPEN} AND (lease_owner IS NOT NULL OR wake_at <= :now
                             OR (status IN ('pending', 'running') AND wake_at IS NULL)))
    OR (status IN ('failed', 'completed') AND wake_at <= :now))"""
_TAKE = ("UPDATE tasks SET lease_owner = ?, lease_until = ?, fence = fence + 1,"
         " crashes = crashes + ?,"
         f" {q.start_pending()} WHERE task_id = ? RETURNING fence, crashes")
# Lease ends are this machine's clock (PostgreSQL's are the server's: its own statements).
_RENEW = "UPDATE tasks SET lease_until = ? WHERE task_id = ?"
_BREAK = ("UPDATE tasks SET lease_until = 0 WHERE task_id = ? AND lease_owner = ?"
          " AND lease_until > 0")
_RELEASE = "UPDATE tasks SET lease_owner = NULL, lease_until = ?, fence = fence + 1 WHERE task_id = ?"
# A new head takes over the row of the oldest version falling out of the kept ones (by rowid,
# which only SQLite has): see _put_head.
_REUSE_SNAPSHOT = ("UPDATE snapshots SET version = ?, created_at = ?, head = ? WHERE rowid = ("
                   " SELECT rowid FROM snapshots WHERE task_id = ? AND version <= ? ORDER BY version"
                   " LIMIT 1)")
# A checkpoint's one read before it writes: the fence, the newest version (a rollback may
# have left versions above the head) and the oldest kept (see _put_head), in one statement.
_FENCE_AND_NEWEST = ("SELECT fence, head_version, status, wake_at, lease_until, (SELECT MAX(version)"
                     " FROM snapshots WHERE task_id = ?1) AS newest, (SELECT MIN(version)"
                     " FROM snapshots WHERE task_id = ?1) AS oldest FROM tasks WHERE task_id = ?1")
# No array parameters in SQLite: the digests come as one JSON list.
_NEWEST_ROWS = ("SELECT (SELECT COALESCE(MAX(id), 0) FROM events) AS events,"
                " (SELECT COALESCE(MAX(rowid), 0) FROM tasks) AS tasks")
"""What moves when anyone stores an event or a task (SQLite's change signal)."""
_BLOBS = "SELECT digest, data FROM blobs WHERE digest IN (SELECT value FROM json_each(?))"


@guarded  # every public coroutine: sqlite3 errors become StoreUnavailable/CorruptStore/StoreError
class SQLiteStore(SQLBackend):
    """A :class:`tether.store.base.Store` on one SQLite database file (or ``:memory:``)."""

    hands_over_slots = False  # another process's worker cannot be told of a slot let go

    def __init__(self, path: str, synchronous: str = "FULL", busy_timeout_ms: int = 10_000) -> None:
        self.path = path
        self.damage = Damage(path)
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite store at {path!r}: {exc}") from exc
        sqlite_schema.prepare(self._db, path, synchronous, busy_timeout_ms, self.damage)
        self._db.row_factory = sqlite3.Row  # rows are read by column name
        self._execute = functools.partial(_execute, self._db)
        self._synced = _synced(self._db)
        self._group = GroupCommit(self._db, path, self._synced)
        self._rows_seen: weakref.WeakKeyDictionary[asyncio.Task[Any], tuple[int, int]] = \
            weakref.WeakKeyDictionary()
        """Per watching task, the newest rows its last look saw (see wait_for_change)."""
        self.file = FileIdentity(path)
        """The file this store opened, checked before every write."""

    # ------------------------------------------------------------------ plumbing

    @contextlib.contextmanager
    def _transaction(self, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken with the write lock up front, on the file opened;
        not *durable* (a lease's bookkeeping), committed without an fsync (Synced)."""
        self.file.refuse_if_replaced()
        self.damage.refuse_writes()
        with write_transaction(self._db, self.path, None if durable else self._synced) as db:
            self.file.check()  # under the lock: nothing is written once the file is gone
            yield db

    def _run(self, db: sqlite3.Connection, work: Steps[T]) -> T:
        """Carry out shared steps on *db*, synchronously (nothing interleaves with them)."""
        return steps.run(work, self._execute if db is self._db else functools.partial(_execute, db),
                         self._missing)

    async def _read(self, work: Steps[T]) -> T:
        return self._run(self._db, work)

    async def _write(self, work: Steps[T]) -> T:
        with self._transaction() as db:
            return self._run(db, work)

    async def _read_snapshot(self, work: Steps[T]) -> T:
        """A deferred transaction: in WAL mode its reads share one snapshot (the steps run
        synchronously, so no other coroutine of this process uses the connection meanwhile)."""
        self._db.execute("BEGIN")
        try:
            return self._run(self._db, work)
        finally:
            self._db.execute("COMMIT")

    def _missing(self, task_id: str, outcome: str = "") -> TetherError:
        """TaskNotFound, unless damage may be what hides the task."""
        return sqlite_integrity.missing(self._db, self.damage, task_id, outcome)

    async def clock(self) -> float:
        """This machine's time: the file's every writer is on it."""
        return time.time()

    async def ping(self) -> None:
        """An empty write transaction: the write lock can be had (nothing is written)."""
        with self._transaction():
            pass

    async def integrity_check(self) -> list[str]:
        """What is wrong with the file and its tables (sqlite_integrity.problems); [] = fine."""
        return sqlite_integrity.problems(self._db)

    def pragma(self, name: str) -> Any:
        """Read a PRAGMA (tests check the durability defaults with it)."""
        return self._db.execute(f"PRAGMA {name}").fetchone()[0]

    # ------------------------------------------------------------------ leases

    async def claim(self, worker: str, now: float, lease: float,
                    busy: Collection[str] = ()) -> Claim | None:
        taken = await self.claim_many(worker, now, lease, 1, busy)
        return taken[0] if taken else None

    async def claim_many(self, worker: str, now: float, lease: float, most: int,
                         busy: Collection[str] = ()) -> list[Claim]:
        """Find candidates with a plain read, soonest due first, then take up to *most* of
        them still free under the lock."""
        self.file.check()  # every claim round, so an idle worker notices too
        looked_at = most + SPARE_CANDIDATES
        params = {"now": now, "busy": orjson.dumps(list(busy)).decode(), "looked_at": looked_at}
        found = [row for query in _CANDIDATES for row in self._db.execute(query, params)]
        soonest = sorted(found, key=lambda row: row["due"])[:looked_at]
        candidates = [row["task_id"] for row in soonest]
        if not candidates:
            return []
        self.file.refuse_if_replaced()
        self.damage.refuse_writes()
        return await self._group.write(  # claims made together share a transaction
            lambda db: self._take_free(db, candidates, params, worker, lease, most),
            durable=False)

    def _take_free(self, db: sqlite3.Connection, candidates: list[str], params: dict[str, Any],
                   worker: str, lease: float, most: int) -> list[Claim]:
        """Up to *most* candidates still free under the lock (a claim in the same batch, or
        another process, may have taken some)."""
        self.file.check()
        taken: list[Claim] = []
        for task_id in candidates:
            if len(taken) == most:
                break
            free = db.execute(_CLAIMABLE, {**params, "task_id": task_id}).fetchone()
            if free is not None:  # the row as it is under the lock, read with the check
                taken.append(_take(db, rows.task_record(free), worker, params["now"], lease))
        return taken

    async def claim_task(self, task_id: str, worker: str, now: float, lease: float) -> Claim | None:
        with self._transaction(durable=False) as db:
            task = self._run(db, steps.get_task(task_id))
            if task.lease_until is not None and task.lease_until >= now:
                return None
            return _take(db, task, worker, now, lease)

    def _check_fence(self, db: sqlite3.Connection, claim: Claim, read: str = q.FENCE) -> Any:
        """The one fence check of every write under a lease: the task's row as *read* gives
        it (at least its fence, head_version, status, wake_at, lease_until) if *claim* still
        holds it, else LeaseLost."""
        try:  # on every step: read directly, decided by the shared check
            return steps.fenced(claim, db.execute(read, (claim.task_id,)).fetchone())
        except steps.Missing as gone:
            raise self._missing(gone.task_id) from None

    async def renew(self, claim: Claim, until: float) -> None:
        with self._transaction(durable=False) as db:
            self._check_fence(db, claim)
            db.execute(_RENEW, (until, claim.task_id))

    async def break_lease(self, task_id: str, holder: str) -> bool:
        with self._transaction() as db:
            return db.execute(_BREAK, (task_id, holder)).rowcount > 0

    async def release(self, claim: Claim, hold_until: float | None = None) -> None:
        """Through the group commit: tasks ending together (a recovering worker's) share one
        transaction; committed without an fsync (Synced), like a claim."""
        self.file.refuse_if_replaced()
        self.damage.refuse_writes()
        await self._group.write(lambda db: self._release(db, claim, hold_until), durable=False)

    def _release(self, db: sqlite3.Connection, claim: Claim, hold_until: float | None) -> None:
        self.file.check()
        self._check_fence(db, claim)
        db.execute(_RELEASE, (hold_until, claim.task_id))

    async def set_status(self, claim: Claim, status: Status, reason: str | None,
                         wake_at: float | None = None) -> None:
        with self._transaction() as db:
            self._check_fence(db, claim)
            self._run(db, steps.set_status(claim.task_id, status, reason, time.time(), wake_at))

    # ------------------------------------------------------------------ the step's reads

    async def pending_events(self, task_id: str) -> list[StoredEvent]:
        """Read on every tick: run directly (the shared SQL and row mapper), not as steps."""
        return [rows.stored_event(row) for row in self._db.execute(q.PENDING_EVENTS, (task_id,))]

    async def get_idempotency(self, key: str) -> IdempotencyRecord | None:
        """Read before every tool call: run directly, like :meth:`pending_events`."""
        row = self._db.execute(q.GET_IDEMPOTENCY, (key,)).fetchone()
        return None if row is None else rows.idempotency_record(row)

    # ------------------------------------------------------------------ checkpoints

    async def commit(self, claim: Claim, checkpoint: Checkpoint, keep: int, lease_until: float) -> int:
        version, _ = await self._commit(claim, checkpoint, keep, lease_until, reading=False)
        return version

    async def commit_reading(self, claim: Claim, checkpoint: Checkpoint, keep: int,
                             lease_until: float) -> tuple[int, list[StoredEvent] | None]:
        """The inbox is read inside the commit's transaction, under the file's write lock, so
        what it gives is the inbox as it stands once the commit is written; the read a
        checkpoint with ``inbox_seen`` makes to check it is that same read. None where the
        commit settles the inbox itself (a parked or finished task): the caller reads."""
        return await self._commit(claim, checkpoint, keep, lease_until, reading=True)

    async def _commit(self, claim: Claim, checkpoint: Checkpoint, keep: int, lease_until: float,
                      reading: bool) -> tuple[int, list[StoredEvent] | None]:
        self.file.refuse_if_replaced()
        self.damage.refuse_writes()
        steps.check_owned(claim.task_id, checkpoint.idempotency)
        return await self._group.write(
            lambda db: self._checkpoint(db, claim, checkpoint, keep, lease_until, reading))

    def _checkpoint(self, db: sqlite3.Connection, claim: Claim, checkpoint: Checkpoint, keep: int,
                    lease_until: float, reading: bool) -> tuple[int, list[StoredEvent] | None]:
        """Write one checkpoint, inside the group commit's transaction; with *reading*, the
        task's pending events once it is written."""
        self.file.check()  # under the lock: a step is acknowledged only once in the file opened
        now = time.time()
        task_id = claim.task_id
        task = self._check_fence(db, claim, _FENCE_AND_NEWEST)
        pending = None
        if reading or checkpoint.inbox_seen is not None:  # no event lands under the lock
            pending = [rows.stored_event(row) for row in db.execute(q.PENDING_EVENTS, (task_id,))]
            if steps.unseen_events([e.event.id for e in pending if e.event.id is not None],
                                   checkpoint):
                raise steps.inbox_moved(task_id)
        version = steps.version_after(int(task["head_version"]), task)
        _put_head(db, task_id, version, task["oldest"], keep, checkpoint.head, now)
        failpoint("mid_checkpoint")
        for batch in steps.checkpoint_batches(task_id, checkpoint, now):  # the hot path: direct
            db.executemany(batch.sql, batch.params)
        db.execute(*_update_task(task_id, version, checkpoint,
                                 (task["status"], task["wake_at"], task["lease_until"]),
                                 (now, lease_until)))
        if steps.stranded_wake(checkpoint.status, checkpoint.wake_at, now) is not None:
            self._run(db, steps.settle_inbox(task_id, checkpoint.status, now, checkpoint.wake_at))
            return version, None
        if not reading or pending is None:
            return version, None
        consumed = {event_id for event_id, _ in checkpoint.events_done}
        return version, [e for e in pending if e.event.id not in consumed]

    async def load_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        return rows.blobs(self._db.execute(_BLOBS, (orjson.dumps(list(digests)).decode(),)))

    # ------------------------------------------------------------------ lifecycle

    async def wait_for_change(self, timeout: float, poll: float,
                              hurry: asyncio.Event | None = None) -> frozenset[str] | None:
        """SQLite cannot say what changed, only that it did: the newest row ids of the task
        and event tables move. Reading them is two lookups of a B-tree's last entry, pages
        already in the cache; it also starts a fresh read, so commits of other processes are
        seen at once (``PRAGMA data_version`` alone lags until the connection reads). Each
        asking task's look compares with what its previous look saw, so what was stored
        while it acted on that look is reported by the next."""
        end = time.monotonic() + timeout
        asking = asyncio.current_task()
        seen = self._rows_seen.get(asking) if asking is not None else None
        if seen is None:
            seen = self._newest_rows()
        if asking is not None:
            self._rows_seen[asking] = seen
        while (left := end - time.monotonic()) > 0:
            if hurry is None:
                await asyncio.sleep(min(poll, left))
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(hurry.wait(), min(poll, left))
            now_seen = self._newest_rows()
            if now_seen != seen:
                if asking is not None:  # the next look compares with this: what was stored
                    self._rows_seen[asking] = now_seen  # while the caller acted is not missed
                return None
            if hurry is not None and hurry.is_set():
                break
        return frozenset()

    def _newest_rows(self) -> tuple[int, int]:
        row = self._db.execute(_NEWEST_ROWS).fetchone()
        return int(row["events"]), int(row["tasks"])

    async def migrate(self) -> list[str]:
        """The SQLite schema is created (idempotently) when the store opens: nothing to do."""
        return []

    async def close(self) -> None:
        self._db.close()


class FileIdentity:
    """A store file's identity (device, inode) when it was opened, and whether the file at
    its path is still that one. Once it is not, it never is again: every write is refused."""

    def __init__(self, path: str) -> None:
        self.path = None if path == ":memory:" else os.path.abspath(path)
        self.opened = None if self.path is None else _identity(self.path)
        self.replaced: str | None = None
        """Why writes are refused (the file was deleted or replaced), once that was seen."""

    def refuse_if_replaced(self) -> None:
        """StoreReplaced if the file was already found gone (no system call)."""
        if self.replaced is not None:
            raise StoreReplaced(self.replaced)

    def check(self) -> None:
        """StoreReplaced if the file at the path is no longer the one opened (one os.stat)."""
        self.refuse_if_replaced()
        if self.opened is None or self.path is None:
            return
        now = _identity(self.path)
        if now == self.opened:
            return
        if now is None:
            what, change = "deleted", f"inode {self.opened[1]} → missing"
        elif now[0] != self.opened[0]:
            what, change = "replaced", (f"device {self.opened[0]} inode {self.opened[1]} →"
                                        f" device {now[0]} inode {now[1]}")
        else:
            what, change = "replaced", f"inode {self.opened[1]} → {now[1]}"
        self.replaced = (f"the store file {self.path} was {what} while this process had it open"
                         f" ({change}); stopping: nothing more is written to it (start again on"
                         " the file there now, or put back the one you meant)")
        raise StoreReplaced(self.replaced)


_LEVELS = {2: "FULL", 3: "EXTRA"}
"""PRAGMA synchronous's numbers for the levels that fsync every commit."""


def _synced(db: sqlite3.Connection) -> Synced | None:
    """The durable level a lease's bookkeeping may commit without, where that is safe: a
    file in WAL mode (in rollback-journal mode an unsynced commit could corrupt the file on
    a power cut) set to fsync every commit."""
    mode = str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower()
    level = _LEVELS.get(int(db.execute("PRAGMA synchronous").fetchone()[0]))
    return Synced(level) if mode == "wal" and level is not None else None


def _identity(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file at *path*; None if there is none."""
    try:
        found = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return found.st_dev, found.st_ino


def _execute(db: sqlite3.Connection, statement: Statement | Notify) -> Any:
    """One statement of the shared steps (their ``?`` placeholders are SQLite's own)."""
    if isinstance(statement, Notify):
        return None  # nobody to tell: idle SQLite workers look again (wait_for_work)
    if statement.many:
        return db.executemany(statement.sql, statement.params).rowcount
    cursor = db.execute(statement.sql, statement.params)
    if statement.result == "one":
        return cursor.fetchone()
    if statement.result == "all":
        return cursor.fetchall()
    return cursor.rowcount


def _take(db: sqlite3.Connection, task: TaskRecord, worker: str, now: float, lease: float) -> Claim:
    """Lease *task* to *worker*: a new fence, and a crash counted if its holder never let go."""
    crashed = task.lease_owner is not None and task.status.value not in q.FINISHED
    row = db.execute(_TAKE, (worker, now + lease, int(crashed), now, task.task_id)).fetchone()
    return Claim(task.task_id, int(row["fence"]), crashed=crashed, crashes=int(row["crashes"]),
                 head_version=task.head_version, created_at=task.created_at,
                 started=task.status is Status.PENDING)


def _put_head(db: sqlite3.Connection, task_id: str, version: int, oldest: int | None,
              keep: int, head: bytes, now: float) -> None:
    """Store the new head *version* in the row of the oldest version that falls out of the
    kept ones (*oldest*: the oldest version the task keeps now).

    Rewriting a row in place dirties its page and one index page; inserting and deleting
    a ~2 KB row each time also split, freed and reallocated pages, twice the WAL frames
    to fsync per step. Versions beyond *keep* left over (keep was lowered: more than one
    falls out at once, so the oldest was below the one reused) are dropped.
    """
    oldest_dropped = version - keep  # no version is below 1: a young task has none to reuse
    if oldest_dropped < 1 or db.execute(
            _REUSE_SNAPSHOT, (version, now, head, task_id, oldest_dropped)).rowcount == 0:
        db.execute(q.INSERT_SNAPSHOT, (task_id, version, now, head))
    if oldest is not None and oldest < oldest_dropped:
        db.execute(q.DROP_SNAPSHOTS_TO, (task_id, oldest_dropped))


def _update_task(task_id: str, version: int, checkpoint: Checkpoint,
                 current: tuple[Any, Any, Any], times: tuple[float, float]) -> tuple[str, Any]:
    """Point the task at its new head, touching the indexed columns only when they change.

    Setting an indexed column rewrites its index page even to the same value, and every
    page is one more WAL frame to fsync on each step. The lease is carried forward only
    once a third of it has passed (the lease keeper renews it on that schedule anyway).
    """
    status, wake_at, held_until = current
    now, lease_until = times
    columns = {"updated_at": now, "head_version": version, "reason": checkpoint.reason}
    if checkpoint.status.value != status:
        columns["status"] = checkpoint.status.value
    if checkpoint.wake_at != wake_at:
        columns["wake_at"] = checkpoint.wake_at
    if held_until is None or held_until < lease_until - (lease_until - now) / 3:
        columns["lease_until"] = lease_until
    assignments = ", ".join(f"{name} = ?" for name in columns)
    return (f"UPDATE tasks SET {assignments}, crashes = crashes * ? WHERE task_id = ?",
            (*columns.values(), int(not checkpoint.progress), task_id))

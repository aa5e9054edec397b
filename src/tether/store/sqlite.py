"""The embedded default store: one SQLite file, no server (R13).

WAL journal with ``synchronous=FULL`` by default, so an acknowledged event or
tool result survives power loss, not just a crash. Every write transaction
starts with ``BEGIN IMMEDIATE`` so concurrent worker processes queue on the
write lock instead of failing with SQLITE_BUSY when a read upgrades.

Calls run inline on the event loop rather than in a thread: a small commit
costs ~0.2 ms, less than a hop to a worker thread and back, and no await
point inside a transaction means no interleaving between coroutines.

Faults (``sqlite_faults``): a write lock held by another process past the busy timeout is
:class:`StoreUnavailable` (workers ride it out); a damaged file is :class:`CorruptStore`,
naming the file and what to do, never a traceback or "no such task"; a file found damaged
(checked at open when small, ``sqlite_integrity``, or met later) refuses every write.

Time: one machine, one clock. Leases, due times and event windows are compared with the
times each process reads from its own wall clock (``time.time()``). The processes sharing
a SQLite file all run on one machine (SQLite's locking is not safe over a network
filesystem), so they read the same clock and agree on every lease. If that clock is
stepped (NTP, by hand), every process sees the step at once: a step forward by more than a
lease makes held leases look expired, and another worker may take such a task over, which
the lease's fencing token keeps safe (the old holder's writes are refused) at the cost of
one counted recovery; a step back only makes leases last longer. For workers on several
machines use PostgreSQL, where leases are judged by the database server's clock.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import orjson

from tether.errors import (
    InboxFull,
    LeaseLost,
    StoreError,
    TaskClosed,
    TaskExists,
    TetherError,
    VersionNotFound,
)
from tether.failpoints import failpoint
from tether.model import EmitReceipt, Event, IdempotencyRecord, Status, TaskRecord
from tether.store import sqlite_integrity, sqlite_schema
from tether.store.base import (
    Checkpoint,
    Claim,
    InboxLimits,
    StoredEvent,
    statuses_woken,
    stranded_wake,
)
from tether.store.sqlite_faults import Damage, guarded
from tether.store.sqlite_group_commit import GroupCommit, write_transaction

_TASK_COLUMNS = (
    "task_id, agent, status, created_at, updated_at, head_version, reason, lease_owner, lease_until,"
    " wake_at"
)
# Claimable: not leased (or the lease expired), not among the tasks the asking worker is still
# running (its runner may only be slow), and with work to do. Each branch is a range scan of a
# partial index, so a claim stays cheap however many tasks wait or have finished (E7):
# pending and running tasks with no due time; open tasks whose due time came (a timer, a
# deadline, a scheduled start, a back-off, an event that woke them); tasks whose holder died
# (lease expired while still owned: recovered before any new work, so a dead worker's tasks
# never wait behind a backlog); finished tasks that a lever (rollback, resume) woke up.
# (A partial index is only used when the query repeats its WHERE term word for word.)
_OPEN = "('pending', 'running', 'waiting', 'paused', 'needs_human')"
_NOT_BUSY = "task_id NOT IN (SELECT value FROM json_each(:busy))"
_FREE = f"(lease_until IS NULL OR lease_until < :now) AND {_NOT_BUSY}"
_BRANCHES = (
    f"""SELECT task_id, created_at AS due FROM tasks INDEXED BY tasks_open
         WHERE status IN {_OPEN} AND status IN ('pending', 'running') AND wake_at IS NULL
           AND {_FREE}""",
    f"""SELECT task_id, wake_at AS due FROM tasks INDEXED BY tasks_open
         WHERE status IN {_OPEN} AND wake_at <= :now AND {_FREE}""",
    f"""SELECT task_id, 0 AS due FROM tasks INDEXED BY tasks_orphaned
         WHERE lease_owner IS NOT NULL AND lease_until < :now AND status IN {_OPEN}
           AND {_NOT_BUSY}""",
    f"""SELECT task_id, wake_at AS due FROM tasks
         WHERE status IN ('failed', 'completed') AND wake_at <= :now AND {_FREE}""",
)
# Each branch is its own query stopping at a few rows in index order (as one compound query,
# SQLite sorted every matching row on each claim): a backlog is never sorted per claim.
_CANDIDATES = tuple(f"{branch} LIMIT 8" for branch in _BRANCHES)
# The same test for one row, under the write lock (another worker may have just taken it).
_CLAIMABLE = f"""SELECT 1 FROM tasks WHERE task_id = :task_id AND {_FREE} AND (
    (status IN {_OPEN} AND (lease_owner IS NOT NULL OR wake_at <= :now
                            OR (status IN ('pending', 'running') AND wake_at IS NULL)))
    OR (status IN ('failed', 'completed') AND wake_at <= :now))"""
_OPEN_END = 1 << 62
_FINISHED = ("completed", "failed", "cancelled")


@guarded  # every public coroutine: sqlite3 errors become StoreUnavailable/CorruptStore/StoreError
class SQLiteStore:
    """A :class:`tether.store.base.Store` on one SQLite database file (or ``:memory:``)."""

    def __init__(self, path: str, synchronous: str = "FULL", busy_timeout_ms: int = 10_000) -> None:
        self.path = path
        self.damage = Damage(path)
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite store at {path!r}: {exc}") from exc
        sqlite_schema.prepare(self._db, path, synchronous, busy_timeout_ms, self.damage)
        self._group = GroupCommit(self._db, path)

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction, taken with the write lock up front."""
        self.damage.refuse_writes()
        return write_transaction(self._db, self.path)

    def _missing(self, task_id: str, outcome: str = "") -> TetherError:
        """TaskNotFound, unless damage may be what hides the task."""
        return sqlite_integrity.missing(self._db, self.damage, task_id, outcome)

    async def ping(self) -> None:
        """An empty write transaction: the write lock can be had (nothing is written)."""
        with self._write():
            pass

    async def integrity_check(self) -> list[str]:
        """What is wrong with the file and its tables (sqlite_integrity.problems); [] = fine."""
        return sqlite_integrity.problems(self._db)

    def pragma(self, name: str) -> Any:
        """Read a PRAGMA (tests check the durability defaults with it)."""
        return self._db.execute(f"PRAGMA {name}").fetchone()[0]

    # ------------------------------------------------------------------ tasks

    async def create_task(self, record: TaskRecord, head: bytes, wake_at: float | None = None,
                          blobs: Mapping[str, bytes] | None = None) -> None:
        with self._write() as db:
            if db.execute("SELECT 1 FROM tasks WHERE task_id = ?", (record.task_id,)).fetchone():
                raise TaskExists(f"a task with id {record.task_id!r} already exists; nothing was changed")
            db.execute(
                "INSERT INTO tasks (task_id, agent, status, created_at, updated_at, head_version,"
                " wake_at) VALUES (?, ?, ?, ?, ?, 1, ?)",
                (record.task_id, record.agent, record.status.value, record.created_at,
                 record.updated_at, wake_at),
            )
            db.execute(
                "INSERT INTO snapshots (task_id, version, created_at, head) VALUES (?, 1, ?, ?)",
                (record.task_id, record.created_at, head),
            )
            self._put_blobs(db, blobs or {}, record.created_at)

    async def get_task(self, task_id: str) -> TaskRecord:
        row = self._db.execute(
            f"SELECT {_TASK_COLUMNS} FROM tasks WHERE task_id = ?", (task_id,)
        ).fetchone()
        if row is None:
            raise self._missing(task_id)
        return _task_record(row)

    async def list_tasks(self, status: Status | None = None, limit: int = 1000) -> list[TaskRecord]:
        where, params = ("WHERE status = ?", (status.value,)) if status else ("", ())
        rows = self._db.execute(
            f"SELECT {_TASK_COLUMNS} FROM tasks {where} ORDER BY created_at DESC LIMIT ?",
            (*params, limit),
        ).fetchall()
        return [_task_record(row) for row in rows]

    async def wake_all(self, status: Status, now: float) -> int:
        with self._write() as db:
            return db.execute(
                "UPDATE tasks SET wake_at = ? WHERE status = ?", (now, status.value)
            ).rowcount

    async def count_by_status(self) -> dict[str, int]:
        rows = self._db.execute("SELECT status, COUNT(*) FROM tasks GROUP BY status").fetchall()
        return {status: count for status, count in rows}

    # ------------------------------------------------------------------ leases

    async def claim(self, worker: str, now: float, lease: float,
                    busy: Collection[str] = ()) -> Claim | None:
        """Find candidates with a plain read, then take the first still free under the lock."""
        params = {"now": now, "busy": orjson.dumps(list(busy)).decode()}
        rows = [row for query in _CANDIDATES for row in self._db.execute(query, params)]
        candidates = [task_id for task_id, _ in sorted(rows, key=lambda row: row[1])[:8]]
        if not candidates:
            return None
        self.damage.refuse_writes()
        return await self._group.write(  # claims made together share a transaction
            lambda db: self._take_first(db, candidates, params, worker, lease))

    def _take_first(self, db: sqlite3.Connection, candidates: list[str], params: dict[str, Any],
                    worker: str, lease: float) -> Claim | None:
        """The first candidate still free under the lock (a claim in the same batch, or
        another process, may have taken the others)."""
        for task_id in candidates:
            if db.execute(_CLAIMABLE, {**params, "task_id": task_id}).fetchone():
                return self._take(db, task_id, worker, params["now"], lease)
        return None

    async def claim_task(self, task_id: str, worker: str, now: float, lease: float) -> Claim | None:
        with self._write() as db:
            row = db.execute(
                "SELECT lease_until FROM tasks WHERE task_id = ?", (task_id,)
            ).fetchone()
            if row is None:
                raise self._missing(task_id)
            if row[0] is not None and row[0] >= now:
                return None
            return self._take(db, task_id, worker, now, lease)

    @staticmethod
    def _take(db: sqlite3.Connection, task_id: str, worker: str, now: float, lease: float) -> Claim:
        owner, status = db.execute(
            "SELECT lease_owner, status FROM tasks WHERE task_id = ?", (task_id,)
        ).fetchone()
        crashed = owner is not None and status not in _FINISHED
        fence, crashes = db.execute(
            "UPDATE tasks SET lease_owner = ?, lease_until = ?, fence = fence + 1,"
            " crashes = crashes + ? WHERE task_id = ? RETURNING fence, crashes",
            (worker, now + lease, int(crashed), task_id),
        ).fetchone()
        return Claim(task_id, int(fence), crashed=crashed, crashes=int(crashes))

    def _check_fence(self, db: sqlite3.Connection, claim: Claim) -> tuple[Any, ...]:
        """The task's row (head_version, status, wake_at, lease_until), if *claim* still holds."""
        row = db.execute(
            "SELECT fence, head_version, status, wake_at, lease_until FROM tasks"
            " WHERE task_id = ?", (claim.task_id,)
        ).fetchone()
        if row is None:
            raise self._missing(claim.task_id)
        if row[0] != claim.fence:
            raise LeaseLost(
                f"task {claim.task_id}: lease fence {claim.fence} is stale (now {row[0]});"
                " another worker took the task over, so this write was refused"
            )
        return tuple(row[1:])

    async def renew(self, claim: Claim, until: float) -> None:
        with self._write() as db:
            self._check_fence(db, claim)
            db.execute("UPDATE tasks SET lease_until = ? WHERE task_id = ?", (until, claim.task_id))

    async def release(self, claim: Claim, hold_until: float | None = None) -> None:
        with self._write() as db:
            self._check_fence(db, claim)
            db.execute(
                "UPDATE tasks SET lease_owner = NULL, lease_until = ?, fence = fence + 1"
                " WHERE task_id = ?",
                (hold_until, claim.task_id),
            )

    async def set_status(self, claim: Claim, status: Status, reason: str | None,
                         wake_at: float | None = None) -> None:
        now = time.time()
        with self._write() as db:
            self._check_fence(db, claim)
            db.execute(
                "UPDATE tasks SET status = ?, reason = ?, updated_at = ?, wake_at = ?"
                " WHERE task_id = ?",
                (status.value, reason, now, wake_at, claim.task_id),
            )
            self._settle_inbox(db, claim.task_id, status, now, wake_at)

    # ------------------------------------------------------------------ checkpoints

    async def commit(self, claim: Claim, checkpoint: Checkpoint, keep: int, lease_until: float) -> int:
        self.damage.refuse_writes()
        return await self._group.write(
            lambda db: self._checkpoint(db, claim, checkpoint, keep, lease_until))

    def _checkpoint(self, db: sqlite3.Connection, claim: Claim, checkpoint: Checkpoint, keep: int,
                    lease_until: float) -> int:
        """Write one checkpoint, inside the group commit's transaction."""
        now = time.time()
        task_id = claim.task_id
        head, *current = self._check_fence(db, claim)
        newest = db.execute("SELECT MAX(version) FROM snapshots WHERE task_id = ?",
                            (task_id,)).fetchone()[0]
        version = max(int(head), newest or 0) + 1  # never reuse a number, even after tampering
        self._put_head(db, task_id, version, keep, checkpoint.head, now)
        failpoint("mid_checkpoint")
        self._put_blobs(db, checkpoint.blobs, now)
        if checkpoint.history:
            db.executemany(
                "INSERT INTO history (task_id, epoch, seq, entry) VALUES (?, ?, ?, ?)",
                [(task_id, r.epoch, r.seq, orjson.dumps(r.entry)) for r in checkpoint.history],
            )
        if checkpoint.events_done:
            db.executemany(
                "UPDATE events SET status = ?, done_at = ? WHERE id = ? AND task_id = ?",
                [(disposition, now, event_id, task_id)
                 for event_id, disposition in checkpoint.events_done],
            )
        if checkpoint.idempotency:
            db.executemany(
                "INSERT INTO idempotency (key, task_id, tool, args_hash, status, result,"
                " error, attempts, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET tool = excluded.tool,"  # in place: no
                " args_hash = excluded.args_hash, status = excluded.status,"  # index churn
                " result = excluded.result, error = excluded.error,"
                " attempts = excluded.attempts, updated_at = excluded.updated_at",
                [(r.key, r.task_id, r.tool, r.args_hash, r.status, orjson.dumps(r.result),
                  r.error, r.attempts, now) for r in checkpoint.idempotency],
            )
        if checkpoint.recovery_log:
            db.executemany(
                "INSERT INTO recovery_log (task_id, at, record) VALUES (?, ?, ?)",
                [(task_id, now, orjson.dumps(r)) for r in checkpoint.recovery_log],
            )
        self._update_task(db, task_id, version, checkpoint, current, (now, lease_until))
        self._settle_inbox(db, task_id, checkpoint.status, now, checkpoint.wake_at)
        return version

    @staticmethod
    def _put_head(db: sqlite3.Connection, task_id: str, version: int, keep: int, head: bytes,
                  now: float) -> None:
        """Store the new head in the row of the oldest version that falls out of the kept ones.

        Rewriting a row in place dirties its page and one index page; inserting and deleting
        a ~2 KB row each time also split, freed and reallocated pages, twice the WAL frames
        to fsync per step. Versions beyond *keep* left over (keep was lowered) are dropped.
        """
        reused = db.execute(
            "UPDATE snapshots SET version = ?, created_at = ?, head = ? WHERE rowid = ("
            " SELECT rowid FROM snapshots WHERE task_id = ? AND version <= ? ORDER BY version"
            " LIMIT 1)", (version, now, head, task_id, version - keep)).rowcount
        if reused == 0:
            db.execute(
                "INSERT INTO snapshots (task_id, version, created_at, head) VALUES (?, ?, ?, ?)",
                (task_id, version, now, head))
        if version > keep:
            db.execute("DELETE FROM snapshots WHERE task_id = ? AND version <= ?",
                       (task_id, version - keep))

    @staticmethod
    def _update_task(db: sqlite3.Connection, task_id: str, version: int, checkpoint: Checkpoint,
                     current: list[Any], times: tuple[float, float]) -> None:
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
        db.execute(f"UPDATE tasks SET {assignments}, crashes = crashes * ? WHERE task_id = ?",
                   (*columns.values(), int(not checkpoint.progress), task_id))

    @staticmethod
    def _put_blobs(db: sqlite3.Connection, blobs: Mapping[str, bytes], now: float) -> None:
        if blobs:
            db.executemany("INSERT OR IGNORE INTO blobs (digest, data, created_at) VALUES (?, ?, ?)",
                           [(digest, data, now) for digest, data in blobs.items()])

    async def load_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        wanted = list(digests)
        rows = self._db.execute(
            "SELECT digest, data FROM blobs WHERE digest IN (SELECT value FROM json_each(?))",
            (orjson.dumps(wanted).decode(),)).fetchall()
        return {digest: bytes(data) for digest, data in rows}

    @staticmethod
    def _settle_inbox(db: sqlite3.Connection, task_id: str, status: Status, now: float,
                      wake_at: float | None) -> None:
        """Events that arrived after the runner's last look must not be stranded by this commit.

        A parked task with such events is due at once (a running one only matters when it is
        parked until a back-off ends); a finished one marks the events it can never apply as
        ignored (levers that may reopen it, like rollback, stay pending).
        """
        wakes = stranded_wake(status, wake_at, now)
        if wakes is None:
            return
        if status in (Status.COMPLETED, Status.CANCELLED):
            db.execute(
                "UPDATE events SET status = 'ignored', done_at = ? WHERE task_id = ?"
                " AND status = 'pending' AND NOT (control AND ? = 'completed')",
                (now, task_id, status.value),
            )
        if db.execute(
            f"SELECT 1 FROM events WHERE task_id = ? AND status = 'pending' AND {wakes} LIMIT 1",
            (task_id,),
        ).fetchone():
            db.execute("UPDATE tasks SET wake_at = ? WHERE task_id = ?", (now, task_id))

    async def load_head(self, task_id: str, version: int | None = None) -> tuple[int, bytes]:
        if version is None:
            row = self._db.execute(
                "SELECT s.version, s.head FROM tasks t JOIN snapshots s"
                " ON s.task_id = t.task_id AND s.version = t.head_version WHERE t.task_id = ?",
                (task_id,),
            ).fetchone()
            if row is None:
                version = (await self.get_task(task_id)).head_version  # named in the error
        else:
            await self.get_task(task_id)
            row = self._db.execute(
                "SELECT version, head FROM snapshots WHERE task_id = ? AND version = ?",
                (task_id, version),
            ).fetchone()
        if row is None:
            kept = [v for v, _, _ in await self.list_versions(task_id)]
            raise VersionNotFound(f"task {task_id}: version {version} is not kept (kept: {kept})")
        return int(row[0]), bytes(row[1])

    async def list_versions(self, task_id: str) -> list[tuple[int, float, int]]:
        rows = self._db.execute(
            "SELECT version, created_at, length(head) FROM snapshots WHERE task_id = ?"
            " ORDER BY version",
            (task_id,),
        ).fetchall()
        return [(int(v), float(at), int(size)) for v, at, size in rows]

    async def read_history(self, task_id: str, segments: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        first = 1
        for epoch, last in segments:
            upper = _OPEN_END if last < 0 else last
            rows = self._db.execute(
                "SELECT entry FROM history WHERE task_id = ? AND epoch = ? AND seq BETWEEN ? AND ?"
                " ORDER BY seq",
                (task_id, epoch, first, upper),
            ).fetchall()
            entries.extend(orjson.loads(row[0]) for row in rows)
            first = upper + 1
        return entries

    async def next_epoch(self, task_id: str) -> int:
        with self._write() as db:
            row = db.execute(
                "UPDATE tasks SET max_epoch = max_epoch + 1 WHERE task_id = ? RETURNING max_epoch",
                (task_id,),
            ).fetchone()
        if row is None:
            raise self._missing(task_id)
        return int(row[0])

    # ------------------------------------------------------------------ events

    async def add_event(self, event: Event, priority: int, limits: InboxLimits, now: float) -> EmitReceipt:
        with self._write() as db:
            if event.source_event_id is not None:
                seen = db.execute(
                    "SELECT id FROM events WHERE task_id = ? AND source_event_id = ?",
                    (event.task_id, event.source_event_id),
                ).fetchone()
                if seen:
                    return EmitReceipt(False, int(seen[0]), "duplicate")
            self._check_open(db, event.task_id, limits)
            # Newer replaces older pending events of its coalescing class inside the window, and
            # a P3/P4 event (state only) replaces older pending ones of its type at any age.
            supersedes = ("status = 'pending' AND priority >= ? AND ((coalesce_class = ?"
                          " AND created_at >= ?) OR (? AND type = ?))")
            superseding = (priority, limits.coalesce, now - limits.window,
                           int(priority >= 3 and limits.coalesce is not None), event.type)
            # Without a coalescing class nothing is superseded: skip the scans of the pending
            # events (with a long inbox, they made every send slower than the last).
            classed = limits.coalesce is not None
            if limits.refusable and not (classed and db.execute(
                    f"SELECT 1 FROM events WHERE task_id = ? AND {supersedes} LIMIT 1",
                    (event.task_id, *superseding)).fetchone()):
                self._check_capacity(db, event, limits)
            event_id = db.execute(
                "INSERT INTO events (task_id, type, priority, payload, source_event_id,"
                " coalesce_class, control, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " RETURNING id",
                (event.task_id, event.type, priority, orjson.dumps(event.payload),
                 event.source_event_id, limits.coalesce, int(limits.wakes_needs_human), now),
            ).fetchone()[0]
            failpoint("event_stored")
            # Only older events at the same or a lower priority are replaced: coalescing never
            # swallows a more urgent event.
            coalesced = db.execute(
                "UPDATE events SET status = 'coalesced', done_at = ? WHERE task_id = ?"
                f" AND id <> ? AND {supersedes}",
                (now, event.task_id, event_id, *superseding),
            ).rowcount if classed else 0
            # P3/P4 only update state: they never wake a parked task (R4).
            wakeable = statuses_woken(priority, limits)
            if not wakeable:
                return EmitReceipt(True, int(event_id), "stored", coalesced)
            db.execute(
                f"UPDATE tasks SET wake_at = ? WHERE task_id = ? AND status IN"
                f" ({', '.join('?' * len(wakeable))})",
                (now, event.task_id, *wakeable),
            )
        return EmitReceipt(True, int(event_id), "stored", coalesced)

    def _check_open(self, db: sqlite3.Connection, task_id: str, limits: InboxLimits) -> None:
        row = db.execute("SELECT status FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        if row is None:
            raise self._missing(task_id, "; the event was not stored")
        status = Status(row[0])
        if status.is_terminal and status not in limits.reopens:
            raise TaskClosed(f"task {task_id} is {status.value}; the event was not stored")

    @staticmethod
    def _check_capacity(db: sqlite3.Connection, event: Event, limits: InboxLimits) -> None:
        pending = db.execute(
            "SELECT COUNT(*) FROM events WHERE task_id = ? AND status = 'pending'",
            (event.task_id,),
        ).fetchone()[0]
        if pending >= limits.capacity:
            raise InboxFull(
                f"task {event.task_id}: inbox holds {pending} pending events (capacity "
                f"{limits.capacity}); {event.type!r} is low priority and was refused, retry later"
            )

    async def pending_events(self, task_id: str) -> list[StoredEvent]:
        return self._events(
            "WHERE task_id = ? AND status = 'pending' ORDER BY priority, id", (task_id,)
        )

    async def count_pending_events(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM events WHERE status = 'pending'")
                   .fetchone()[0])

    async def list_events(self, task_id: str) -> list[StoredEvent]:
        return self._events("WHERE task_id = ? ORDER BY id", (task_id,))

    def _events(self, where: str, params: tuple[Any, ...]) -> list[StoredEvent]:
        rows = self._db.execute(
            "SELECT id, task_id, type, priority, payload, source_event_id, created_at, status,"
            f" coalesce_class FROM events {where}",
            params,
        ).fetchall()
        return [
            StoredEvent(
                Event(type=r[2], task_id=r[1], payload=orjson.loads(r[4]), priority=r[3],
                      source_event_id=r[5], id=r[0], created_at=r[6]),
                priority=r[3], status=r[7], coalesce=r[8],
            )
            for r in rows
        ]

    # ------------------------------------------------------------------ idempotency, recovery log

    async def get_idempotency(self, key: str) -> IdempotencyRecord | None:
        rows = self._idempotency("WHERE key = ?", (key,))
        return rows[0] if rows else None

    async def list_idempotency(self, task_id: str) -> list[IdempotencyRecord]:
        return self._idempotency("WHERE task_id = ? ORDER BY updated_at", (task_id,))

    def _idempotency(self, where: str, params: tuple[Any, ...]) -> list[IdempotencyRecord]:
        rows = self._db.execute(
            "SELECT key, task_id, tool, args_hash, status, result, error, attempts, updated_at"
            f" FROM idempotency {where}",
            params,
        ).fetchall()
        return [
            IdempotencyRecord(r[0], r[1], r[2], r[3], r[4],
                              orjson.loads(r[5]) if r[5] is not None else None, r[6], r[7], r[8])
            for r in rows
        ]

    async def list_recovery_log(self, task_id: str) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT record FROM recovery_log WHERE task_id = ? ORDER BY id", (task_id,)
        ).fetchall()
        return [orjson.loads(row[0]) for row in rows]

    async def wait_for_work(self, timeout: float) -> None:
        """No notifications in SQLite: workers find new work by looking (cheaply) again."""
        await asyncio.sleep(timeout)

    async def migrate(self) -> list[str]:
        """The SQLite schema is created (idempotently) when the store opens: nothing to do."""
        return []

    async def close(self) -> None:
        self._db.close()


def _task_record(row: tuple[Any, ...]) -> TaskRecord:
    return TaskRecord(row[0], row[1], Status(row[2]), row[3], row[4], row[5], row[6], row[7], row[8],
                      row[9])

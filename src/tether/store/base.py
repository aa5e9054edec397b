"""The store protocols: the one narrow seam every backend plugs into (R13).

:class:`Store` is split by who asks. :class:`WorkerStore` is the path that moves tasks
(workers, and the harness starting tasks and storing events); :class:`ReadStore` is what
people read (listings, the console, ``tether check``); both read snapshots alike
(:class:`SnapshotReads`). Code that only reads can say so in its types and be handed a
read-only view; a backend implements :class:`Store`, both paths and its lifecycle.

A backend stores five kinds of rows: the task index (with leases), snapshot
heads by version, append-only history, the event inbox (with a unique
``source_event_id`` per task, so dedup survives restarts) and idempotency
records. Everything a runner changes in one step goes through a single
:meth:`Store.commit` call, which a backend must make atomic and fence-checked:
a worker whose lease was taken over can never land a write.

Failures are :class:`~tether.errors.StoreError`: :class:`~tether.errors.StoreUnavailable`
for what may pass by itself (a server away, a lock held too long; workers ride it out),
:class:`~tether.errors.CorruptStore` for damage (never reported as a missing task).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tether.model import EmitReceipt, Event, EventStatus, IdempotencyRecord, Status, TaskRecord
from tether.store.graph_checkpoints import GraphCheckpointStore


@dataclass(frozen=True)
class Claim:
    """A lease on one task. ``fence`` must accompany every write made under it."""

    task_id: str
    fence: int
    crashed: bool
    """True when the previous holder's lease expired instead of being released (a crash)."""
    crashes: int = 0
    """Crashed claims in a row since the task last made progress, counted by the store at
    claim time, so a worker that dies while recovering still uses up the budget (R12)."""
    head_version: int | None = None
    """The task row's head version, read in the transaction that took the lease: while the
    lease holds, only this claim's commits move it (None: a backend that does not say)."""
    created_at: float | None = None
    """The task row's creation time, read with it: with the id, the incarnation this claim
    holds (a task deleted and submitted again under the same id is another one)."""
    started: bool = False
    """The claim took a pending task and made it running in the same transaction (R2: seen
    running at once), so the runner need not write that status on its own (False: the task
    was not pending, or a backend that does not do it)."""


@dataclass(frozen=True)
class HistoryRow:
    """One dialog entry at position ``seq`` of history branch ``epoch``."""

    epoch: int
    seq: int
    entry: dict[str, Any]


@dataclass
class Checkpoint:
    """Everything one step changes, written in one transaction."""

    head: bytes
    status: Status
    history: list[HistoryRow] = field(default_factory=list)
    events_done: list[tuple[int, EventStatus]] = field(default_factory=list)
    """(event id, what became of it: applied, ignored, coalesced)."""
    idempotency: list[IdempotencyRecord] = field(default_factory=list)
    recovery_log: list[dict[str, Any]] = field(default_factory=list)
    wake_at: float | None = None
    reason: str | None = None
    progress: bool = False
    """The step moved the task forward: the store's crash counter starts again."""
    blobs: dict[str, bytes] = field(default_factory=dict)
    """Large values the head refers to by digest (R20); stored once, whoever wrote them first."""
    inbox_seen: frozenset[int] | None = None
    """Write this only if no pending event of the task is outside these ids (the events its
    runner last read); else write nothing and raise InboxMoved. A call's resume point is
    written so: a message that arrived while the model answered reaches the task before
    the call starts, with no read of the inbox of its own. None: no such condition."""


@dataclass(frozen=True)
class InboxLimits:
    """How the inbox treats one event: capacity, coalescing class and window."""

    capacity: int
    refusable: bool
    coalesce: str | None
    window: float
    wakes_needs_human: bool
    reopens: frozenset[Status] = frozenset()
    """Finished statuses this event may still reach (a resume of a failed task, a rollback)."""


@dataclass(frozen=True)
class TaskQuery:
    """One page of tasks as a person asks for it (the console's list): a status, an agent, a
    piece of the id or of the reason (case-insensitive), and where the page starts."""

    status: Status | None = None
    agent: str | None = None
    text: str = ""
    offset: int = 0
    limit: int = 50


@dataclass(frozen=True)
class LimitRequest:
    """A call (or a plan) asking to be admitted under one named limit and key."""

    name: str
    key: str
    task_id: str
    fence: int
    """The fence of the claim the task runs under: the hold counts while it is current."""
    holder: str
    """What holds the slot (a call's idempotency key): admitting it again is a no-op."""
    priority: int = 2
    concurrency: int | None = None
    rate: tuple[int, float] | None = None
    """At most this many admissions in any window of this many seconds."""
    tokens: tuple[int, float] | None = None
    """Admitted while the calls admitted in the last this-many seconds reported fewer than
    this many tokens."""


@dataclass(frozen=True)
class LimitAnswer:
    """Admitted, or held back until *retry_at* at the latest (sooner if a slot is let go)."""

    granted: bool
    retry_at: float | None = None
    why: str = ""
    slot: bool = False
    """Held back by a concurrency limit (full, or others wait ahead for its slots; not a rate
    or token window, nor a provider's 429): a slot let go may admit
    it before *retry_at*, so a worker told of slots let go (:attr:`WorkerStore.hands_over_slots`)
    may keep it waiting in memory a short while."""

    def parked(self) -> tuple[float, str]:
        """When the task held back looks again, and the reason people see meanwhile."""
        return (self.retry_at if self.retry_at is not None else 0.0), self.why


SLOT_NOTICE = "slot/"
"""How a store's notice that a limit's slot was let go for a task a worker holds begins,
followed by the task's id (a ``/`` is never part of one): it ends that task's wait in memory,
and wakes no claim loop (nothing new can be claimed)."""


@dataclass(frozen=True)
class LimitUsage:
    """One limit and key as operators see it."""

    name: str
    key: str
    in_use: int
    waiting: int
    admitted_last_minute: int
    blocked_until: float | None
    concurrency: int | None = None
    """The limit's size as the last worker to admit under it defined it (None: unknown)."""
    rate: tuple[int, float] | None = None
    tokens: tuple[int, float] | None = None


@dataclass(frozen=True)
class ScheduleRecord:
    """A cron schedule that starts tasks of *agent* with *input* (JSON), in *timezone*;
    *catch_up* runs missed while no worker ran are started late (0: skipped)."""

    name: str
    cron: str
    timezone: str
    agent: str
    input: Any
    catch_up: int = 0
    paused: bool = False
    next_at: float | None = None
    last_run_at: float | None = None
    created_at: float = 0.0


@dataclass(frozen=True)
class StoredEvent:
    """An event as the store holds it."""

    event: Event
    priority: int
    status: EventStatus
    coalesce: str | None



class SnapshotReads(Protocol):
    """What both sides read: a worker resuming a task and a person looking at one load the
    same task row, snapshot heads, large values and dialog. All methods are coroutines."""

    async def get_task(self, task_id: str) -> TaskRecord:
        """The task's index row; :class:`TaskNotFound` if there is none."""

    async def load_head(self, task_id: str, version: int | None = None) -> tuple[int, bytes]:
        """The snapshot head at *version* (default: the newest)."""

    async def load_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        """The large values stored under *digests* (R20); a digest not stored is left out."""

    async def read_history(self, task_id: str, segments: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
        """The dialog along a branch: ``segments`` is [[epoch, last seq or -1], ...]."""

    async def list_versions(self, task_id: str) -> list[tuple[int, float, int]]:
        """Kept versions as (version, created_at, size in bytes), oldest first."""


class WorkerStore(SnapshotReads, Protocol):
    """The path that moves tasks: starting them, leasing them to workers, writing their steps
    and events, and what a worker reads while it runs one. Every write goes through here;
    writes under a lease are fence-checked, so a worker that lost its lease lands nothing."""

    hands_over_slots: bool
    """Whether a slot let go reaches a task that another worker keeps waiting in memory for
    it (the store tells that worker: PostgreSQL's NOTIFY). Where it cannot (SQLite: a worker
    of another process is not told), a task held back by a limit is parked at once."""

    async def count_history(self, task_id: str, segments: Sequence[Sequence[int]]) -> int:
        """How many rows :meth:`read_history` gives for *segments*, without reading them (a
        runner checks a version's dialog is whole, and reads it when it needs it)."""

    async def create_task(self, record: TaskRecord, head: bytes, wake_at: float | None = None,
                          blobs: Mapping[str, bytes] | None = None) -> None:
        """Insert a task and its version-1 snapshot (and the large values it refers to, R20);
        with *wake_at*, no worker claims it before then (a scheduled start)."""

    async def claim(self, worker: str, now: float, lease: float,
                    busy: Collection[str] = ()) -> Claim | None:
        """Lease the next task that has work to do, or None; never one of *busy* (the tasks
        this worker is still running, whose leases may have lapsed while it was slow).

        *now* is the caller's wall clock. Due times are compared with it; a backend shared
        by several machines judges leases by one clock of its own instead (PostgreSQL: the
        server's), moving *now* and lease ends by the caller's offset from that clock, so
        a worker whose clock is off holds its leases exactly as long as any other."""

    async def claim_many(self, worker: str, now: float, lease: float, most: int,
                         busy: Collection[str] = ()) -> list[Claim]:
        """Lease up to *most* tasks that have work to do, in one transaction and from one
        look at the candidates (soonest due first), as :meth:`claim` leases one: a worker
        with many free slots (one recovering a thousand orphaned tasks) pays one round
        trip and one fsync per batch, not per task."""

    async def claim_task(self, task_id: str, worker: str, now: float, lease: float) -> Claim | None:
        """Lease one particular task if no live lease holds it."""

    async def renew(self, claim: Claim, until: float) -> None:
        """Extend a lease; :class:`LeaseLost` if it is no longer ours."""

    async def break_lease(self, task_id: str, holder: str) -> bool:
        """End *holder*'s lease on the task now, if it still holds it (a worker that knows
        the holder is dead: the task can be claimed at once, as after its lease ran out);
        whether it did."""

    async def release(self, claim: Claim, hold_until: float | None = None) -> None:
        """Give a lease back cleanly (not a crash); *hold_until* keeps the task unclaimable
        until then (a worker backing off a task it cannot run)."""

    async def set_status(self, claim: Claim, status: Status, reason: str | None,
                         wake_at: float | None = None) -> None:
        """Change only the task row (status, reason, wake time) under the lease, without a new
        snapshot version: to park a task whose head did not change, to park a running task
        until its back-off ends, or to hand over a task whose snapshot cannot be read. A
        pending, running or parked task with a future *wake_at* is claimed only when it is due,
        or at once when an event that wakes it arrives (P0-P2 or a lever)."""

    async def commit(self, claim: Claim, checkpoint: Checkpoint, keep: int, lease_until: float) -> int:
        """Write one step atomically under the lease; returns the new version."""

    async def commit_reading(self, claim: Claim, checkpoint: Checkpoint, keep: int,
                             lease_until: float) -> tuple[int, list[StoredEvent] | None]:
        """:meth:`commit`, then the task's pending events as they stand once it is written
        (what :meth:`pending_events` returns then): a step's write and the next step's read
        of the inbox in one round trip (PostgreSQL) or one transaction (SQLite, where the
        read that checks ``inbox_seen`` is the same read). None where the backend leaves the
        read to the caller (SQLite, when the commit parked or finished the task)."""

    async def next_epoch(self, task_id: str) -> int:
        """A history branch number not used yet by this task."""

    async def add_event(self, event: Event, priority: int, limits: InboxLimits, now: float) -> EmitReceipt:
        """Store an event durably, deduplicating, coalescing and refusing per *limits*."""

    async def pending_events(self, task_id: str) -> list[StoredEvent]:
        """Events not yet applied, most urgent first."""

    async def get_idempotency(self, key: str) -> IdempotencyRecord | None:
        """The record for one idempotency key."""

    async def idempotency_keys(self, task_id: str) -> set[str]:
        """The keys of every idempotency record of a task (read once when its runner first
        looks a key up: from then on a key not among them, nor written by the runner since,
        has no record, and is answered without asking)."""

    async def acquire_limit(self, request: LimitRequest, now: float) -> LimitAnswer:
        """Admit *request* under its limit, or hold its task back: the task is put in the
        limit's queue (by priority, then age) and told when to look again."""

    async def release_limit(self, name: str, key: str, holder: str, now: float) -> str | None:
        """Let *holder*'s slot go and wake the first task waiting for the limit; returns that
        task's id (None: nobody waits), so that a worker keeping it waiting in memory can
        hand it the slot at once."""

    async def block_limit(self, name: str, key: str, until: float, now: float) -> None:
        """Admit nobody under the limit before *until* (a provider answered 429)."""

    async def spend_limit(self, name: str, key: str, holder: str, tokens: int) -> None:
        """Count the tokens *holder*'s admitted call used against the limit's token window."""

    async def delete_task(self, task_id: str, now: float) -> None:
        """Delete a task and everything it stored; :class:`TaskHeld` (nothing deleted) while
        a live lease holds it, TaskNotFound if there is none."""

    async def purge_finished(self, cutoffs: Mapping[str, float], now: float,
                             limit: int = 500) -> list[str]:
        """Delete up to *limit* finished tasks (status name -> cutoff: those that last
        changed before it) that no live lease holds; the ids deleted."""

    async def collect_blobs(self, now: float) -> int:
        """Delete the large values no stored head refers to; how many. Commits of snapshots
        wait meanwhile, so none can start referring to one as it goes."""

    async def put_schedule(self, schedule: ScheduleRecord) -> None:
        """Create a schedule, or replace its definition, pause and next time."""

    async def claim_due_schedules(self, now: float, limit: int = 100,
                                  agents: Collection[str] | None = None,
                                  hold: float = 30.0) -> list[ScheduleRecord]:
        """Take up to *limit* schedules not paused whose next time has come and that no
        worker holds, the most overdue first, and hold them for *hold* seconds: workers side
        by side each take their own, so their work adds up instead of repeating. Moving a
        schedule on lets it go; a worker that dies holding some leaves them to the next look
        after *hold*. With *agents*, only schedules of these agents (a worker takes the ones
        its app can start, so schedules of an agent it lacks never fill its window)."""

    async def clock(self) -> float:
        """The store's time (seconds since the epoch), by which schedules are judged due: the
        database server's on PostgreSQL, shared by every worker whatever its own clock
        says; this machine's on SQLite (one machine, one clock)."""

    async def advance_schedule(self, name: str, expected: float, next_at: float | None,
                               ran_at: float) -> bool:
        """Move a schedule on from *expected* to *next_at* (a worker started its runs);
        False if another worker moved it first, or it was paused or changed meanwhile."""

    async def delete_schedule(self, name: str) -> bool:
        """Delete a schedule (tasks it started stay); whether there was one."""

    async def wake_all(self, status: Status, now: float) -> int:
        """Mark every task in *status* due for a look now; returns how many."""

    async def wait_for_change(self, timeout: float, poll: float,
                              hurry: asyncio.Event | None = None) -> frozenset[str] | None:
        """Return once another process may have stored a task or an event, or after *timeout*.

        Returns the ids of the tasks written when the backend knows them (PostgreSQL: the
        NOTIFY payloads; a limit's slot let go for a task a worker holds is named
        :data:`SLOT_NOTICE` and the id), None when it only knows that something changed (SQLite: the file's
        data version, looked at every *poll* seconds), and an empty set when nothing did.
        A worker holding running tasks asks with a short *poll*, so a P0 stored by another
        process preempts within milliseconds (R3, E1); an idle one with its poll interval.
        The worker's own writes need no notice: it tells its runners directly. A backend
        that looks by polling returns early (an empty set) once *hurry* is set: the worker
        has just started running a task and wants the short *poll* from now on."""

    async def ping(self) -> None:
        """Return once the store could take a write now; :class:`StoreUnavailable` if it
        cannot yet (a worker riding out an outage asks this before carrying on)."""


class ReadStore(SnapshotReads, Protocol):
    """What people read (listings, the console, the API, ``tether check``): it changes
    nothing, so a read-only view of a store needs no more than this."""

    async def list_tasks(self, status: Status | None = None, limit: int = 1000) -> list[TaskRecord]:
        """Tasks, newest first, optionally of one status."""

    async def leased_tasks(self, limit: int = 1000) -> list[TaskRecord]:
        """Unfinished tasks a worker holds a lease on, whatever their status (pending too,
        where a claim does not start the task: :attr:`Claim.started`), the soonest lease end
        first."""

    async def find_tasks(self, query: TaskQuery) -> list[TaskRecord]:
        """A page of tasks matching *query*: people's work first (needs a person, running,
        paused, waiting, pending, failed, completed, cancelled), newest change first within
        each, so a list of millions pages without loading them."""

    async def limit_usage(self, now: float) -> list[LimitUsage]:
        """Every limit and key in use or known: slots held, tasks waiting, admissions in the
        last minute, and a 429's block still in force."""

    async def list_schedules(self, name: str | None = None) -> list[ScheduleRecord]:
        """Every schedule by name (or the one named)."""

    async def count_by_status(self) -> dict[str, int]:
        """How many tasks are in each status."""

    async def count_pending_events(self) -> int:
        """Events stored but not yet applied, over all tasks (the inbox depth)."""

    async def list_events(self, task_id: str) -> list[StoredEvent]:
        """Every event ever stored for the task, oldest first."""

    async def list_idempotency(self, task_id: str) -> list[IdempotencyRecord]:
        """All idempotency records of a task."""

    async def list_recovery_log(self, task_id: str) -> list[dict[str, Any]]:
        """The task's recovery records, oldest first."""

    async def integrity_check(self) -> list[str]:
        """Look for damage in the store itself; returns the problems found, one line each
        (an empty list: nothing found). It covers the storage (SQLite: ``PRAGMA
        integrity_check``; PostgreSQL: every tether table present at this schema) and that
        every task's head row exists. It reads only, and it does not parse heads: a caller
        checking every task also loads each head (``tether check``)."""


class Store(WorkerStore, ReadStore, GraphCheckpointStore, Protocol):
    """A whole backend: both paths, and its lifecycle (opened by :func:`tether.store.open_store`)."""

    async def migrate(self) -> list[str]:
        """Create or upgrade the schema now; returns the migrations applied (maybe none)."""

    async def close(self) -> None:
        """Release connections."""

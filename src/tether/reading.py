"""Reading a store for people: the one door the API, the console and the CLI read through.

The worker's path (claim, commit, load) belongs to the engine; what a person looks at
(listings, counts, versions, events, idempotency records, the recovery log, a handoff
bundle, a whole-store check) comes from here, so the edges never hold the raw store and
are typed against reads only.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tether import blobs
from tether.errors import InvalidInput
from tether.model import IdempotencyRecord, Status, TaskRecord
from tether.store import LimitUsage, ReadStore, ScheduleRecord, StoredEvent, TaskQuery


@dataclass(frozen=True)
class TaskReader:
    """Read-only questions about tasks, answered from the store.

    It holds the store typed as a :class:`ReadStore`: the type checker refuses a write made
    through it."""

    store: ReadStore

    async def task(self, task_id: str) -> TaskRecord:
        """The task's index row; TaskNotFound if there is none (so a route about one task
        answers 404 for a task that is not there rather than an empty list)."""
        readable_id(task_id)
        return await self.store.get_task(task_id)

    async def tasks(self, status: Status | None = None, limit: int = 1000) -> list[TaskRecord]:
        """Tasks, newest first, optionally of one status; at most *limit* of them, so a
        listing stays bounded however many tasks the store holds."""
        return await self.store.list_tasks(status, limit)

    async def find(self, query: TaskQuery) -> list[TaskRecord]:
        """One page of tasks as a person browses them (see :meth:`Store.find_tasks`)."""
        return await self.store.find_tasks(query)

    async def limits(self) -> list[LimitUsage]:
        """Every named limit in use: slots held, tasks held back, recent admissions, a
        provider's block still in force."""
        return await self.store.limit_usage(time.time())

    async def schedules(self) -> list[ScheduleRecord]:
        """Every cron schedule, by name, with its next and last run."""
        return await self.store.list_schedules()

    async def counts(self) -> dict[str, int]:
        """How many tasks are in each status (a status with none may be left out)."""
        return await self.store.count_by_status()

    async def inbox_depth(self) -> int:
        """Events stored and not yet applied, over all tasks: how far the workers are behind."""
        return await self.store.count_pending_events()

    async def versions(self, task_id: str) -> list[tuple[int, float, int]]:
        """Kept snapshot versions as (version, created_at, size in bytes), oldest first: what
        a rollback may go back to (R14)."""
        readable_id(task_id)
        return await self.store.list_versions(task_id)

    async def head(self, task_id: str, version: int | None = None) -> tuple[int, bytes]:
        """The stored head at *version* (default: the newest) as it is stored: large values
        are still references (see :meth:`whole`); VersionNotFound if it is not kept."""
        readable_id(task_id)
        return await self.store.load_head(task_id, version)

    async def whole(self, task_id: str, version: int, head: bytes) -> bytes:
        """*head* (the task's version *version*) with its large-value references replaced by
        the values from the blob table (R20), as a worker would load it; CorruptSnapshot if
        one is missing. Separate from :meth:`head` because a listing or a diff shows the
        stored head and must not pay for the large values."""
        readable_id(task_id)
        return await blobs.resolve(self.store, head, task_id, version)

    async def history(self, task_id: str, segments: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
        """The dialog along one branch (a snapshot's ``history_segments``, [[epoch, last seq
        or -1], ...]): after a rollback the task's rows on other branches are not its dialog.
        The caller trims it to the snapshot's ``history_len``."""
        readable_id(task_id)
        return await self.store.read_history(task_id, segments)

    async def events(self, task_id: str) -> list[StoredEvent]:
        """Every event ever stored for the task, oldest first, with what became of it."""
        readable_id(task_id)
        return await self.store.list_events(task_id)

    async def calls(self, task_id: str) -> list[IdempotencyRecord]:
        """The task's idempotency records: which side-effecting calls ran and their outcome."""
        readable_id(task_id)
        return await self.store.list_idempotency(task_id)

    async def recovery_log(self, task_id: str) -> list[dict[str, Any]]:
        """The task's recovery records, oldest first: how each interruption was handled."""
        readable_id(task_id)
        return await self.store.list_recovery_log(task_id)

    async def integrity_check(self) -> list[str] | None:
        """The store's own check for damage in itself, one line per problem ([] for none),
        or None if this backend has no such check (a store written for an older protocol):
        ``tether check`` then says its tasks alone were checked."""
        own: Callable[[], Awaitable[list[str]]] | None = getattr(
            self.store, "integrity_check", None)
        return await own() if own is not None else None


def readable_id(task_id: object) -> str:
    """*task_id* if the store can be asked about it: text with no NUL (PostgreSQL refuses one
    in text, and answered with its own error). Looser than the id alphabet on purpose: an
    older store may hold ids the alphabet refuses today, and a person must still read them."""
    if not isinstance(task_id, str) or "\x00" in task_id or not 0 < len(task_id) <= 1000:
        raise InvalidInput(f"task id {str(task_id)[:60]!r} cannot name a stored task (it must"
                           " be text, without NUL, of at most 1,000 characters)")
    return task_id

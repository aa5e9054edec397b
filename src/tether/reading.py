"""Reading a store for people: the one door the API, the console and the CLI read through.

The worker's path (claim, commit, load) belongs to the engine; what a person looks at
(listings, counts, versions, events, idempotency records, the recovery log) comes from
here, so the edges never hold the raw store and cannot write through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tether.model import IdempotencyRecord, Status, TaskRecord
from tether.store import Store, StoredEvent


@dataclass(frozen=True)
class TaskReader:
    """Read-only questions about tasks, answered from the store."""

    store: Store

    async def task(self, task_id: str) -> TaskRecord:
        """The task's index row; TaskNotFound if there is none."""
        return await self.store.get_task(task_id)

    async def tasks(self, status: Status | None = None, limit: int = 1000) -> list[TaskRecord]:
        return await self.store.list_tasks(status, limit)

    async def counts(self) -> dict[str, int]:
        return await self.store.count_by_status()

    async def inbox_depth(self) -> int:
        return await self.store.count_pending_events()

    async def versions(self, task_id: str) -> list[tuple[int, float, int]]:
        return await self.store.list_versions(task_id)

    async def head(self, task_id: str, version: int | None = None) -> tuple[int, bytes]:
        return await self.store.load_head(task_id, version)

    async def events(self, task_id: str) -> list[StoredEvent]:
        return await self.store.list_events(task_id)

    async def calls(self, task_id: str) -> list[IdempotencyRecord]:
        return await self.store.list_idempotency(task_id)

    async def recovery_log(self, task_id: str) -> list[dict[str, Any]]:
        return await self.store.list_recovery_log(task_id)

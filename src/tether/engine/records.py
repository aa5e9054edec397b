"""The idempotency records of the task a runner holds, known without asking the store.

Before every tool call the runner looks its key up (R10): a record means the call ran (or
may have) in an earlier life of the step. Asking the store each time costs a query per call
(a round trip on PostgreSQL). But while a runner holds its task's lease, only it writes that
task's records: every record is written by a checkpoint, and a checkpoint needs the lease's
fence. So the keys stored when the runner first looks, plus the keys it records itself since,
are every key that can have a record. A key outside them is answered "no record" at once; a
key among them is read from the store as before (its record may say the call ran). A
rollback or a fork changes nothing here: they add no record to this task behind the runner's
back, and a key that stops mattering only costs the read it cost before.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from tether.engine.task import TaskReads
from tether.model import IdempotencyRecord
from tether.store.base import StoredEvent


class KnownRecords:
    """The store's reads for one running task, with idempotency lookups answered from the
    keys known to have a record (see the module's docstring)."""

    def __init__(self, store: TaskReads, task_id: str) -> None:
        self._store = store
        self._task_id = task_id
        self._keys: set[str] | None = None
        """Every key that can have a record of this task; None until first needed."""

    def recorded(self, key: str) -> None:
        """The runner is writing a record under *key* (with its next checkpoint)."""
        if self._keys is not None:
            self._keys.add(key)

    async def get_idempotency(self, key: str) -> IdempotencyRecord | None:
        if self._keys is None:
            self._keys = await self._store.idempotency_keys(self._task_id)
        if key not in self._keys:
            return None
        return await self._store.get_idempotency(key)

    async def idempotency_keys(self, task_id: str) -> set[str]:
        return await self._store.idempotency_keys(task_id)

    async def pending_events(self, task_id: str) -> list[StoredEvent]:
        return await self._store.pending_events(task_id)

    async def read_history(self, task_id: str,
                           segments: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
        return await self._store.read_history(task_id, segments)

    async def next_epoch(self, task_id: str) -> int:
        return await self._store.next_epoch(task_id)

    async def load_head(self, task_id: str, version: int | None = None) -> tuple[int, bytes]:
        return await self._store.load_head(task_id, version)

    async def load_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        return await self._store.load_blobs(digests)

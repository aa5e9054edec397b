"""The part of a SQL store that is the same on every backend (R13).

Most :class:`~tether.store.base.Store` methods are one algorithm from
:mod:`tether.store.steps` run either outside a transaction (a read) or inside one write
transaction. They are implemented here once; a backend supplies only how to run steps
(:meth:`SQLBackend._read`, :meth:`SQLBackend._write`) and the methods that really differ:
claiming and leases (each database has its own way to take a row and its own clock), the
checkpoint (SQLite rewrites a snapshot row in place), large-value lookups (list parameters),
waiting for work, the schema, checks and closing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeVar

from tether.model import EmitReceipt, Event, IdempotencyRecord, Status, TaskRecord
from tether.store import graph_steps, limit_steps, retention_steps, schedule_steps, steps
from tether.store.base import (
    InboxLimits,
    LimitAnswer,
    LimitRequest,
    LimitUsage,
    ScheduleRecord,
    StoredEvent,
    TaskQuery,
)
from tether.store.graph_checkpoints import GraphBlob, GraphCheckpoint, GraphQuery, GraphWrite
from tether.store.steps import Steps

T = TypeVar("T")


class SQLBackend(ABC):
    """Store methods written once for every SQL backend; see the protocols in
    :mod:`tether.store.base` for what each promises."""

    SKIP_LOCKED = ""
    """What ends a subquery that takes rows other workers may be taking at the same moment
    (PostgreSQL: ``FOR UPDATE SKIP LOCKED``; SQLite writes one transaction at a time)."""

    @abstractmethod
    async def _read(self, work: Steps[T]) -> T:
        """Run *work* outside a transaction: each statement sees what is committed then."""

    @abstractmethod
    async def _write(self, work: Steps[T]) -> T:
        """Run *work* in one write transaction: all of them land, or none."""

    @abstractmethod
    async def _read_snapshot(self, work: Steps[T]) -> T:
        """Run *work* in one read-only snapshot: every statement sees the same commits."""

    async def _write_snapshot(self, work: Steps[T]) -> T:
        """Run *work* in one write transaction whose reads all see one snapshot (SQLite's
        write transactions already do: one writer at a time)."""
        return await self._write(work)

    # ------------------------------------------------------------------ the worker's writes

    async def create_task(self, record: TaskRecord, head: bytes, wake_at: float | None = None,
                          blobs: Mapping[str, bytes] | None = None) -> None:
        await self._write(steps.create_task(record, head, wake_at, blobs or {}))

    async def acquire_limit(self, request: LimitRequest, now: float) -> LimitAnswer:
        return await self._write(limit_steps.acquire(request, now))

    async def release_limit(self, name: str, key: str, holder: str, now: float) -> str | None:
        return await self._write(limit_steps.release(name, key, holder, now))

    async def block_limit(self, name: str, key: str, until: float, now: float) -> None:
        await self._write(limit_steps.block(name, key, until, now))

    async def spend_limit(self, name: str, key: str, holder: str, tokens: int) -> None:
        await self._write(limit_steps.spent(name, key, holder, tokens))

    async def limit_usage(self, now: float) -> list[LimitUsage]:
        return await self._read(limit_steps.usage(now))

    async def delete_task(self, task_id: str, now: float) -> None:
        await self._write(retention_steps.delete_task(task_id, now))

    async def purge_finished(self, cutoffs: Mapping[str, float], now: float,
                             limit: int = 500) -> list[str]:
        return await self._write(retention_steps.purge(cutoffs, now, limit))

    # ------------------------------------------------------------------ LangGraph checkpoints

    async def graph_put(self, checkpoint: GraphCheckpoint, blobs: Sequence[GraphBlob],
                        now: float, keep: int | None = None) -> set[str]:
        return await self._write(graph_steps.put(checkpoint, blobs, now, keep))

    async def graph_put_writes(self, thread_id: str, namespace: str, checkpoint_id: str,
                               writes: Sequence[GraphWrite]) -> None:
        await self._write(graph_steps.put_writes(thread_id, namespace, checkpoint_id, writes))

    async def graph_checkpoints(self, query: GraphQuery) -> list[GraphCheckpoint]:
        """In one snapshot: a prune committed between reading a checkpoint and reading its
        values must not hand back the checkpoint without them."""
        return await self._read_snapshot(graph_steps.checkpoints(query))

    async def graph_delete_threads(self, thread_ids: Sequence[str]) -> None:
        await self._write(graph_steps.delete_threads(thread_ids))

    async def graph_delete_runs(self, run_ids: Sequence[str]) -> None:
        await self._write(graph_steps.delete_runs(run_ids))

    async def graph_copy_thread(self, source: str, target: str) -> None:
        """Its three copies read one snapshot: a prune committed between them must not
        leave the copy with checkpoints whose values it did not copy."""
        await self._write_snapshot(graph_steps.copy_thread(source, target))

    async def graph_prune(self, thread_ids: Sequence[str], keep: int) -> None:
        await self._write(graph_steps.prune(thread_ids, keep))

    async def collect_blobs(self, now: float) -> int:
        return await self._write_alone(retention_steps.collect_blobs(now))

    async def _write_alone(self, work: Steps[T]) -> T:
        """A write no commit of a snapshot may interleave with (SQLite: every write
        transaction is alone already)."""
        return await self._write(work)

    async def put_schedule(self, schedule: ScheduleRecord) -> None:
        await self._write(schedule_steps.put(schedule))

    async def claim_due_schedules(self, now: float, limit: int = 100,
                                  agents: Collection[str] | None = None,
                                  hold: float = 30.0) -> list[ScheduleRecord]:
        if not await self._read(schedule_steps.any_due(now, agents)):
            return []  # nothing due: no write (an idle worker looks every second)
        return await self._write(schedule_steps.claim(now, limit, agents, hold,
                                                      self.SKIP_LOCKED))

    async def advance_schedule(self, name: str, expected: float, next_at: float | None,
                               ran_at: float) -> bool:
        return await self._write(schedule_steps.advance(name, expected, next_at, ran_at))

    async def delete_schedule(self, name: str) -> bool:
        return await self._write(schedule_steps.delete(name))

    async def list_schedules(self, name: str | None = None) -> list[ScheduleRecord]:
        return await self._read(schedule_steps.listed(name))

    async def wake_all(self, status: Status, now: float) -> int:
        return await self._write(steps.wake_all(status, now))

    async def next_epoch(self, task_id: str) -> int:
        return await self._write(steps.next_epoch(task_id))

    async def add_event(self, event: Event, priority: int, limits: InboxLimits, now: float) -> EmitReceipt:
        return await self._write(steps.add_event(event, priority, limits, now))

    # ------------------------------------------------------------------ reads

    async def get_task(self, task_id: str) -> TaskRecord:
        return await self._read(steps.get_task(task_id))

    async def list_tasks(self, status: Status | None = None, limit: int = 1000) -> list[TaskRecord]:
        return await self._read(steps.list_tasks(status, limit))

    async def leased_tasks(self, limit: int = 1000) -> list[TaskRecord]:
        return await self._read(steps.leased_tasks(limit))

    async def find_tasks(self, query: TaskQuery) -> list[TaskRecord]:
        return await self._read(steps.find_tasks(query))

    async def count_by_status(self) -> dict[str, int]:
        return await self._read(steps.count_by_status())

    async def load_head(self, task_id: str, version: int | None = None) -> tuple[int, bytes]:
        return await self._read(steps.load_head(task_id, version))

    async def list_versions(self, task_id: str) -> list[tuple[int, float, int]]:
        return await self._read(steps.list_versions(task_id))

    async def read_history(self, task_id: str, segments: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
        return await self._read(steps.read_history(task_id, segments))

    async def count_history(self, task_id: str, segments: Sequence[Sequence[int]]) -> int:
        return await self._read(steps.count_history(task_id, segments))

    async def pending_events(self, task_id: str) -> list[StoredEvent]:
        return await self._read(steps.pending_events(task_id))

    async def count_pending_events(self) -> int:
        return await self._read(steps.count_pending_events())

    async def list_events(self, task_id: str) -> list[StoredEvent]:
        return await self._read(steps.list_events(task_id))

    async def get_idempotency(self, key: str) -> IdempotencyRecord | None:
        return await self._read(steps.get_idempotency(key))

    async def idempotency_keys(self, task_id: str) -> set[str]:
        return await self._read(steps.idempotency_keys(task_id))

    async def list_idempotency(self, task_id: str) -> list[IdempotencyRecord]:
        return await self._read(steps.list_idempotency(task_id))

    async def list_recovery_log(self, task_id: str) -> list[dict[str, Any]]:
        return await self._read(steps.list_recovery_log(task_id))

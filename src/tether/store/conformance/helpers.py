"""Shared builders for the store conformance suite: real data classes, fixed lease and retention."""

from __future__ import annotations

import time
from typing import Any

from tether.model import Event, Frame, Snapshot, Status, TaskRecord
from tether.store.base import Checkpoint, Claim, InboxLimits, Store

LEASE = 30.0
"""Lease length used by the suite; tests move ``now`` past it to simulate expiry."""

KEEP = 10


def limits(
    *,
    capacity: int = 1000,
    refusable: bool = False,
    coalesce: str | None = None,
    window: float = 1.5,
    wakes_needs_human: bool = False,
    reopens: frozenset[Status] = frozenset(),
) -> InboxLimits:
    """Inbox limits with suite defaults (content events: not refusable, never coalesced)."""
    return InboxLimits(
        capacity=capacity,
        refusable=refusable,
        coalesce=coalesce,
        window=window,
        wakes_needs_human=wakes_needs_human,
        reopens=reopens,
    )


def head(task_id: str, status: Status = Status.PENDING, step: int = 0, **extra: Any) -> bytes:
    """A real snapshot head for *task_id* (deterministic bytes for the same arguments)."""
    extra.setdefault("created_at", 1000.0)
    extra.setdefault("stack", [Frame(agent="echo", input={"q": task_id}, frame_id="root")])
    return Snapshot(task_id=task_id, agent="echo", input={"q": task_id}, status=status, step=step,
                    **extra).dumps()


async def make_task(store: Store, task_id: str, created_at: float | None = None) -> TaskRecord:
    """Create a pending task with its version-1 head."""
    at = time.time() if created_at is None else created_at
    record = TaskRecord(task_id=task_id, agent="echo", status=Status.PENDING, created_at=at,
                        updated_at=at, head_version=1)
    await store.create_task(record, head(task_id))
    return record


async def claim(store: Store, task_id: str, now: float, worker: str = "w1") -> Claim:
    """Claim *task_id*, failing the test if it cannot be claimed."""
    got = await store.claim_task(task_id, worker, now, LEASE)
    assert got is not None, f"task {task_id} should be claimable at {now}"
    assert got.task_id == task_id
    return got


async def commit(
    store: Store,
    lease: Claim,
    status: Status,
    now: float,
    *,
    step: int = 1,
    keep: int = KEEP,
    **fields: Any,
) -> int:
    """Commit a checkpoint moving the task to *status*; returns the new version."""
    checkpoint = Checkpoint(head=head(lease.task_id, status, step), status=status, **fields)
    return await store.commit(lease, checkpoint, keep, now + LEASE)


async def park(store: Store, task_id: str, status: Status, now: float, **fields: Any) -> None:
    """Claim, move the task to *status* and release it cleanly."""
    lease = await claim(store, task_id, now)
    await commit(store, lease, status, now, **fields)
    await store.release(lease)


def event(task_id: str, type_: str = "user_message", payload: Any = None,
          source_event_id: str | None = None) -> Event:
    return Event(type=type_, task_id=task_id, payload=payload, source_event_id=source_event_id)


"""Fork: a new task from any kept version of another (LangGraph's time travel, DBOS's fork).

The fork gets its own id, so every call it makes from there on has idempotency keys of its
own; its dialog starts with the source's rows up to that version; the source is not touched.
What the source had already done is not done again: a call open at that version is answered
from the source's idempotency record when it succeeded there, and treated as in doubt (its
tool's reconcile hook, or a person) when its outcome is unknown there. Only when asked
(*redo_side_effects*) does the fork make the open call again, under a key of its own.

The fork is written in two steps through the narrow store protocol: a paused, empty task
(version 1), then, under a lease, its snapshot with the copied dialog (version 2). A crash
between them leaves a paused fork with no dialog, named as such, that a person can cancel.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tether import blobs
from tether.engine import timers
from tether.engine.levers import reopen_call
from tether.model import CallStatus, OutcomeStatus, Snapshot, Status, TaskRecord
from tether.settings import Settings
from tether.store import Checkpoint, HistoryRow, Store
from tether.strategies import Strategy

FORK_LEASE = 60.0
"""Seconds the harness holds a new fork while it writes its dialog."""


@dataclass(frozen=True)
class ForkPlan:
    """What to fork: the source, its version, the new id, who asked, and whether to redo."""

    source: str
    version: int
    fork_id: str
    by: str
    redo_side_effects: bool = False


async def fork(store: Store, settings: Settings, plan: ForkPlan, worker: str) -> Snapshot:
    """Create the fork and return its snapshot (TaskExists if the id is taken)."""
    _, head = await blobs.load_head(store, plan.source, plan.version)
    old = Snapshot.loads(head, plan.source, plan.version)
    rows = (await store.read_history(plan.source, old.history_segments))[: old.history_len]
    snap = await _forked(store, old, plan)
    now = time.time()
    empty = Snapshot.loads(snap.dumps(), plan.fork_id, 1)
    empty.status, empty.history_len = Status.PAUSED, 0
    first, large = blobs.layered(empty.dumps(), settings.blob_threshold)
    await store.create_task(TaskRecord(plan.fork_id, snap.agent, Status.PAUSED, now, now, 1,
                                       reason=f"being forked from {plan.source} v{plan.version}"),
                            first, blobs=large)
    claim = await store.claim_task(plan.fork_id, worker, now, FORK_LEASE)
    assert claim is not None  # no worker claims a paused task
    snap.history_len = len(rows)
    head_v2, large = blobs.layered(snap.dumps(), settings.blob_threshold)
    await store.commit(claim, Checkpoint(
        head=head_v2, status=snap.status, history=[
            HistoryRow(0, seq, row) for seq, row in enumerate(rows, start=1)],
        recovery_log=[_record(snap, plan)], wake_at=timers.wake_time(snap), progress=True,
        blobs=large), settings.keep_versions, now + FORK_LEASE)
    await store.release(claim)
    return snap


async def _forked(store: Store, old: Snapshot, plan: ForkPlan) -> Snapshot:
    snap = Snapshot.loads(old.dumps(), plan.source, plan.version)
    snap.task_id = plan.fork_id
    snap.history_segments = [[0, -1]]
    snap.recovery = type(snap.recovery)()
    snap.deadline_at = None  # the source's deadline is the source's
    snap.created_at = time.time()
    snap.status = _status(old.status)
    timers.rearm_waits(snap, time.time(), "fork")
    if plan.redo_side_effects:
        snap.key_salt = "~fork"
        reopen_call(snap)
    elif snap.call is not None:
        await _settle_open_call(store, snap)
    return snap


def _status(at_version: Status) -> Status:
    """A fork of a running or waiting version goes on at once; of a finished, stopped or
    parked one, it waits paused for a person's resume (as a rollback to it would)."""
    if at_version in (Status.PENDING, Status.RUNNING, Status.WAITING):
        return at_version
    return Status.PAUSED


async def _settle_open_call(store: Store, snap: Snapshot) -> None:
    """The call open at the forked version, as the source left it. Never started there, or
    failed there: the fork makes it. Succeeded there, or its outcome unknown there: the fork
    holds it in doubt and runs, so the worker that takes it answers it from the source's
    record (not made again) or reconciles it (or asks a person), as after a crash."""
    call = snap.call
    assert call is not None
    record = await store.get_idempotency(call.key)
    if record is None or record.args_hash != call.args_hash \
            or record.status == OutcomeStatus.FAILED:
        call.status = CallStatus.PLANNED
        return
    call.status = CallStatus.STARTED
    snap.status = Status.RUNNING


def _record(snap: Snapshot, plan: ForkPlan) -> dict[str, Any]:
    return {"task_id": plan.fork_id, "checkpoint_version": 2, "event_id": None,
            "resume_strategy": str(Strategy.FORK), "recovery_attempt": 0, "step": snap.step,
            "detail": f"forked from task {plan.source} version {plan.version} by {plan.by}"
                      + (" (side effects will be redone)" if plan.redo_side_effects else ""),
            "at": time.time(), "forked_from": {"task_id": plan.source, "version": plan.version}}

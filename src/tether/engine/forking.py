"""Fork: a new task from any kept version of another (LangGraph's time travel, DBOS's fork).

The fork gets its own id, so every call it makes from there on has idempotency keys of its
own; its dialog starts with the source's rows up to that version; the source is not touched.
A call open at that version (the current one, or one put aside in the agenda) gets a key of
the fork's own too (:func:`own_key`), so source and fork never run one call under one key.
What the source had already done is not done again: when the call succeeded there, its
record is copied under the fork's key, and the fork answers from a record it owns (deleting
the source changes nothing). A call whose outcome the source does not know yet (running
there now, or in doubt) cannot be copied truthfully: the fork is refused until the source
has settled it. Only when asked (*redo_side_effects*) does the fork make the open call
again, under a key of its own.

The fork is written in two steps through the narrow store protocol: a paused, empty task
(version 1), then, under a lease, its snapshot with the copied dialog (version 2). A crash
between them leaves a paused fork with no dialog, named as such, that a person can cancel.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass
from typing import Any

from tether import blobs
from tether.engine import timers
from tether.engine.levers import reopen_call
from tether.errors import IllegalTransition
from tether.model import CallStatus, IdempotencyRecord, OutcomeStatus, Snapshot, Status, TaskRecord
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
    paused: bool = False
    """Start the fork paused, whatever the version's status: a person looks first, then
    resumes it."""


async def fork(store: Store, settings: Settings, plan: ForkPlan, worker: str) -> Snapshot:
    """Create the fork and return its snapshot (TaskExists if the id is taken)."""
    _, head = await blobs.load_head(store, plan.source, plan.version)
    old = Snapshot.loads(head, plan.source, plan.version)
    rows = (await store.read_history(plan.source, old.history_segments))[: old.history_len]
    snap, owned = await _forked(store, old, plan)
    if plan.paused:
        snap.status = Status.PAUSED
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
        idempotency=owned, recovery_log=[_record(snap, plan)], wake_at=timers.wake_time(snap),
        progress=True,
        blobs=large), settings.keep_versions, now + FORK_LEASE)
    await store.release(claim)
    return snap


async def _forked(store: Store, old: Snapshot, plan: ForkPlan
                  ) -> tuple[Snapshot, list[IdempotencyRecord]]:
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
        return snap, []
    return snap, await _rekey_open_calls(store, snap, plan.source)


def _status(at_version: Status) -> Status:
    """A fork of a running or waiting version goes on at once; of a finished, stopped or
    parked one, it waits paused for a person's resume (as a rollback to it would)."""
    if at_version in (Status.PENDING, Status.RUNNING, Status.WAITING):
        return at_version
    return Status.PAUSED


def own_key(fork_id: str, key: str) -> str:
    """The fork's own idempotency key for a call it copied from its source: bounded in length
    however many forks deep, and never one the source (or another fork) uses."""
    return f"{fork_id}:fork:{hashlib.sha256(key.encode()).hexdigest()[:20]}"


async def _rekey_open_calls(store: Store, snap: Snapshot, source: str) -> list[IdempotencyRecord]:
    """Give every call open in the fork a key of its own; return the records the fork owns
    from the start (the source's successes, copied). Raises IllegalTransition for a call
    whose outcome the source does not know yet."""
    owned: list[IdempotencyRecord] = []
    for call in snap.open_calls():
        record = await store.get_idempotency(call.key)
        same = record is not None and record.args_hash == call.args_hash
        if same and record is not None and record.status == OutcomeStatus.STARTED:
            raise IllegalTransition(await _unsettled(store, source, call.tool, call.key))
        call.key = own_key(snap.task_id, call.key)
        if same and record is not None and record.status == OutcomeStatus.SUCCEEDED:
            owned.append(dataclasses.replace(record, key=call.key, task_id=snap.task_id))
            call.status = CallStatus.STARTED  # answered from the fork's own record on its run
            if call is snap.call:
                snap.status = Status.RUNNING
        else:  # never started there, or failed there: the fork makes it, under its own key
            call.status = CallStatus.PLANNED
    return owned


async def _unsettled(store: Store, source: str, tool: str, key: str) -> str:
    """Why a call the source has not settled cannot be forked, and what to do instead."""
    live = (await store.get_task(source)).runner()
    where = (f"is running now in task {source} (worker {live})" if live else
             f"is in doubt in task {source} (started, no outcome known)")
    return (f"cannot fork: call {tool} key={key} {where}, so the fork could not know whether it"
            " happened. Fork once the source has settled it"
            + ("" if live else f" (tether decide {source} ...)")
            + ", fork an earlier version, or fork with redo_side_effects to make it anew")


def _record(snap: Snapshot, plan: ForkPlan) -> dict[str, Any]:
    return {"task_id": plan.fork_id, "checkpoint_version": 2, "event_id": None,
            "resume_strategy": str(Strategy.FORK), "recovery_attempt": 0, "step": snap.step,
            "detail": f"forked from task {plan.source} version {plan.version} by {plan.by}"
                      + (" (side effects will be redone)" if plan.redo_side_effects else ""),
            "at": time.time(), "forked_from": {"task_id": plan.source, "version": plan.version}}

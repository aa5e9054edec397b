"""Recovery: what the runner does after a crash, a failing tool, or a person stepping in.

Strategies (R15): a process restart restores the newest snapshot and goes
back to the last resume point; a call in flight at the crash is re-run if
idempotent, reconciled if it has a hook, and otherwise handed to a person
(never repeated blindly, R10); a tool that gives up is offered to the agent
first (skip or compensate), then retried with backoff a bounded number of
times, stopping early when the same failure fingerprint comes back (R22).
Every decision writes one structured record (R23).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tether.engine import budget, calls, timers
from tether.engine.task import RunningTask, TaskReads, end_wait, hand_to_person
from tether.errors import NeedsPerson, TetherError
from tether.failpoints import failpoint
from tether.model import (
    CallStatus,
    Event,
    Snapshot,
    Status,
    to_plain,
)
from tether.strategies import Strategy
from tether.tools import (
    describe_error,
    failure_fingerprint,
    traceback_text,
)

log = logging.getLogger("tether.recovery")



def log_record(task: RunningTask, strategy: Strategy, event_id: int | None, detail: str,
               traceback: str | None = None) -> dict[str, Any]:
    """The structured record of one recovery action, with the fields R23 names (and the
    failure's traceback, when there was one)."""
    extra = {"traceback": traceback} if traceback else {}
    return {**extra,
        "task_id": task.snap.task_id,
        "checkpoint_version": task.version,
        "event_id": event_id,
        "resume_strategy": str(strategy),  # a plain string in records and logs
        "recovery_attempt": task.snap.recovery.attempts,
        "step": task.snap.step,
        "detail": detail,
        "at": time.time(),
    }


def emit_log_records(records: list[dict[str, Any]], version: int) -> None:
    for record in records:
        log.info("recovery %s on task %s: %s", record["resume_strategy"], record["task_id"],
                 record["detail"], extra={"tether": {**record, "written_version": version}})


# ---------------------------------------------------------------------- restart


async def restore(task: RunningTask) -> None:
    """Bring a freshly claimed task back to a state the loop can continue from."""
    snap = task.snap
    if snap.status.is_terminal:
        return
    crashed = task.claim.crashed
    # A parked task's in-doubt call was already resolved (to a person); only a running task's
    # call is looked at again, so a lever on a parked task does not re-ask reconcile hooks.
    in_doubt = snap.status is Status.RUNNING and snap.call is not None \
        and snap.call.status == CallStatus.STARTED
    if crashed or in_doubt:
        failpoint("during_recovery")
        if crashed:
            # The store counted this crash at claim time, so a worker that dies while
            # recovering (before any commit) still uses up the budget.
            task.snap.recovery.attempts = max(task.snap.recovery.attempts,
                                                task.claim.crashes - 1)
            if not budget.count_attempt(task, "the worker running it died (lease expired)"):
                return
            task.log_recovery(Strategy.RESUME, detail=f"restored version {task.version} at step"
                                f" {snap.step} after the worker died")
            check_resources(task)
        if in_doubt:
            await calls.resolve_in_doubt(task)
    await timers.fire_due(task)  # what fell due while no worker held the task (E6)
    if snap.status is Status.WAITING and not timers.overdue(snap):
        await ask_check_wait(task)  # it may have happened outside, unseen (R16)


async def ask_check_wait(task: RunningTask) -> None:
    """Ask the agent whether what the frame waits for has already happened (R16).

    Asked when a Wait begins (an approval may have come in while the task was still busy:
    it is in the dialog, and the agent decides whether it counts) and whenever a waiting
    task is loaded again (it may have happened outside without an event).
    """
    frame = task.snap.frame
    wait = frame.wait
    if not wait:
        return
    agent = task.agent_for(frame)
    view = await task.view()  # a store error reading the dialog is not the agent's failure
    try:
        found = await agent.check_wait(view, wait)
        found = None if found is None else to_plain(found)
    except Exception as error:  # agent code may raise anything
        hand_to_person(task, f"check_wait of agent {agent.name!r} failed:"
                             f" {type(error).__name__}: {error}")
        return
    if found is not None:
        end_wait(task, {"type": wait["event_type"], "payload": found, "source": "check_wait"})
        task.log_recovery(Strategy.WAIT_VALIDATED, detail=f"{wait['event_type']} had already"
                            " happened; the wait ends without a new event")


def check_resources(task: RunningTask) -> None:
    """Mark resources that vanished while the task was down, so the agent can see it (R16)."""
    for resource in task.snap.resources:
        try:
            exists = task.resource_kinds.get(resource.kind).exists(resource.ref)
        except TetherError as error:
            exists, detail = False, str(error)
        else:
            detail = f"{resource.kind} {resource.ref} is gone"
        if not exists and not resource.missing:
            resource.missing = True
            task.log_recovery(Strategy.RESOURCE_MISSING, detail=detail)


# ---------------------------------------------------------------------- tool failures








def over_step_limit(task: RunningTask) -> bool:
    """Whether the task has used its budget of steps; if so it goes to a person (a runaway
    agent must not plan forever). A person's resume grants the same budget again."""
    snap = task.snap
    limit = snap.max_steps or task.settings.max_steps
    if snap.step - snap.budget_start < limit:
        return False
    hand_to_person(task, f"the task took {snap.step - snap.budget_start} steps, its limit"
                         f" (max_steps={limit}); look at what it is doing, then resume it for"
                         f" {limit} more", strategy=Strategy.STEP_LIMIT)
    return True






def plan_failed(task: RunningTask, error: Exception) -> None:
    """The agent's plan (often a model call) raised: retry with backoff, stop on a repeat (R22)."""
    agent = task.snap.frame.agent
    text = describe_error(error)
    if isinstance(error, NeedsPerson):
        hand_to_person(task, f"agent {agent!r}: {error}")
        return
    fingerprint = failure_fingerprint(f"plan:{agent}", error)
    trace = traceback_text(error)
    delay = budget.next_recovery(task, fingerprint, f"planning by agent {agent!r}: {text}", trace)
    if delay is None:
        return
    task.snap.recovery.retry_at = time.time() + delay
    task.log_recovery(Strategy.RETRY_PLAN, traceback=trace,
                      detail=f"agent {agent} failed to plan ({text}); retrying in {delay:.2f}s")
    task.request_commit()








async def branch_history(reads: TaskReads, snap: Snapshot) -> int:
    """Start a new dialog branch after *snap*'s last row; rows written later stay stored."""
    epoch = await reads.next_epoch(snap.task_id)
    segments = [list(segment) for segment in snap.history_segments]
    segments[-1][1] = snap.history_len
    snap.history_segments = [*segments, [epoch, -1]]
    return epoch


def retry_now(task: RunningTask, event: Event) -> None:
    """A P2 signal (retry, degrade...) brings a pending retry forward."""
    snap = task.snap
    if snap.call is not None and snap.call.retry_at:
        snap.call.retry_at = time.time()
    elif snap.recovery.retry_at:
        snap.recovery.retry_at = time.time()
    else:
        return
    task.log_recovery(Strategy.RETRY_NOW, event.id, f"{event.type}: retrying now")

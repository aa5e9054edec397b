"""The levers people pull, as a task's loop applies them: resume, decide, roll back (R14, R26).

A person's lever arrives as an event like any other and is applied between steps by
:mod:`tether.engine.events`; what it means for the task is decided here, on the
:class:`~tether.engine.task.RunningTask`. A resume never repeats a call whose outcome is
unknown (a person decides it); a rollback never repeats a side effect that happened since
the version it goes back to unless asked to (E4).
"""

from __future__ import annotations

import copy
import time
from typing import Any

from tether import blobs, dialog
from tether.engine import answers, calls, limits, recovery, timers
from tether.engine.calls import awaiting_decision, in_doubt_message
from tether.engine.task import RunningTask
from tether.errors import InDoubtCall, VersionNotFound
from tether.failpoints import failpoint
from tether.model import CallStatus, Event, OutcomeStatus, Snapshot, Status, check_count
from tether.strategies import Strategy


async def human_resume(task: RunningTask, event: Event) -> None:
    """A person resumes a paused, waiting or parked task, optionally amending it."""
    snap = task.snap
    assert event.id is not None
    payload = event.payload if isinstance(event.payload, dict) else {}
    undecided = await awaiting_decision(task.reads, snap, task.tools)
    if undecided is not None and snap.status not in (Status.COMPLETED, Status.CANCELLED):
        raise InDoubtCall(in_doubt_message(snap.task_id, undecided))  # failed ones too
    seen = payload.get("version")
    if seen is not None and seen != task.version:
        task.log_recovery(Strategy.RESUME_IGNORED, event.id, f"the person resumed version"
                          f" {str(seen)[:20]}, as shown to them; the task is at version"
                          f" {task.version} now (it moved on since): look at it again")
        return
    amended = bool(payload.get("message") or payload.get("frame_patch") or "input" in payload)
    if snap.status not in (Status.PAUSED, Status.NEEDS_HUMAN, Status.FAILED, Status.WAITING):
        if amended and snap.status is Status.RUNNING:
            _amend(task, payload, event.id)
            task.log_recovery(Strategy.AMEND, event.id, "task already running; the person's message"
                                " and patch were applied without a recovery")
        else:
            task.log_recovery(Strategy.RESUME_IGNORED, event.id,
                                f"task already {snap.status.value}; duplicate resume signal")
        return
    if payload.get("earlier_result"):  # checked before anything changes
        await limits.answer_with_earlier(task, str(payload.get("by") or "unknown"), event.id)
    _amend(task, payload, event.id)
    if snap.status is Status.FAILED:  # a deadline may have used up its waits' timers
        timers.retag_waits(snap, f"resume{event.id}")
    snap.recovery = type(snap.recovery)()
    snap.error = None
    snap.budget_start = snap.step
    limits.grant_again(snap)
    task.mark_progress()
    _settle_call_for_resume(task, amended)
    if snap.frame.wait and snap.status is Status.WAITING:
        snap.frame.wait = None  # a person ends the wait; a paused task keeps its armed wait
        snap.frame.last_event = {"type": "resume", "payload": payload}
    task.set_status(Status.RUNNING)
    task.log_recovery(Strategy.HUMAN_RESUME, event.id, f"resumed by {payload.get('by') or 'unknown'}"
                        + (f": {payload['message']}" if payload.get("message") else ""))
    if snap.call is not None and snap.call.status == CallStatus.STARTED:
        await calls.resolve_in_doubt(task)  # reconcile (or re-run an idempotent call), never blind


def _amend(task: RunningTask, payload: dict[str, Any], event_id: int) -> None:
    """Add a person's message to the dialog, merge their patch into the current frame, and
    put their corrected input in place of the task's (the old one stays in the dialog). A
    message is newer than the answer being carried out: its calls not started are not run."""
    if payload.get("message"):
        dropped = answers.set_aside(task, event_id)
        if dropped:
            task.log_recovery(Strategy.ANSWER_SET_ASIDE, event_id,
                              f"a person's message came first: not run {', '.join(dropped)}")
        task.append_history(dialog.user("resume", payload["message"]))
    if payload.get("frame_patch"):
        task.snap.frame.scratch.update(payload["frame_patch"])
    if "input" in payload:
        snap = task.snap
        task.append_history(dialog.user("input", payload["input"], replaced=snap.input,
                                        by=payload.get("by")))
        snap.input = payload["input"]
        snap.stack[0].input = copy.deepcopy(payload["input"])


def _settle_call_for_resume(task: RunningTask, amended: bool) -> None:
    """Decide what a person's resume means for the call that stopped the task.

    An amended resume (message or frame patch) drops a failed call so the agent
    plans again with what the person changed; a plain resume retries it as
    planned. A call whose outcome is unknown never gets here unless it settles
    itself (a person's resume is refused for the others, in every status).
    """
    snap = task.snap
    call = snap.call
    if call is None:
        agenda = snap.frame.agenda
        if amended and agenda and agenda[0].kind == "tool_call":
            agenda.pop(0)
        return
    if call.status == CallStatus.STARTED:
        return  # it settles itself (its record, idempotent, reconcile), once running again
    if amended:
        snap.frame.agenda.pop(0)
        snap.call = None
    else:
        call.retry_at = None
        call.attempt = 0


async def rollback(task: RunningTask, event: Event) -> None:
    """Go back to a kept version; later dialog rows stay stored on their own branch (R14, E4)."""
    assert event.id is not None
    if task.snap.status is Status.CANCELLED:
        task.log_recovery(Strategy.ROLLBACK_REFUSED, event.id, "the task was cancelled; cancel is final")
        return
    payload = event.payload if isinstance(event.payload, dict) else {}
    version = payload.get("version")
    version = check_count(version, "the version a rollback names")
    task_id = task.snap.task_id
    data = await _rollback_target(task, event.id, version)
    old = Snapshot.loads(data, task_id, version)
    failpoint("during_rollback")
    epoch = await recovery.branch_history(task.reads, old)
    if payload.get("redo_side_effects"):
        old.key_salt = f"~redo{epoch}"
        reopen_call(old)
    timers.rearm_waits(old, time.time(), f"r{epoch}")
    old.recovery = type(old.recovery)()
    if old.status is Status.PENDING:
        old.status = Status.RUNNING
    elif old.status is Status.NEEDS_HUMAN or old.status.is_terminal:
        old.status = Status.PAUSED
    history = await task.reads.read_history(task_id, old.history_segments)
    task.replace_state(old, history[: old.history_len])
    task.log_recovery(Strategy.ROLLBACK, event.id, f"rolled back to version {version} by"
                        f" {payload.get('by') or 'unknown'}"
                        + (" (side effects will be redone)" if payload.get("redo_side_effects")
                           else ""))
    await _calls_that_ran_since(task, old, version)
    if old.call is not None and old.call.status == CallStatus.STARTED:
        await calls.resolve_in_doubt(task)


async def _calls_that_ran_since(task: RunningTask, old: Snapshot, version: int) -> None:
    """The kept version's open calls as the store has their records now, not as the version
    saw them (E4). Records are not versioned: an attempt started after the version (and
    perhaps paid, then lost its worker) left its record STARTED or SUCCEEDED, while the
    version still has the call planned or waiting out a retry. Such a call may have run, so
    it is taken as started: the current one is settled now (its result reused, reconciled,
    re-run if idempotent, or a person asked), one put aside in an agenda when it comes
    round. Run again as the version had it, it would pay twice."""
    for call in old.open_calls():
        if call.status == CallStatus.STARTED:
            continue
        record = await task.reads.get_idempotency(call.key)
        if record is None or record.args_hash != call.args_hash \
                or record.status not in (OutcomeStatus.STARTED, OutcomeStatus.SUCCEEDED):
            continue
        call.status = CallStatus.STARTED
        call.attempt = max(call.attempt, record.attempts)
        call.retry_at = None
        task.log_recovery(Strategy.ROLLBACK, detail=(
            f"{call.tool} key={call.key} was {record.status} after version {version}: it may"
            " have run since, so it is settled as a call in doubt, not run again blind"))


async def _rollback_target(task: RunningTask, event_id: int, version: int) -> bytes:
    """The head to roll back to, always as the store has it (an event never carries state):
    read now, or by this process's lever when it was asked (so pruning cannot race it)."""
    task_id = task.snap.task_id
    captured = task.captured_head(event_id, version)
    if captured is not None:
        return await blobs.resolve(task.reads, captured, task_id, version)
    try:
        _, data = await blobs.load_head(task.reads, task_id, version)
    except VersionNotFound:
        raise VersionNotFound(f"task {task_id}: version {version} is no longer kept (pruned"
                              " before the rollback was applied); roll back to a kept version"
                              ) from None
    return data


def reopen_call(snap: Snapshot) -> None:
    """Forget every open call's key (the current one, and any put aside in an agenda of any
    frame) so each is derived again with the new salt when it comes round: a real redo."""
    for frame in snap.stack:
        for entry in frame.agenda:
            entry.open_call = None
    snap.call = None

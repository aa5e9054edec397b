"""The event inbox: how events get in (durably) and how the task's loop applies them (R3-R7).

Sending an event only stores it (``Inbox.emit``); nothing about the task
changes until its runner reads the inbox at the next tick and calls
:func:`apply_event`. That split is what keeps handlers from racing the loop
(R5). The interruption protocol decides priority and coalescing; the store
enforces dedup (a unique ``source_event_id`` per task) and capacity.
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from tether.engine import degrade, recovery, timers
from tether.errors import InboxFull, InvalidInput, StoreUnavailable, TaskNotFound, TetherError
from tether.model import (
    EmitReceipt,
    Event,
    Frame,
    Priority,
    Replan,
    Status,
    action_to_dict,
    check_task_id,
    to_plain,
)
from tether.protocol import CONTROL_EVENTS, InterruptionProtocol
from tether.settings import Settings
from tether.store import InboxLimits, Store, StoredEvent

if TYPE_CHECKING:
    from tether.engine.runner import Runner


MAX_NAME = 200
"""Longest event type or ``source_event_id`` accepted (they are stored and indexed)."""

REOPENS = {
    "resume": frozenset({Status.FAILED}),
    "rollback": frozenset({Status.FAILED, Status.COMPLETED}),
}
"""Finished tasks that a person's lever may still reach: retry a failure, roll back a result."""


class Inbox:
    """The sending side: validate, classify and durably store events."""

    def __init__(self, store: Store, protocol: InterruptionProtocol, settings: Settings,
                 counters: Counter[str] | None = None) -> None:
        self.store = store
        self.protocol = protocol
        self.settings = settings
        self.counters: Counter[str] = counters if counters is not None else Counter()

    async def emit(self, event: Event) -> tuple[EmitReceipt, Priority]:
        """Store *event*; returns only once it is durable (or refused with an error)."""
        if not isinstance(event.type, str) or not event.type:
            raise InvalidInput("an event needs a non-empty string type")
        if len(event.type) > MAX_NAME or not event.type.isprintable():
            raise InvalidInput(f"event type {event.type[:40]!r}... must be printable and at most"
                               f" {MAX_NAME} characters")
        check_task_id(event.task_id)
        if event.source_event_id is not None and (
                not isinstance(event.source_event_id, str) or len(event.source_event_id) > MAX_NAME):
            raise InvalidInput(f"source_event_id must be a string of at most {MAX_NAME} characters")
        event.payload = to_plain(event.payload, self.settings.max_payload_bytes,
                                 f"payload of event {event.type!r}")
        rule = self.protocol.rule_for(event.type, event.priority)
        limits = InboxLimits(
            capacity=self.settings.inbox_capacity,
            refusable=rule.priority >= Priority.P2,
            coalesce=rule.coalesce,
            window=self.settings.coalesce_window,
            wakes_needs_human=event.type in CONTROL_EVENTS,
            reopens=REOPENS.get(event.type, frozenset()),
        )
        try:
            receipt = await self.store.add_event(event, int(rule.priority), limits, time.time())
        except InboxFull:
            self.counters["events_refused"] += 1
            raise
        self.counters[f"events_{receipt.outcome}"] += 1
        self.counters["events_coalesced"] += receipt.coalesced
        return receipt, rule.priority


async def apply_event(runner: Runner, stored: StoredEvent) -> None:
    """Apply one event to the task: the only path by which events change state (R5)."""
    event = stored.event
    assert event.id is not None
    snap = runner.snap
    if event.type in CONTROL_EVENTS:
        runner.applied_levers.add(event.id)  # a later rollback in this tick keeps levers applied
        try:
            await _control(runner, event)
        except StoreUnavailable:
            raise  # the store is away: the lever stays pending, applied once it is back
        except TetherError as error:
            runner.log_recovery(f"{event.type}_failed", event.id, str(error))
            runner.done_event(event.id, "failed")
            return
        runner.done_event(event.id, "applied")
        return
    if snap.status is Status.NEEDS_HUMAN:
        return  # stays pending: applied after a person resumes, never dropped (E2)
    if snap.status.is_terminal:
        runner.done_event(event.id, "ignored")
        return
    disposition = await _apply(runner, stored)
    if disposition is not None:  # None: it stays pending, for a later tick
        runner.done_event(event.id, disposition)


async def _apply(runner: Runner, stored: StoredEvent) -> str | None:
    event = stored.event
    if timers.is_wait_timer(event):
        return timers.time_out_wait(runner, event)
    if event.type == "task_timeout":
        return timers.miss_deadline(runner, event)
    if event.type in degrade.DEGRADE_EVENTS:
        degrade.switch(runner, event)
    if stored.priority >= Priority.P3:
        runner.snap.signals[event.type] = event.payload
        return "applied"
    await _deliver(runner, event, stored.priority)
    return "applied"


async def _control(runner: Runner, event: Event) -> None:
    if event.type == "cancel":
        await _cancel(runner, event)
    elif event.type == "resume":
        await recovery.human_resume(runner, event)
    elif event.type == "decide":
        await recovery.human_decide(runner, event)
    else:
        await recovery.rollback(runner, event)


async def _cancel(runner: Runner, event: Event) -> None:
    if runner.snap.status.is_terminal:
        return
    runner.append_history({"role": "event", "type": "cancel", "content": event.payload})
    runner.snap.call = None
    runner.set_status(Status.CANCELLED)
    recovery.clean_up_resources(runner)


async def _deliver(runner: Runner, event: Event, priority: int) -> None:
    """Record a P0-P2 event in the dialog, end a matching wait, and ask the agents."""
    snap = runner.snap
    assert event.id is not None
    runner.append_history(_history_entry(event))
    waiting = next((f for f in reversed(snap.stack)
                    if f.wait and f.wait["event_type"] == event.type
                    and not _too_late(f.wait, event)), None)
    if waiting is not None:
        end_wait(runner, event.to_dict(), waiting)
        return
    handled = await _offer(runner, event)
    if handled is None:
        return
    if handled:
        if snap.status is Status.WAITING:
            runner.set_status(Status.RUNNING)  # run the interjection; the wait stays armed
        return
    if priority == Priority.P0 and snap.status is Status.RUNNING:
        runner.set_status(Status.PAUSED)
        runner.log_recovery("pause", event.id, f"{event.type}: paused, to-do list kept")
    elif priority == Priority.P2:
        recovery.retry_now(runner, event)


async def _offer(runner: Runner, event: Event) -> bool | None:
    """Offer the event to the top frame's agent, then to each parent's (R9).

    The first agent that answers with an action gets it run before its frame's recorded
    work. Each agent's changes to its scratch are kept whether or not it answers.
    Returns None if an agent failed (the task then waits for a person).
    """
    for frame in reversed(runner.snap.stack):
        agent = runner.agent_for(frame)
        scratch = copy.deepcopy(frame.scratch)
        try:
            action = await agent.on_event(runner.view(scratch, frame), event)
            if action is not None:
                action_to_dict(action)
        except Exception as error:  # agent code may raise anything; the event is in the dialog
            await recovery.hand_to_person(runner, f"agent {agent.name!r} failed handling event"
                                          f" {event.id} ({event.type}): {type(error).__name__}:"
                                          f" {error}")
            return None
        frame.scratch = scratch
        if isinstance(action, Replan):
            _replan(runner, frame, event)
            return True
        if action is not None:
            runner.put_first(action, frame, agent)
            return True
    return False


def _replan(runner: Runner, frame: Frame, event: Event) -> None:
    """Forget what the frame had recorded but not started, so its agent plans again."""
    snap = runner.snap
    if frame is snap.frame and snap.call is not None:
        if snap.call.status == "started":
            runner.log_recovery("replan_refused", event.id, f"{snap.call.tool} is in doubt")
            return
        snap.call = None
    dropped = [a["kind"] for a in frame.agenda]
    frame.agenda.clear()
    frame.wait = None
    runner.log_recovery("replan", event.id, f"{event.type}: dropped {dropped or 'nothing'}")


def _too_late(wait: dict[str, Any], event: Event) -> bool:
    """Stored after the wait's due time: its timer ends the wait, whichever is applied first."""
    due = wait.get("due_at")
    return due is not None and event.created_at > due


def end_wait(runner: Runner, outcome: dict[str, Any], frame: Frame | None = None) -> None:
    """Resolve a frame's wait with the event that ended it (or a timeout marker)."""
    frame = frame or runner.snap.frame
    frame.wait = None
    frame.last_event = outcome
    if frame is runner.snap.frame and runner.snap.status is Status.WAITING:
        runner.set_status(Status.RUNNING)


def _history_entry(event: Event) -> dict[str, Any]:
    role = "user" if event.type in ("user_message", "follow_up", "amend", "user_interrupt") \
        else "event"
    return {"role": role, "type": event.type, "event_id": event.id, "content": event.payload}


async def ensure_task(store: Store, task_id: str) -> None:
    """Fail early, naming the task, when an operation targets a task that does not exist."""
    try:
        await store.get_task(task_id)
    except TaskNotFound:
        raise TaskNotFound(f"no task {task_id!r}; check the id with `tether ls`") from None

"""Applying events: the one path by which an event changes a task (R3-R7, R9).

The runner reads the inbox at each tick and hands every pending event here, most urgent
first; what the event means (a lever, a timer, a degraded mode, a message for the agents)
is decided against the :class:`~tether.engine.task.RunningTask` and returned as the
event's disposition. Nothing here commits: the runner does, once the event is applied.
"""

from __future__ import annotations

import copy
from typing import Any

from tether import dialog
from tether.engine import answers, calls, degrade, levers, recovery, timers
from tether.engine.task import RunningTask, clean_up_resources, end_wait, hand_to_person
from tether.errors import StoreUnavailable, TetherError
from tether.model import (
    CallStatus,
    CancelSubtask,
    Event,
    EventStatus,
    Fail,
    Frame,
    Priority,
    Replan,
    Status,
    action_to_dict,
)
from tether.protocol import CONTROL_EVENTS
from tether.store import StoredEvent
from tether.strategies import Strategy
from tether.tools import describe_error, traceback_text


async def apply_event(task: RunningTask, stored: StoredEvent) -> EventStatus | None:
    """Apply one event to the task and say what became of it; None leaves it pending (for a
    person's resume, or a later tick)."""
    event = stored.event
    assert event.id is not None
    snap = task.snap
    if event.type in CONTROL_EVENTS:
        try:
            await _control(task, event)
        except StoreUnavailable:
            raise  # the store is away: the lever stays pending, applied once it is back
        except TetherError as error:
            task.log_recovery(Strategy.lever_failed(event.type), event.id, str(error))
            return EventStatus.FAILED
        except Exception as error:  # a lever's payload or state tether did not foresee
            task.log_recovery(Strategy.lever_failed(event.type), event.id,
                              f"could not be applied: {describe_error(error)}",
                              traceback=traceback_text(error))
            return EventStatus.FAILED  # failed once, recorded; never retried in a loop
        return EventStatus.APPLIED
    if snap.status is Status.NEEDS_HUMAN:
        return None  # stays pending: applied after a person resumes, never dropped (E2)
    if snap.status.is_terminal:
        return EventStatus.IGNORED
    return await _apply(task, stored)


async def _apply(task: RunningTask, stored: StoredEvent) -> EventStatus | None:
    event = stored.event
    if timers.is_wait_timer(event):
        return timers.time_out_wait(task, event)
    if event.type == "task_timeout":
        return timers.miss_deadline(task, event)
    if event.type in degrade.DEGRADE_EVENTS:
        degrade.switch(task, event)
    if stored.priority >= Priority.P3:
        task.snap.signals[event.type] = event.payload
        return EventStatus.APPLIED
    stale = _answers_another_wait(task, event)
    if stale is not None:
        task.log_recovery(Strategy.STALE_ANSWER_IGNORED, event.id, stale)
        return EventStatus.IGNORED
    await _deliver(task, event, stored.priority)
    return EventStatus.APPLIED


def _answers_another_wait(task: RunningTask, event: Event) -> str | None:
    """Why *event* is not applied, when it names the wait it answers (``"wait"`` in its
    payload: the console sends the id of the wait the person was shown) and no frame of the
    task holds that wait for its type now; None when it names none or the wait is held."""
    named = event.payload.get("wait") if isinstance(event.payload, dict) else None
    if named is None:
        return None
    held = [f.wait.get("id") for f in task.snap.stack
            if f.wait and f.wait["event_type"] == event.type]
    if named in held:
        return None
    now = f"it waits for {event.type} as wait {held[-1]!r}" if held \
        else f"it waits for no {event.type}"
    return f"{event.type} answered wait {str(named)[:64]!r}, which the task no longer holds ({now})"


async def _control(task: RunningTask, event: Event) -> None:
    if event.type == "cancel":
        _cancel(task, event)
    elif event.type == "resume":
        await levers.human_resume(task, event)
    elif event.type == "decide":
        await calls.human_decide(task, event)
    else:
        await levers.rollback(task, event)


def _cancel(task: RunningTask, event: Event) -> None:
    if task.snap.status.is_terminal:
        return
    task.append_history(dialog.event("cancel", event.payload, event.id))
    task.snap.call = None
    task.set_status(Status.CANCELLED)
    clean_up_resources(task)


async def _deliver(task: RunningTask, event: Event, priority: int) -> None:
    """Record a P0-P2 event in the dialog, end a matching wait, and ask the agents."""
    snap = task.snap
    assert event.id is not None
    if task.supersedes(event.type):
        _set_aside_for(task, event)
    task.append_history(dialog.event(event.type, event.payload, event.id))
    waiting = next((f for f in reversed(snap.stack)
                    if f.wait and f.wait["event_type"] == event.type
                    and not _too_late(f.wait, event)), None)
    if waiting is not None:
        end_wait(task, event.to_dict(), waiting)
        return
    handled = await _offer(task, event)
    if handled is None:
        return
    if handled:
        if snap.status is Status.WAITING:
            task.set_status(Status.RUNNING)  # run the interjection; the wait stays armed
        return
    if priority == Priority.P0 and snap.status is Status.RUNNING:
        task.set_status(Status.PAUSED)
        task.log_recovery(Strategy.PAUSE, event.id, f"{event.type}: paused, to-do list kept")
    elif priority == Priority.P2:
        recovery.retry_now(task, event)


def _set_aside_for(task: RunningTask, event: Event) -> None:
    """A newer message: the rest of the answer being carried out is not run (its calls are
    answered "not run" in the dialog before the message), so the agent plans with it first."""
    dropped = answers.set_aside(task, event.id)
    if dropped:
        task.log_recovery(Strategy.ANSWER_SET_ASIDE, event.id,
                          f"{event.type} arrived first: not run {', '.join(dropped)}")


async def _offer(task: RunningTask, event: Event) -> bool | None:
    """Offer the event to the top frame's agent, then to each parent's (R9).

    The first agent that answers with an action gets it run before its frame's recorded
    work. Each agent's changes to its scratch are kept whether or not it answers.
    Returns None if an agent failed (the task then waits for a person).
    """
    for frame in reversed(task.snap.stack):
        agent = task.agent_for(frame)
        scratch = copy.deepcopy(frame.scratch)
        view = await task.view(scratch, frame)  # a store error here is not the agent's failure
        try:
            action = await agent.on_event(view, event)
            if action is not None:
                action_to_dict(action)
        except Exception as error:  # agent code may raise anything; the event is in the dialog
            hand_to_person(task, f"agent {agent.name!r} failed handling event {event.id}"
                                 f" ({event.type}): {type(error).__name__}: {error}")
            return None
        frame.scratch = scratch
        if isinstance(action, Replan):
            _replan(task, frame, event)
            return True
        if isinstance(action, CancelSubtask):
            return _cancel_subtasks(task, frame, agent.name, action.reason, event)
        if action is not None:
            task.put_first(action, frame, agent)
            return True
    return False


def _cancel_subtasks(task: RunningTask, frame: Frame, by: str, reason: str,
                     event: Event) -> bool:
    """End every frame above *frame*, top first, as failed with "cancelled: *reason*"; the
    frame that asked then sees ``child_error`` and plans again. Refused (and recorded) while
    a side-effecting call of theirs has an unknown outcome."""
    snap = task.snap
    assert event.id is not None
    above = snap.stack[snap.stack.index(frame) + 1:]
    if not above:
        task.log_recovery(Strategy.CANCEL_SUBTASK_REFUSED, event.id,
                          f"{event.type}: agent {by!r} has no subtask running to cancel")
        return True
    call = snap.call
    if call is not None and call.status == CallStatus.STARTED:
        tool = task.tools.get(call.tool)
        if tool is None or tool.side_effect:
            task.log_recovery(Strategy.CANCEL_SUBTASK_REFUSED, event.id, (
                f"{event.type}: the subtask's call {call.tool} key={call.key} may have"
                " happened; settle it first (decide, or its reconcile hook), then cancel"))
            return True
    snap.call = None
    message = f"cancelled by {by}" + (f": {reason}" if reason else "")
    for _ in above:
        snap.frame.wait = None
        task.pop_frame(Fail(message), {"planned_by": f"{by} (cancel_subtask)"})
    if snap.status is Status.WAITING and snap.frame.wait is None:
        task.set_status(Status.RUNNING)
    task.log_recovery(Strategy.CANCEL_SUBTASK, event.id,
                      f"{event.type}: {len(above)} subtask(s) ended ({message})")
    return True


def _replan(task: RunningTask, frame: Frame, event: Event) -> None:
    """Forget what the frame had recorded but not started, so its agent plans again; the
    calls of an answer it drops are answered "not run"."""
    snap = task.snap
    dropped: list[str] = []
    if frame is snap.frame and snap.call is not None:
        if snap.call.status == CallStatus.STARTED:
            task.log_recovery(Strategy.REPLAN_REFUSED, event.id, f"{snap.call.tool} is in doubt")
            return
        if snap.call.attempt:  # it ran and failed: its own rows say so
            dropped.append(frame.agenda.pop(0).kind)
        snap.call = None
    dropped += answers.set_aside(task, event.id, [frame])
    dropped += [entry.kind for entry in frame.agenda]  # calls put aside by an interjection
    frame.agenda.clear()
    frame.wait = None
    task.log_recovery(Strategy.REPLAN, event.id, f"{event.type}: dropped {dropped or 'nothing'}")


def _too_late(wait: dict[str, Any], event: Event) -> bool:
    """Stored after the wait's due time: its timer ends the wait, whichever is applied first."""
    due = wait.get("due_at")
    return due is not None and event.created_at > due


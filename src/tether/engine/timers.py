"""Durable time: wait timeouts, task deadlines, scheduled starts and back-offs (E6).

Nothing waits in a sleeping coroutine for longer than a short retry. Every due
time is stored with the task (the store's ``wake_at``), so whichever worker is
alive when it falls due claims the task, and a time that passed while no worker
ran is acted on as soon as one starts.

A due time that *means* something to the task fires as a system event of R3
(``timer`` for a wait's timeout, ``task_timeout`` for the task's deadline),
stored in the inbox like any other event and applied by the task's loop. Its
``source_event_id`` is derived from what fired, so a second worker looking at
the same moment, or a worker that crashed right after firing, gets "duplicate"
from the store: each timer fires exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

from tether import dialog
from tether.engine.task import RunningTask, clean_up_resources, end_wait
from tether.errors import InvalidInput
from tether.model import CallStatus, Event, EventStatus, Frame, Snapshot, Status, new_id
from tether.strategies import Strategy

Moment = float | int | timedelta | datetime
"""Seconds from now, a timedelta from now, or a timezone-aware datetime."""

MAX_AHEAD = 10 * 365 * 24 * 3600
"""The furthest ahead a deadline or scheduled start may be: ten years, in seconds."""

DEADLINE_APPLIES = frozenset({Status.RUNNING, Status.WAITING, Status.PAUSED})
"""A deadline stops a task that is working, waiting or paused; not one a person holds."""


def due_time(value: Moment | None, what: str, now: float | None = None) -> float | None:
    """Turn a user's moment into a timestamp, refusing what would be ambiguous or nonsense."""
    if value is None:
        return None
    now = time.time() if now is None else now
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidInput(f"{what}: a datetime needs a timezone (a naive one means a"
                               " different moment on each machine); use datetime.now(UTC) + ...")
        value = max(0.0, value.timestamp() - now)  # a moment already past is due at once
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{what} must be seconds from now, a timedelta or an aware datetime,"
                           f" not {type(value).__name__}")
    if not (isinstance(value, int) or math.isfinite(value)) or not 0 <= value <= MAX_AHEAD:
        raise InvalidInput(f"{what} must be between 0 and {MAX_AHEAD:,} seconds (ten years) from"
                           f" now, got {value!r}")
    return now + float(value)


def wait_timer_id(frame: Frame) -> str:
    """The one source id a wait's timeout fires under (its frame and step make it unique)."""
    wait = frame.wait or {}
    return str(wait.get("timer") or f"timer:{frame.frame_id}:{wait.get('due_at')!r}")


def rearm_waits(snap: Snapshot, now: float, tag: str) -> None:
    """Restart the waits of a snapshot being restored by a rollback or forked, from *now*.

    The rule: a wait that recorded its timeout runs it again in full; an older wait
    without one times out at once. Either way it gets a timer id of its own (see
    :func:`retag_waits`), and every wait a new id: an answer sent about the wait before
    the rollback, or about the fork's source, is not about this one.
    """
    retag_waits(snap, tag)
    for frame in snap.stack:
        wait = frame.wait
        if not wait:
            continue
        wait["id"] = new_id()
        if wait.get("due_at") is None:
            continue
        timeout = wait.get("timeout")
        wait["due_at"] = now + float(timeout) if isinstance(timeout, int | float) else now


def retag_waits(snap: Snapshot, tag: str) -> None:
    """Give every timed wait a timer id not used before, keeping its due time.

    Needed whenever a task goes back to waits whose timers may already have fired (in
    the history a rollback leaves, or ignored while a deadline had failed the task): the
    old id is a duplicate in the inbox and would never fire again, so the task would wait
    forever while workers kept claiming it.
    """
    for frame in snap.stack:
        wait = frame.wait
        if wait and wait.get("due_at") is not None:
            wait["timer"] = f"{wait_timer_id(frame)}:{tag}"


def overdue(snap: Snapshot) -> bool:
    """Whether the top frame's wait has passed its due time (its timer fires instead)."""
    due = (snap.frame.wait or {}).get("due_at") if snap.stack else None
    return due is not None and due <= time.time()


def wake_time(snap: Snapshot) -> float | None:
    """When a parked task must be looked at again though no event arrives."""
    due: list[float] = []
    if snap.status is Status.WAITING and snap.stack and snap.frame.wait:
        wait_due = snap.frame.wait.get("due_at")
        if wait_due is not None:
            due.append(float(wait_due))
    if snap.status is Status.RUNNING:
        retry = snap.call.retry_at if snap.call is not None and snap.call.retry_at \
            else snap.recovery.retry_at
        if retry:
            due.append(retry)
    elif snap.deadline_at is not None and snap.status in DEADLINE_APPLIES:
        due.append(snap.deadline_at)  # a running task's worker keeps its own alarm
    return min(due) if due else None


@contextlib.contextmanager
def deadline_alarm(deadline: float | None, preempt: Callable[[int], None]) -> Iterator[None]:
    """Preempt the model call or interruptible tool in flight when the deadline falls due
    (*preempt* is called with priority 0, as a P0 event would)."""
    if deadline is None:
        yield
        return
    loop = asyncio.get_running_loop()

    def ring() -> None:
        left = deadline - time.time()
        if left > 0:  # the event loop's clock ran ahead of the wall clock the deadline is on
            alarm[0] = loop.call_later(left, ring)
        else:
            preempt(0)

    alarm = [loop.call_later(max(0.0, deadline - time.time()), ring)]
    try:
        yield
    finally:
        alarm[0].cancel()


async def fire_due(task: RunningTask) -> None:
    """Store the system events whose time has come (called on every tick; cheap when none)."""
    snap = task.snap
    now = time.time()
    if snap.deadline_at is not None and snap.deadline_at <= now \
            and snap.status in DEADLINE_APPLIES:
        await task.fire(Event("task_timeout", snap.task_id,
                                  {"deadline_at": snap.deadline_at},
                                  source_event_id=f"deadline:{snap.deadline_at!r}"))
    if snap.status is not Status.WAITING or not snap.frame.wait:
        return
    wait = snap.frame.wait
    due = wait.get("due_at")
    if due is None or due > now:
        return
    in_time = [e for e in await task.reads.pending_events(snap.task_id)
               if e.event.type == wait["event_type"] and e.event.created_at <= due]
    if not in_time:  # an event stored before the due time beats the timeout
        await task.fire(Event("timer", snap.task_id,
                                  {"for": wait["event_type"], "due_at": due,
                                   "timer": wait_timer_id(snap.frame)},
                                  source_event_id=wait_timer_id(snap.frame)))


def is_wait_timer(event: Event) -> bool:
    return event.type == "timer" and isinstance(event.payload, dict) and "timer" in event.payload


def time_out_wait(task: RunningTask, event: Event) -> EventStatus:
    """A wait's timer: end that wait with a timeout marker, unless it already ended."""
    timer = event.payload["timer"]
    frame = next((f for f in reversed(task.snap.stack)
                  if f.wait and wait_timer_id(f) == timer), None)
    if frame is None:
        return EventStatus.IGNORED  # the awaited event came first; this timer is stale
    assert frame.wait is not None
    waited_for = frame.wait["event_type"]
    task.append_history(dialog.event("timer", event.payload, event.id))
    end_wait(task, {"type": waited_for, "timeout": True, "event_id": event.id}, frame)
    task.log_recovery(Strategy.WAIT_TIMEOUT, event.id, f"no {waited_for} before the deadline")
    return EventStatus.APPLIED


def miss_deadline(task: RunningTask, event: Event) -> EventStatus | None:
    """The task's deadline passed: stop it as failed. A person may resume it (without one)."""
    snap = task.snap
    if snap.deadline_at is None or snap.status not in DEADLINE_APPLIES:
        return EventStatus.IGNORED
    if snap.call is not None and snap.call.status == CallStatus.STARTED:
        return None  # a call in doubt is settled first; the timeout stays pending till then
    deadline = local_time(snap.deadline_at)
    task.append_history(dialog.event("task_timeout", event.payload, event.id))
    snap.call = None
    snap.deadline_at = None
    snap.error = f"task deadline {deadline} passed; stopped (resume to carry on without one)"
    task.set_status(Status.FAILED)
    task.log_recovery(Strategy.TASK_TIMEOUT, event.id, snap.error)
    clean_up_resources(task)
    return EventStatus.APPLIED


def local_time(at: float) -> str:
    """A stored due time as people read it (logs, CLI)."""
    return datetime.fromtimestamp(at).astimezone().isoformat(timespec="seconds")

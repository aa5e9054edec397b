"""Durable time against the RunningTask interface, with no store: due times, timers fired as
events exactly once, wait timeouts, task deadlines and the deadline alarm (E6, R3, R4, R14,
R16)."""

from __future__ import annotations

import asyncio
import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from engine_double import TASK, FakeTask, ScriptedAgent, make_snap, open_call, stored

from tether.engine import levers, timers
from tether.engine.events import apply_event
from tether.errors import InvalidInput
from tether.model import CallStatus, Event, EventStatus, Frame, Resource, Snapshot, Status
from tether.resources import ResourceKind, ResourceKinds
from tether.store.base import StoredEvent
from tether.strategies import Strategy

NOW = 1_000_000.0

# --------------------------------------------------------------------------- due times


@pytest.mark.parametrize(("moment", "due"), [
    (None, None),
    (0, NOW),
    (5, NOW + 5),
    (2.5, NOW + 2.5),
    (timedelta(minutes=1), NOW + 60),
    (datetime.fromtimestamp(NOW + 30, UTC), NOW + 30),
    (datetime.fromtimestamp(NOW - 30, UTC), NOW),  # already past: due at once
    (timers.MAX_AHEAD, NOW + timers.MAX_AHEAD),
])
def test_e6_due_time_turns_a_moment_into_a_timestamp(moment: Any, due: float | None) -> None:
    """E6: seconds, a timedelta or an aware datetime become a stored due time."""
    assert timers.due_time(moment, "deadline", now=NOW) == due


@pytest.mark.parametrize("moment", [
    datetime(2030, 1, 1),  # naive: a different moment on each machine
    -1,
    -0.001,
    math.nan,
    math.inf,
    timers.MAX_AHEAD + 1,
    timedelta(seconds=-1),
    timedelta(days=365 * 11),
    datetime.fromtimestamp(NOW + timers.MAX_AHEAD + 60, UTC),
    True,
    "5",
], ids=["naive", "negative", "slightly-negative", "nan", "inf", "over-ten-years",
        "negative-timedelta", "timedelta-over-ten-years", "datetime-over-ten-years", "bool",
        "string"])
def test_e6_due_time_refuses_ambiguous_or_nonsense_moments(moment: Any) -> None:
    """E6, R3: a naive datetime, a negative or non-finite number, more than ten years ahead,
    or something that is not a time at all is refused with InvalidInput naming the field."""
    with pytest.raises(InvalidInput, match="deadline"):
        timers.due_time(moment, "deadline", now=NOW)


def test_e6_due_time_refuses_a_huge_integer_with_invalid_input() -> None:
    """E6, R3: an integer too large for a float (JSON allows it) is refused like any other
    moment over ten years ahead."""
    with pytest.raises(InvalidInput, match="deadline"):
        timers.due_time(10**400, "deadline", now=NOW)


# --------------------------------------------------------------------------- firing


def deadline_task(status: Status, deadline_at: float) -> FakeTask:
    snap = make_snap(status)
    snap.deadline_at = deadline_at
    return FakeTask(snap, agents=[ScriptedAgent()])


@pytest.mark.parametrize("status", [Status.RUNNING, Status.WAITING, Status.PAUSED])
async def test_e6_fire_due_fires_task_timeout_past_the_deadline(status: Status) -> None:
    """E6, R3: a deadline that passed fires one ``task_timeout`` system event, under a source
    id derived from the deadline (so a second worker gets a duplicate)."""
    deadline = time.time() - 1
    task = deadline_task(status, deadline)

    await timers.fire_due(task)

    [event] = task.fired
    assert (event.type, event.task_id, event.payload) == ("task_timeout", TASK,
                                                          {"deadline_at": deadline})
    assert event.source_event_id == f"deadline:{deadline!r}"


@pytest.mark.parametrize(("status", "ahead"), [
    (Status.RUNNING, 3600.0), (Status.NEEDS_HUMAN, -1.0), (Status.COMPLETED, -1.0),
    (Status.FAILED, -1.0)])
async def test_e6_fire_due_leaves_a_deadline_not_due_or_not_applying(
        status: Status, ahead: float) -> None:
    """E6: a deadline still ahead fires nothing; nor does one that passed for a task a person
    holds or a finished task."""
    task = deadline_task(status, time.time() + ahead)

    await timers.fire_due(task)

    assert task.fired == []


def waiting_task(due_at: float | None, timer: str | None = "timer:f0:1",
                 pending: list[StoredEvent] | None = None) -> FakeTask:
    snap = make_snap(Status.WAITING)
    snap.frame.wait = {"event_type": "approval", "due_at": due_at, "timeout": 5}
    if timer is not None:
        snap.frame.wait["timer"] = timer
    task = FakeTask(snap, agents=[ScriptedAgent()])
    task.fake_reads.events = pending or []
    return task


async def test_e6_fire_due_fires_a_waits_timer_under_its_stable_id() -> None:
    """E6: a wait past its due time fires a ``timer`` event whose source id is the wait's own
    timer id, the same every time it is looked at (the store keeps the first only)."""
    due = time.time() - 1
    task = waiting_task(due)

    await timers.fire_due(task)
    await timers.fire_due(task)

    assert [(e.type, e.source_event_id) for e in task.fired] == [("timer", "timer:f0:1")] * 2
    assert task.fired[0].payload == {"for": "approval", "due_at": due, "timer": "timer:f0:1"}


async def test_e6_a_wait_without_a_recorded_timer_id_fires_under_a_derived_one() -> None:
    """E6: an older wait without a timer id gets one from its frame and due time."""
    due = time.time() - 1
    task = waiting_task(due, timer=None)

    await timers.fire_due(task)

    assert [e.source_event_id for e in task.fired] == [f"timer:f0:{due!r}"]


@pytest.mark.parametrize(("event_type", "late", "fires"), [
    ("approval", False, False),  # stored in time: it beats the timeout
    ("approval", True, True),  # stored after the due time: the timeout wins
    ("user_message", False, True),  # not what the wait is for
])
async def test_e6_an_awaited_event_stored_in_time_beats_the_timer(
        event_type: str, late: bool, fires: bool) -> None:
    """E6, R16: an awaited event stored before the due time (still pending) means the timer
    does not fire; one stored after it, or another event, does not stop the timer."""
    due = time.time() - 10
    pending = [stored(event_type, {"ok": True}, created_at=due + (1 if late else -1))]
    task = waiting_task(due, pending=pending)

    await timers.fire_due(task)

    assert [e.type for e in task.fired] == (["timer"] if fires else [])


@pytest.mark.parametrize(("status", "ahead"), [(Status.WAITING, 3600.0),
                                               (Status.RUNNING, -1.0)])
async def test_e6_a_wait_not_due_or_not_in_force_fires_nothing(
        status: Status, ahead: float) -> None:
    """E6: a wait still ahead fires nothing; nor does the armed wait of a task running an
    interjection (it fires once the task waits again)."""
    task = waiting_task(time.time() + ahead)
    task.snap.status = status

    await timers.fire_due(task)

    assert task.fired == []


# --------------------------------------------------------------------------- wait timeouts


async def test_e6_a_waits_timer_ends_the_wait_with_a_timeout_marker() -> None:
    """E6, R3: the timer's event ends its wait: the agent sees a timeout, the task runs on."""
    task = waiting_task(5.0)
    payload = {"for": "approval", "due_at": 5.0, "timer": "timer:f0:1"}

    result = await apply_event(task, stored("timer", payload))

    assert result is EventStatus.APPLIED
    assert task.snap.status is Status.RUNNING and task.snap.frame.wait is None
    assert task.snap.frame.last_event == {"type": "approval", "timeout": True, "event_id": 7}
    assert task.rows == [{"role": "event", "type": "timer", "event_id": 7, "content": payload}]
    assert task.recovery_log == [(Strategy.WAIT_TIMEOUT, 7, "no approval before the deadline")]


@pytest.mark.parametrize("current", ["timer:f0:2", None], ids=["another-wait", "no-wait"])
async def test_e6_a_stale_timer_is_ignored(current: str | None) -> None:
    """E6, R16: a timer for a wait that already ended (the event came first, or a new wait
    was armed since) is ignored and changes nothing."""
    task = waiting_task(5.0, timer=current or "timer:f0:1")
    if current is None:
        task.snap.frame.wait = None
        task.snap.status = Status.RUNNING
    before = task.snap.frame.wait and dict(task.snap.frame.wait)

    result = await apply_event(task, stored("timer", {"for": "approval", "timer": "timer:f0:1"}))

    assert result is EventStatus.IGNORED
    assert task.rows == [] and task.recovery_log == []
    assert task.snap.frame.wait == before


async def test_r9_a_timer_ends_the_wait_of_its_own_frame() -> None:
    """R9, E6: a timer for a parent frame's wait ends that wait only."""
    snap = make_snap(Status.RUNNING)
    snap.frame.wait = {"event_type": "approval", "due_at": 5.0, "timer": "timer:f0:1"}
    snap.stack.append(Frame(agent="main", frame_id="f1"))
    snap.frame.wait = {"event_type": "approval", "due_at": 9.0, "timer": "timer:f1:1"}
    task = FakeTask(snap, agents=[ScriptedAgent()])

    await apply_event(task, stored("timer", {"for": "approval", "timer": "timer:f0:1"}))

    assert snap.stack[0].wait is None and snap.stack[1].wait is not None


# --------------------------------------------------------------------------- deadlines


def timeout_event(deadline: float) -> StoredEvent:
    return stored("task_timeout", {"deadline_at": deadline}, priority=0)


@pytest.mark.parametrize("status", [Status.RUNNING, Status.WAITING, Status.PAUSED])
async def test_e6_a_missed_deadline_fails_the_task_and_cleans_up(status: Status) -> None:
    """E6, R8: the task_timeout event stops the task as failed (a person may resume it without
    a deadline); its open call is dropped and its resources are cleaned up."""
    cleaned: list[str] = []
    kinds = ResourceKinds()
    kinds.register("box", ResourceKind(exists=lambda ref: True, cleanup=cleaned.append))
    task = deadline_task(status, 500.0)
    task.resource_kinds = kinds
    task.snap.resources = [Resource("box", "scratch-dir")]
    open_call(task.snap, status=CallStatus.FAILED)

    result = await apply_event(task, timeout_event(500.0))

    snap = task.snap
    assert result is EventStatus.APPLIED
    assert snap.status is Status.FAILED and snap.deadline_at is None and snap.call is None
    assert snap.error is not None and "deadline" in snap.error and "passed" in snap.error
    assert task.strategies == [Strategy.TASK_TIMEOUT] and cleaned == ["scratch-dir"]
    assert [r["type"] for r in task.rows] == ["task_timeout"]


async def test_e6_r10_a_missed_deadline_waits_while_a_call_is_in_doubt() -> None:
    """E6, R10: while a call's outcome is unknown the timeout stays pending (None): the call
    is settled first."""
    task = deadline_task(Status.RUNNING, 500.0)
    open_call(task.snap, status=CallStatus.STARTED)

    result = await apply_event(task, timeout_event(500.0))

    assert result is None
    assert task.snap.status is Status.RUNNING and task.snap.deadline_at == 500.0
    assert task.rows == [] and task.recovery_log == []


async def test_e6_a_timeout_for_a_task_without_a_deadline_is_ignored() -> None:
    """E6: a task resumed after its deadline carries on without one: a late task_timeout is
    ignored."""
    snap = make_snap(Status.RUNNING)
    task = FakeTask(snap, agents=[ScriptedAgent()])

    result = await apply_event(task, timeout_event(500.0))

    assert result is EventStatus.IGNORED and snap.status is Status.RUNNING


async def test_e6_a_deadline_does_not_stop_a_task_a_person_holds() -> None:
    """E6, R26: a task parked for a person is not failed by its deadline."""
    task = deadline_task(Status.NEEDS_HUMAN, 500.0)

    assert timers.miss_deadline(task, timeout_event(500.0).event) is EventStatus.IGNORED
    assert task.snap.status is Status.NEEDS_HUMAN


async def test_e6_a_wait_resumed_after_the_deadline_failed_the_task_can_still_time_out() -> None:
    """E6, R26: a task whose deadline and wait timeout both passed is failed by the deadline;
    a person resumes it; the wait it goes back to must still be able to time out (exactly
    once per wait, E6), not wait on a timer id already used up."""
    snap = make_snap(Status.WAITING)
    snap.deadline_at = time.time() - 20
    snap.frame.wait = {"event_type": "approval", "due_at": time.time() - 10, "timeout": 5,
                       "timer": "timer:f0:1"}
    task = FakeTask(snap, agents=[ScriptedAgent()])
    await timers.fire_due(task)  # both are due: the deadline (P0) and the wait's timer (P1)
    deadline_fired, timer_fired = task.fired
    consumed: set[str | None] = set()
    for event_id, event in enumerate((deadline_fired, timer_fired), start=1):
        event.id = event_id
        priority = 0 if event.type == "task_timeout" else 1
        if await apply_event(task, StoredEvent(event, priority, "pending", None)) is not None:
            consumed.add(event.source_event_id)  # marked applied or ignored: a duplicate now
    assert snap.status is Status.FAILED

    await levers.human_resume(task, Event("resume", TASK, {"by": "ann"}, id=3))
    if not snap.frame.agenda and snap.frame.wait:
        task.set_status(Status.WAITING)  # what the runner's next step does with an armed wait
    task.fired.clear()
    await timers.fire_due(task)

    assert snap.frame.wait is None or any(e.source_event_id not in consumed
                                          for e in task.fired)


# --------------------------------------------------------------------------- wake times


def wake_snap(status: Status, *, wait_due: float | None = None, deadline: float | None = None,
              call_retry: float | None = None, plan_retry: float | None = None) -> Snapshot:
    snap = make_snap(status)
    if wait_due is not None:
        snap.frame.wait = {"event_type": "approval", "due_at": wait_due}
    if call_retry is not None:
        open_call(snap, status=CallStatus.FAILED).retry_at = call_retry
    snap.recovery.retry_at = plan_retry
    snap.deadline_at = deadline
    return snap


@pytest.mark.parametrize(("snap", "wake"), [
    (wake_snap(Status.WAITING, wait_due=50.0), 50.0),
    (wake_snap(Status.WAITING, wait_due=50.0, deadline=40.0), 40.0),
    (wake_snap(Status.WAITING, wait_due=50.0, deadline=60.0), 50.0),
    (wake_snap(Status.WAITING), None),
    (wake_snap(Status.RUNNING, call_retry=30.0, plan_retry=20.0), 30.0),
    (wake_snap(Status.RUNNING, plan_retry=20.0), 20.0),
    (wake_snap(Status.RUNNING, deadline=40.0), None),  # its worker keeps its own alarm
    (wake_snap(Status.PAUSED, deadline=40.0), 40.0),
    (wake_snap(Status.NEEDS_HUMAN, deadline=40.0), None),
    (wake_snap(Status.COMPLETED, deadline=40.0), None),
], ids=["wait", "deadline-first", "wait-first", "wait-without-timeout", "call-retry",
        "plan-retry", "running-deadline", "paused-deadline", "needs-human", "completed"])
def test_e6_e7_wake_time_is_the_earliest_due_time_that_applies(
        snap: Snapshot, wake: float | None) -> None:
    """E6, E7: a parked task is looked at again at its earliest due time (a wait's timeout,
    a back-off, a deadline), and never when nothing can fall due."""
    assert timers.wake_time(snap) == wake


def test_e6_overdue_says_whether_the_wait_has_passed_its_due_time() -> None:
    """E6, R16: an overdue wait is left to its timer instead of asking the agent."""
    snap = make_snap(Status.WAITING)
    assert not timers.overdue(snap)
    snap.frame.wait = {"event_type": "approval", "due_at": None}
    assert not timers.overdue(snap)
    snap.frame.wait["due_at"] = time.time() + 3600
    assert not timers.overdue(snap)
    snap.frame.wait["due_at"] = time.time() - 1
    assert timers.overdue(snap)


def test_e6_r14_rearm_waits_restarts_timed_waits_under_new_timer_ids() -> None:
    """E6, R14: a restored wait runs its timeout again in full from now (an older one without
    a recorded timeout is due at once), each under a timer id of its own; a wait without a
    due time is left alone."""
    snap = make_snap(Status.WAITING)
    snap.stack = [
        Frame(agent="main", frame_id="a", wait={"event_type": "x", "due_at": 1.0,
                                                "timeout": 30, "timer": "timer:a:3"}),
        Frame(agent="main", frame_id="b", wait={"event_type": "y", "due_at": 2.0}),
        Frame(agent="main", frame_id="c", wait={"event_type": "z", "due_at": None}),
    ]

    timers.rearm_waits(snap, NOW, "r4")

    a, b, c = (frame.wait for frame in snap.stack)
    ids = [wait.pop("id") for wait in (a, b, c)]  # each restored wait is a new one (R26)
    assert len(set(ids)) == 3 and all(isinstance(i, str) and i for i in ids)
    assert a == {"event_type": "x", "due_at": NOW + 30, "timeout": 30, "timer": "timer:a:3:r4"}
    assert b == {"event_type": "y", "due_at": NOW, "timer": "timer:b:2.0:r4"}
    assert c == {"event_type": "z", "due_at": None}


# --------------------------------------------------------------------------- the alarm


async def test_e1_e6_the_deadline_alarm_preempts_work_in_flight() -> None:
    """E1, E6: a deadline falling due while a model call or interruptible tool runs preempts
    it as a P0 would (priority 0)."""
    called = asyncio.Event()
    priorities: list[int] = []

    def preempt(priority: int) -> None:
        priorities.append(priority)
        called.set()

    with timers.deadline_alarm(time.time() - 1, preempt):  # already due: fires at once
        await asyncio.wait_for(called.wait(), timeout=10)

    assert priorities == [0]


@pytest.mark.parametrize("deadline", [None, "past", "future"])
async def test_e6_the_deadline_alarm_is_disarmed_when_the_work_ends(deadline: str | None) -> None:
    """E6: no deadline arms nothing, and leaving the block disarms the alarm (a due one that
    has not run yet included): nothing is preempted afterwards."""
    priorities: list[int] = []
    at = {None: None, "past": time.time() - 1, "future": time.time() + 3600}[deadline]

    with timers.deadline_alarm(at, priorities.append):
        pass
    for _ in range(5):
        await asyncio.sleep(0)

    assert priorities == []

"""Applying events against the RunningTask interface, with no store: priorities, waits, the
agents' say, levers and their failures (R3-R5, R9, R14-R16, R21, R26, E2)."""

from __future__ import annotations

from typing import Any

import pytest
from engine_double import (
    FakeTask,
    ScriptedAgent,
    make_snap,
    make_tool,
    open_call,
    stored,
)

from tether.engine.events import apply_event
from tether.errors import StoreUnavailable
from tether.model import (
    CallStatus,
    CancelSubtask,
    EventStatus,
    Frame,
    Replan,
    Reply,
    Resource,
    Status,
)
from tether.resources import ResourceKind, ResourceKinds
from tether.strategies import Strategy

APPROVAL = {"event_type": "approval", "due_at": None, "timeout": None}


def running(agent: ScriptedAgent | None = None, status: Status = Status.RUNNING,
            **kwargs: Any) -> FakeTask:
    """A task with two replies on its to-do list."""
    snap = make_snap(status, agenda=[Reply("a"), Reply("b")])
    return FakeTask(snap, agents=[agent or ScriptedAgent()], **kwargs)


def waiting(agent: ScriptedAgent | None = None, due_at: float | None = None) -> FakeTask:
    snap = make_snap(Status.WAITING)
    snap.frame.wait = {**APPROVAL, "due_at": due_at}
    return FakeTask(snap, agents=[agent or ScriptedAgent()])


# --------------------------------------------------------------------------- priorities


@pytest.mark.parametrize("priority", [3, 4])
async def test_r4_p3_and_p4_only_update_the_signals(priority: int) -> None:
    """R4: P3/P4 events record their newest payload in the task's signals and never disturb
    the flow: no dialog row, no agent asked, no status change."""
    agent = ScriptedAgent(raises=AssertionError("a P3/P4 event must not reach the agent"))
    task = running(agent)

    first = await apply_event(task, stored("progress", {"pct": 10}, priority=priority))
    second = await apply_event(task, stored("progress", {"pct": 50}, priority=priority,
                                            event_id=8))

    assert (first, second) == (EventStatus.APPLIED, EventStatus.APPLIED)
    assert task.snap.signals == {"progress": {"pct": 50}}
    assert task.rows == [] and agent.events == [] and task.recovery_log == []
    assert task.snap.status is Status.RUNNING and len(task.snap.frame.agenda) == 2


@pytest.mark.parametrize(("status", "after"), [(Status.RUNNING, Status.PAUSED),
                                               (Status.PAUSED, Status.PAUSED)])
async def test_r4_r15_an_unhandled_p0_pauses_a_running_task_keeping_its_to_do_list(
        status: Status, after: Status) -> None:
    """R4, R15: a P0 no agent handles pauses a running task; the to-do list is kept and the
    person's words are in the dialog."""
    task = running(status=status)

    result = await apply_event(task, stored("user_interrupt", "stop!", priority=0))

    assert result is EventStatus.APPLIED
    assert task.snap.status is after
    assert [e.action["text"] for e in task.snap.frame.agenda] == ["a", "b"]
    assert task.rows == [{"role": "user", "type": "user_interrupt", "event_id": 7,
                          "content": "stop!"}]
    if status is Status.RUNNING:
        assert task.strategies == [Strategy.PAUSE] and task.recovery_log[0][1] == 7
    else:
        assert task.recovery_log == []


async def test_r4_an_unhandled_p1_changes_nothing_but_the_dialog() -> None:
    """R4: a P1 event no agent handles, and that is not a newer message (a webhook), is
    recorded in the dialog; the task goes on with its to-do list."""
    agent = ScriptedAgent()
    task = running(agent)

    result = await apply_event(task, stored("webhook", "fyi", priority=1))

    assert result is EventStatus.APPLIED
    assert task.snap.status is Status.RUNNING and len(task.snap.frame.agenda) == 2
    assert [e.type for e in agent.events] == ["webhook"]
    assert len(task.rows) == 1 and task.recovery_log == []


async def test_r15_an_unhandled_p2_brings_a_pending_retry_forward() -> None:
    """R4, R15: a P2 signal (a retry) no agent handles makes the backed-off call due now."""
    task = running()
    call = open_call(task.snap, status=CallStatus.FAILED)
    call.retry_at = 4e9  # far in the future

    result = await apply_event(task, stored("retry", None, priority=2))

    assert result is EventStatus.APPLIED
    assert call.retry_at < 4e9 and task.strategies == [Strategy.RETRY_NOW]


async def test_r3_a_degrade_event_switches_the_task_and_is_delivered() -> None:
    """R3: a degrade event puts the task in its fallback (recorded), then is delivered like
    any other event; a recover event ends the degradation."""
    agent = ScriptedAgent()
    task = running(agent)

    await apply_event(task, stored("degrade", {"reason": "model down"}, priority=2))
    assert task.snap.degraded == {"reason": "model down", "event_id": 7}
    assert [e.type for e in agent.events] == ["degrade"]

    await apply_event(task, stored("recover", None, priority=2, event_id=8))
    assert task.snap.degraded is None
    assert task.strategies == [Strategy.DEGRADE, Strategy.RECOVER]


# --------------------------------------------------------------------------- waits


async def test_r16_the_awaited_event_ends_the_wait() -> None:
    """R16, R3: the event a frame waits for ends the wait and the task runs on; the agent's
    on_event is not asked (the wait takes it)."""
    agent = ScriptedAgent(raises=AssertionError("the wait takes the event"))
    task = waiting(agent)
    event = stored("approval", {"ok": True})

    result = await apply_event(task, event)

    assert result is EventStatus.APPLIED
    assert task.snap.status is Status.RUNNING and task.snap.frame.wait is None
    assert task.snap.frame.last_event == event.event.to_dict()
    assert task.rows == [{"role": "event", "type": "approval", "event_id": 7,
                          "content": {"ok": True}}]
    assert agent.events == []


async def test_r16_another_event_does_not_end_the_wait() -> None:
    """R16: an event of another type leaves the wait armed."""
    task = waiting()

    await apply_event(task, stored("user_message", "hello"))

    assert task.snap.status is Status.WAITING and task.snap.frame.wait is not None


async def test_e6_an_event_stored_after_the_due_time_does_not_end_the_wait() -> None:
    """E6, R16: an event stored after the wait's due time is too late: the timer ends that
    wait, whichever is applied first."""
    task = waiting(due_at=1000.0)

    await apply_event(task, stored("approval", {"ok": True}, created_at=1000.5))

    assert task.snap.status is Status.WAITING and task.snap.frame.wait is not None


async def test_e6_an_event_stored_before_the_due_time_ends_the_wait() -> None:
    """E6, R16: stored in time, the awaited event ends the wait even if applied later."""
    task = waiting(due_at=1000.0)

    await apply_event(task, stored("approval", {"ok": True}, created_at=999.5))

    assert task.snap.status is Status.RUNNING and task.snap.frame.wait is None


async def test_r9_an_event_ends_the_wait_of_the_frame_waiting_for_it() -> None:
    """R9, R16: a parent frame's wait is ended by its event; the top frame is not touched."""
    snap = make_snap(Status.RUNNING)
    snap.frame.wait = dict(APPROVAL)
    snap.stack.append(Frame(agent="main", frame_id="f1"))
    task = FakeTask(snap, agents=[ScriptedAgent()])

    await apply_event(task, stored("approval", {"ok": True}))

    assert snap.stack[0].wait is None and snap.stack[0].last_event is not None
    assert snap.stack[1].last_event is None and snap.status is Status.RUNNING


# --------------------------------------------------------------------------- the agents' say


async def test_r9_r15_a_handled_event_runs_first_and_keeps_the_to_do_list() -> None:
    """R9, R15: an action from on_event runs before the frame's recorded work, which is kept."""
    agent = ScriptedAgent(answer=Reply("on it"))
    task = running(agent)

    result = await apply_event(task, stored("user_interrupt", "quick question", priority=0))

    assert result is EventStatus.APPLIED and task.snap.status is Status.RUNNING
    assert [e.action["text"] for e in task.snap.frame.agenda] == ["on it", "a", "b"]
    assert task.snap.frame.agenda[0].planned_by == "main@1"
    assert Strategy.PAUSE not in task.strategies


async def test_r16_an_interjection_wakes_a_waiting_task_and_keeps_its_wait() -> None:
    """R16, R15: a handled event runs the interjection; the wait stays armed for after."""
    task = waiting(ScriptedAgent(answer=Reply("noted")))

    await apply_event(task, stored("user_message", "any news?"))

    assert task.snap.status is Status.RUNNING and task.snap.frame.wait == APPROVAL
    assert [e.kind for e in task.snap.frame.agenda] == ["reply"]


async def test_r9_an_event_is_offered_to_parent_frames_and_scratch_kept() -> None:
    """R9: the top frame's agent is asked first, then each parent's; the first action goes to
    its own frame, and every agent's scratch changes are kept."""
    child = ScriptedAgent("worker", answer=None, scratch={"seen": 1})
    parent = ScriptedAgent("boss", answer=Reply("boss says"), scratch={"told": True})
    snap = make_snap(agent="boss")
    snap.stack.append(Frame(agent="worker", frame_id="f1", agenda=[]))
    task = FakeTask(snap, agents=[child, parent])

    await apply_event(task, stored("user_message", "change of plan"))

    assert [len(child.events), len(parent.events)] == [1, 1]
    assert [e.kind for e in snap.stack[0].agenda] == ["reply"] and snap.stack[1].agenda == []
    assert snap.stack[0].scratch == {"told": True} and snap.stack[1].scratch == {"seen": 1}


@pytest.mark.parametrize("agent_options", [{"raises": ValueError("bad prompt")},
                                           {"answer": "not an action"}],
                         ids=["raises", "non-action"])
async def test_r26_an_agent_failing_on_an_event_hands_the_task_to_a_person(
        agent_options: dict[str, Any]) -> None:
    """R26, R17: agent code raising in on_event (or answering with something that is not an
    action) parks the task for a person; the event is kept in the dialog."""
    task = running(ScriptedAgent(**agent_options))

    result = await apply_event(task, stored("webhook", "hi"))

    assert result is EventStatus.APPLIED
    assert task.snap.status is Status.NEEDS_HUMAN and task.commit_requested
    assert task.snap.error is not None and "'main'" in task.snap.error
    assert "event 7" in task.snap.error
    assert [r["type"] for r in task.rows] == ["webhook"]
    assert [e.kind for e in task.snap.frame.agenda] == ["reply", "reply"]


async def test_r3_replan_drops_the_recorded_work_and_the_wait() -> None:
    """R3, R15: Replan from on_event forgets the frame's unstarted work (a planned call too)
    and its wait, so the agent plans again with the amended instruction."""
    snap = make_snap(Status.WAITING, agenda=[Reply("b")])
    call = open_call(snap, status=CallStatus.PLANNED)
    snap.frame.wait = dict(APPROVAL)
    task = FakeTask(snap, agents=[ScriptedAgent(answer=Replan())], tools=[make_tool()])

    await apply_event(task, stored("webhook", "different account"))

    assert snap.frame.agenda == [] and snap.frame.wait is None and snap.call is None
    assert task.recovery_log == [(Strategy.REPLAN, 7, "webhook: dropped ['tool_call', 'reply']")]
    assert call.status is CallStatus.PLANNED


async def test_r10_replan_is_refused_while_a_call_is_in_doubt() -> None:
    """R10: a call whose outcome is unknown is not forgotten by a Replan."""
    snap = make_snap(agenda=[Reply("b")])
    call = open_call(snap, status=CallStatus.STARTED)
    task = FakeTask(snap, agents=[ScriptedAgent(answer=Replan())], tools=[make_tool()])

    await apply_event(task, stored("webhook", "different account"))

    assert snap.call is call and [e.kind for e in snap.frame.agenda] == ["tool_call", "reply"]
    assert task.strategies == [Strategy.REPLAN_REFUSED]


# --------------------------------------------------------------------------- parked and ended


@pytest.mark.parametrize(("event_type", "priority"), [("user_message", 1), ("progress", 3),
                                                      ("user_interrupt", 0)])
async def test_e2_r26_a_task_a_person_holds_keeps_its_events_pending(
        event_type: str, priority: int) -> None:
    """E2, R26: a non-lever event for a needs_human task stays pending (None), applied after
    a person resumes it, never dropped."""
    agent = ScriptedAgent()
    task = running(agent, status=Status.NEEDS_HUMAN)

    result = await apply_event(task, stored(event_type, "x", priority=priority))

    assert result is None
    assert task.rows == [] and agent.events == [] and task.snap.signals == {}
    assert task.snap.status is Status.NEEDS_HUMAN


@pytest.mark.parametrize("status", [Status.COMPLETED, Status.FAILED, Status.CANCELLED])
async def test_r11_a_finished_task_ignores_events(status: Status) -> None:
    """R11: an event for a finished task is marked ignored and changes nothing."""
    agent = ScriptedAgent()
    task = running(agent, status=status)

    result = await apply_event(task, stored("user_interrupt", "x", priority=0))

    assert result is EventStatus.IGNORED
    assert task.rows == [] and agent.events == [] and task.snap.status is status


# --------------------------------------------------------------------------- levers


def cleanup_kinds(cleaned: list[str], fail_on: str | None = None) -> ResourceKinds:
    def cleanup(ref: str) -> None:
        if ref == fail_on:
            raise OSError(f"cannot remove {ref}")
        cleaned.append(ref)

    kinds = ResourceKinds()
    kinds.register("box", ResourceKind(exists=lambda ref: True, cleanup=cleanup))
    return kinds


@pytest.mark.parametrize("status", [Status.RUNNING, Status.WAITING, Status.NEEDS_HUMAN,
                                    Status.PAUSED])
async def test_r3_r8_cancel_ends_the_task_and_cleans_its_resources(status: Status) -> None:
    """R3, R8: cancel ends the task (even one a person holds), drops the open call and
    applies each resource's cleanup policy for a task that did not succeed."""
    cleaned: list[str] = []
    task = running(status=status, resource_kinds=cleanup_kinds(cleaned))
    open_call(task.snap, status=CallStatus.FAILED)
    task.snap.resources = [Resource("box", "a", "on_finish"), Resource("box", "b", "on_success"),
                           Resource("box", "c", "keep")]

    result = await apply_event(task, stored("cancel", {"by": "ann"}, priority=0))

    assert result is EventStatus.APPLIED
    assert task.snap.status is Status.CANCELLED and task.snap.call is None
    assert cleaned == ["a"]
    assert task.rows == [{"role": "event", "type": "cancel", "event_id": 7, "content": {"by": "ann"}}]


async def test_r8_a_failing_cleanup_is_recorded_and_the_cancel_still_holds() -> None:
    """R8, R23: a resource that cannot be cleaned up is recorded; the others still are."""
    cleaned: list[str] = []
    task = running(resource_kinds=cleanup_kinds(cleaned, fail_on="a"))
    task.snap.resources = [Resource("box", "a"), Resource("box", "b")]

    await apply_event(task, stored("cancel", None, priority=0))

    assert task.snap.status is Status.CANCELLED and cleaned == ["b"]
    assert task.strategies == [Strategy.CLEANUP_FAILED]
    assert "cannot remove a" in task.recovery_log[0][2]


@pytest.mark.parametrize("status", [Status.COMPLETED, Status.CANCELLED])
async def test_r21_cancelling_a_finished_task_changes_nothing(status: Status) -> None:
    """R21, R11: a cancel for a task that already ended is applied as a no-op."""
    cleaned: list[str] = []
    task = running(status=status, resource_kinds=cleanup_kinds(cleaned))
    task.snap.resources = [Resource("box", "a")]

    result = await apply_event(task, stored("cancel", None, priority=0))

    assert result is EventStatus.APPLIED
    assert task.snap.status is status and task.rows == [] and cleaned == []


async def test_r26_a_resume_lever_applies_to_a_task_a_person_holds() -> None:
    """R26: levers are applied while the task is parked for a person (other events wait)."""
    task = running(status=Status.NEEDS_HUMAN)

    result = await apply_event(task, stored("resume", {"by": "ann"}, priority=0))

    assert result is EventStatus.APPLIED and task.snap.status is Status.RUNNING
    assert task.strategies == [Strategy.HUMAN_RESUME]


@pytest.mark.parametrize(("lever", "payload", "in_doubt", "strategy"), [
    ("resume", {"by": "ann"}, True, Strategy.RESUME_FAILED),
    ("decide", {"outcome": "maybe"}, True, Strategy.DECIDE_FAILED),
    ("rollback", {"version": 3}, False, Strategy.ROLLBACK_FAILED),
    ("rollback", {"version": "three"}, False, Strategy.ROLLBACK_FAILED),
], ids=["resume-in-doubt", "decide-bad-outcome", "rollback-pruned", "rollback-bad-version"])
async def test_r26_a_lever_that_cannot_be_applied_is_recorded_as_failed(
        lever: str, payload: dict[str, Any], in_doubt: bool, strategy: Strategy) -> None:
    """R26, R23: a lever refused (a call in doubt, a bad decision, a version not kept) is
    recorded as ``<lever>_failed`` with the reason, and the event is marked failed."""
    if in_doubt:
        task = running(status=Status.NEEDS_HUMAN, tools=[make_tool(side_effect=True)])
        payload = {**payload, "key": open_call(task.snap).key}
    else:
        task = running()
    before = task.snap.status

    result = await apply_event(task, stored(lever, payload, priority=0))

    assert result is EventStatus.FAILED
    assert [(s, e) for s, e, _ in task.recovery_log] == [(strategy, 7)]
    assert task.recovery_log[0][2] != ""
    assert task.snap.status is before and task.replaced == []


async def test_r19_a_lever_stays_pending_while_the_store_is_away() -> None:
    """R19, R13: a lever that cannot read the store is not marked failed: the error goes up,
    so the event stays pending and is applied once the store is back."""
    task = running()
    task.fake_reads.fail_with = StoreUnavailable("database restarting")

    with pytest.raises(StoreUnavailable):
        await apply_event(task, stored("rollback", {"version": 3}, priority=0))

    assert task.recovery_log == [] and task.snap.status is Status.RUNNING



# --------------------------------------------------------------------------- subtasks


def with_subtask(parent: ScriptedAgent, child: ScriptedAgent) -> FakeTask:
    """A parent frame with a child frame above it, the child waiting for an approval."""
    snap = make_snap(Status.WAITING, agent=parent.name)
    snap.stack.append(Frame(agent=child.name, frame_id="f0.1", wait=dict(APPROVAL)))
    return FakeTask(snap, agents=[parent, child], tools=[make_tool("pay", side_effect=True)])


async def test_r09_a_parent_cancels_its_waiting_subtask_and_sees_it_as_child_error() -> None:
    """R9: the child's wait ends, the child is popped as failed, and the parent (which
    answered the event) gets child_error and runs on."""
    parent = ScriptedAgent("boss", CancelSubtask("the user gave up"))
    task = with_subtask(parent, ScriptedAgent("helper"))

    outcome = await apply_event(task, stored("abort", None, priority=1))

    assert outcome is EventStatus.APPLIED
    assert [f.agent for f in task.snap.stack] == ["boss"]
    assert task.snap.frame.child_error == "cancelled by boss: the user gave up"
    assert task.snap.status is Status.RUNNING
    assert Strategy.CANCEL_SUBTASK in task.strategies
    assert [r.get("event") for r in task.rows] == [None, "fail"]  # the event, then the pop


async def test_r09_a_subtask_whose_side_effect_may_have_happened_is_not_cancelled() -> None:
    """R9, R10: a side-effecting call in doubt is never dropped; the cancel is refused and
    recorded, and the subtask stays as it was."""
    parent = ScriptedAgent("boss", CancelSubtask())
    task = with_subtask(parent, ScriptedAgent("helper"))
    task.snap.frame.wait = None
    task.snap.status = Status.RUNNING
    call = open_call(task.snap, "pay", status=CallStatus.STARTED)

    await apply_event(task, stored("abort", None, priority=1))

    assert [f.agent for f in task.snap.stack] == ["boss", "helper"]
    assert task.snap.call is call
    assert task.strategies == [Strategy.CANCEL_SUBTASK_REFUSED]
    assert "settle it first" in task.recovery_log[0][2]


async def test_r09_cancel_subtask_without_a_subtask_is_refused_by_name() -> None:
    task = running(ScriptedAgent("main", CancelSubtask()))
    await apply_event(task, stored("abort", None, priority=1))
    assert task.strategies == [Strategy.CANCEL_SUBTASK_REFUSED]
    assert "no subtask" in task.recovery_log[0][2]

"""R3/R4/R17 (issue 27): an answer is the engine's. The actions of one plan wait on the
frame's agenda; a newer message (a P1 ``user_message``/``follow_up``/``amend``, a
``Replan``, a person's resume with a message) sets aside every one not started: each call is
answered "not run" in the dialog, before the message, and the agent plans again. A call
already open keeps its place; a P3 or a non-message P1 leaves the answer alone; the
protocol decides which event types supersede."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from engine_double import TASK, FakeTask, ScriptedAgent, make_snap, open_call, stored

from tether.engine import answers
from tether.engine.events import apply_event
from tether.errors import InvalidInput
from tether.model import (
    SNAPSHOT_FORMAT,
    AgendaEntry,
    CallStatus,
    CancelSubtask,
    EventStatus,
    Finish,
    Replan,
    Reply,
    Snapshot,
    Status,
    ToolCall,
    Wait,
    action_to_dict,
)
from tether.protocol import InterruptionProtocol, Rule
from tether.strategies import Strategy


def answer_running(*, lookup_open: bool = True) -> FakeTask:
    """A model answered ``lookup`` then ``refund``; the lookup is the open call."""
    snap = make_snap(Status.RUNNING, agenda=[ToolCall("refund", {"order": "A1", "cents": 5})])
    if lookup_open:
        open_call(snap, "lookup", {"order": "A1"}, status=CallStatus.PLANNED, attempt=0)
    return FakeTask(snap, agents=[ScriptedAgent()])


def not_run_rows(task: FakeTask) -> list[tuple[str, Any]]:
    return [("call" if "tool_call" in row else "result",
             row["tool_call"]["name"] if "tool_call" in row else row.get("error"))
            for row in task.rows if row.get("not_run")]


@pytest.mark.parametrize("event_type", ["user_message", "follow_up", "amend"])
async def test_a_newer_message_sets_aside_the_calls_not_started(event_type: str) -> None:
    task = answer_running()

    result = await apply_event(task, stored(event_type, "STOP: do NOT refund A1"))

    assert result is EventStatus.APPLIED
    assert [e.action["name"] for e in task.snap.frame.agenda] == ["lookup"]  # open: kept
    assert task.snap.call is not None and task.snap.call.tool == "lookup"
    assert not_run_rows(task) == [("call", "refund"), ("result", answers.NOT_RUN)]
    assert task.rows[-1]["type"] == event_type  # the answers first, then the message
    call_row, result_row = task.rows[0], task.rows[1]
    assert call_row["tool_call"]["key"] == result_row["key"] == "not-run:7:0"
    assert call_row["tool_call"]["args"] == {"order": "A1", "cents": 5}
    assert task.strategies == [Strategy.ANSWER_SET_ASIDE]


async def test_with_nothing_open_the_whole_answer_is_set_aside_and_the_agent_plans_again() -> None:
    snap = make_snap(Status.RUNNING, agenda=[Reply("Let me refund that."),
                                             ToolCall("lookup", {"order": "A1"}),
                                             ToolCall("refund", {"order": "A1"})])
    task = FakeTask(snap, agents=[ScriptedAgent()])

    await apply_event(task, stored("user_message", "stop"))

    assert task.snap.frame.agenda == []
    assert task.rows[0] == {"role": "assistant", "content": "Let me refund that."}
    assert [r[1] for r in not_run_rows(task)] == ["lookup", answers.NOT_RUN, "refund",
                                                  answers.NOT_RUN]
    keys = {row["key"] for row in task.rows if row.get("role") == "tool"}
    assert keys == {"not-run:7:1", "not-run:7:2"}  # one answer each, no two alike


@pytest.mark.parametrize(("event_type", "priority"), [("webhook", 1), ("progress", 3),
                                                      ("heartbeat", 4)])
async def test_other_events_leave_the_answer_alone(event_type: str, priority: int) -> None:
    task = answer_running()

    await apply_event(task, stored(event_type, {"x": 1}, priority=priority))

    assert [e.action["name"] for e in task.snap.frame.agenda] == ["lookup", "refund"]
    assert not_run_rows(task) == []


async def test_the_protocol_decides_which_events_supersede() -> None:
    task = answer_running()
    task.protocol = InterruptionProtocol({"user_message": Rule(1), "webhook": Rule(1, None, True)})

    await apply_event(task, stored("user_message", "fyi"))
    assert [e.action["name"] for e in task.snap.frame.agenda] == ["lookup", "refund"]
    await apply_event(task, stored("webhook", {"stop": True}, event_id=8))
    assert [e.action["name"] for e in task.snap.frame.agenda] == ["lookup"]
    assert task.protocol.supersedes("webhook") and not task.protocol.supersedes("user_message")
    assert InterruptionProtocol({"amend": 1}).supersedes("amend")  # a bare priority keeps it


async def test_a_call_put_aside_by_an_interjection_keeps_its_key() -> None:
    task = answer_running()
    put_aside = task.snap.frame.agenda[0]
    put_aside.open_call, task.snap.call = task.snap.call, None
    task.snap.frame.agenda.insert(0, AgendaEntry(action_to_dict(ToolCall("notify", {}))))

    await apply_event(task, stored("user_message", "stop"))

    assert [e.action["name"] for e in task.snap.frame.agenda] == ["lookup"]
    assert task.snap.frame.agenda[0].open_call is not None
    assert [r[1] for r in not_run_rows(task) if r[0] == "call"] == ["notify", "refund"]


async def test_an_approval_wait_of_the_answer_ends_with_its_calls() -> None:
    """The wait an answer armed before a call (PydanticAI's approval) is moot once that call
    is set aside: the task runs again and its agent plans with the message."""
    snap = make_snap(Status.WAITING, agenda=[ToolCall("refund", {"order": "A1"})])
    snap.frame.wait = {"event_type": "approval", "due_at": None, "timeout": None}
    task = FakeTask(snap, agents=[ScriptedAgent()])

    await apply_event(task, stored("user_message", "never mind"))

    assert task.snap.frame.wait is None and task.snap.status is Status.RUNNING
    assert task.snap.frame.agenda == []


async def test_a_wait_of_its_own_stays_armed() -> None:
    snap = make_snap(Status.WAITING)
    snap.frame.wait = {"event_type": "approval", "due_at": None, "timeout": None}
    task = FakeTask(snap, agents=[ScriptedAgent()])

    await apply_event(task, stored("user_message", "any news?"))

    assert task.snap.frame.wait is not None and task.snap.status is Status.WAITING


async def test_a_replan_answers_the_calls_it_drops() -> None:
    snap = make_snap(Status.RUNNING, agenda=[ToolCall("lookup", {}), ToolCall("refund", {})])
    task = FakeTask(snap, agents=[ScriptedAgent(answer=Replan())])

    await apply_event(task, stored("webhook", "plans changed"))

    assert task.snap.frame.agenda == []
    assert [r[1] for r in not_run_rows(task) if r[0] == "call"] == ["lookup", "refund"]
    assert Strategy.REPLAN in task.strategies


async def test_a_resume_with_a_message_sets_the_answer_aside_first() -> None:
    snap = make_snap(Status.PAUSED, agenda=[ToolCall("refund", {"order": "A1"})])
    task = FakeTask(snap, agents=[ScriptedAgent()])

    await apply_event(task, stored("resume", {"message": "do not refund", "by": "ann"},
                                   priority=0))

    assert task.snap.status is Status.RUNNING and task.snap.frame.agenda == []
    assert [r[1] for r in not_run_rows(task)] == ["refund", answers.NOT_RUN]
    assert task.rows[2]["content"] == "do not refund"


async def test_a_plain_resume_keeps_the_answer() -> None:
    snap = make_snap(Status.PAUSED, agenda=[ToolCall("refund", {"order": "A1"})])
    task = FakeTask(snap, agents=[ScriptedAgent()])

    await apply_event(task, stored("resume", {"by": "ann"}, priority=0))

    assert [e.action["name"] for e in task.snap.frame.agenda] == ["refund"]


@pytest.mark.parametrize("answer", [[], (), None, "refund", [Finish(1), "x"],
                                    [Replan()], [CancelSubtask()]])
def test_a_plan_must_return_actions(answer: Any) -> None:
    with pytest.raises(InvalidInput, match="agent 'bot': plan"):
        answers.planned_actions("bot", answer)


def test_one_answer_holds_at_most_so_many_actions() -> None:
    assert len(answers.planned_actions("bot", [Wait("x")] * answers.MAX_ACTIONS)) == 100
    with pytest.raises(InvalidInput, match="101 actions"):
        answers.planned_actions("bot", [Wait("x")] * (answers.MAX_ACTIONS + 1))
    assert answers.planned_actions("bot", (Finish(1),)) == [Finish(1)]


# ---------------------------------------------------------------------- snapshot format 10


def test_a_format_9_head_moves_the_rest_of_an_answer_from_scratch_to_the_agenda() -> None:
    """E8 (issue 27): a model agent of format 9 kept the rest of an answer in its scratch
    (``queued``); the upgrade puts it on the agenda after the agenda's own actions, planned
    by the same code, so it runs as before and a newer message can set it aside. A
    ``queued`` that is not a list of actions is some agent's own and stays."""
    snap = make_snap(Status.RUNNING, agenda=[ToolCall("lookup", {"order": "A1"})])
    snap.frame.agenda[0].planned_by = "chat@1"
    snap.frame.scratch = {"queued": [action_to_dict(ToolCall("refund", {"order": "A1"})),
                                     action_to_dict(Reply("done"))], "other": 1}
    snap.stack.append(make_snap(agent="own").frame)
    snap.stack[1].scratch = {"queued": ["job-1", "job-2"]}
    raw = orjson.loads(snap.dumps())
    raw["format"] = 9

    loaded = Snapshot.loads(orjson.dumps(raw), TASK, 3)

    assert loaded.format == SNAPSHOT_FORMAT == 10
    top, own = loaded.stack
    assert [e.to_action() for e in top.agenda] == [ToolCall("lookup", {"order": "A1"}),
                                                   ToolCall("refund", {"order": "A1"}),
                                                   Reply("done")]
    assert {e.planned_by for e in top.agenda} == {"chat@1"}
    assert top.scratch == {"other": 1}
    assert own.scratch == {"queued": ["job-1", "job-2"]} and own.agenda == []

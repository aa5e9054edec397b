"""The repeat bound on a task model (R10, R12, R26): a side-effecting call identical to one
that already succeeded waits for a person, and a person may answer it with the earlier
result without running it.

Driven on :class:`engine_double.FakeTask` (the runner's own ``finish_call`` code, no store);
the end-to-end tests on a real harness are in
tests/acceptance/test_r10_r12_repeated_side_effects_need_a_person.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from engine_double import FakeReads, FakeTask, make_snap, open_call

from tether.engine import limits
from tether.errors import IllegalTransition
from tether.model import CallState, CallStatus, OutcomeStatus, Status
from tether.settings import Settings
from tether.strategies import Strategy
from tether.tools import RetryPolicy, Tool, ToolContext


def refund_tool(name: str = "refund", repeatable: bool = False) -> Tool:
    async def refund(ctx: ToolContext, **args: Any) -> Any:
        raise AssertionError("the bound never runs a tool")

    return Tool(refund, name=name, side_effect=True, idempotent=False, timeout=None,
                retry=RetryPolicy(), interruptible=False, repeatable=repeatable)


def a_task(*tools: Tool, limit: int = 1) -> FakeTask:
    return FakeTask(make_snap(), tools=tools or [refund_tool()],
                    settings=Settings(max_identical_side_effects=limit), reads=FakeReads())


def made(task: FakeTask, args: dict[str, Any], result: Any = "refunded",
         tool: str = "refund") -> CallState:
    """A call the task made and that succeeded, as the runner records it: the assistant's
    tool call in the dialog, then its result (through the runner's own finish_call)."""
    call = open_call(task.snap, tool, args, status=CallStatus.STARTED)
    task.append_history({"role": "assistant", "tool_call": {
        "name": call.tool, "args": call.args, "key": call.key}})
    task.finish_call(call, result)
    return call


def planned(task: FakeTask, args: dict[str, Any], tool: str = "refund") -> CallState:
    """A call just opened at its resume point, not run yet."""
    return open_call(task.snap, tool, args, status=CallStatus.PLANNED, attempt=0)


# --------------------------------------------------------------------------- what a call does


def test_r12_framework_call_ids_are_not_part_of_what_a_call_does() -> None:
    """R12: PydanticAI's ``tool_call_id`` and the Agents SDK's ``call_id`` name the model's
    call, not what it does; the SDK's JSON text of the arguments is read as JSON, so other
    spacing or key order is the same call."""
    same = limits.identity("support.refund", {"tool_call_id": "r1", "args": {"order": "A1"}})
    assert same == limits.identity("support.refund", {"tool_call_id": "r7",
                                                      "args": {"order": "A1"}})
    assert same != limits.identity("support.refund", {"tool_call_id": "r1",
                                                      "args": {"order": "B2"}})
    assert same != limits.identity("other.refund", {"tool_call_id": "r1", "args": {"order": "A1"}})
    sdk = limits.identity("a.refund", {"call_id": "c1", "arguments": '{"order": "A1", "amount": 5}'})
    assert sdk == limits.identity("a.refund", {"call_id": "c2",
                                               "arguments": '{"amount":5,"order":"A1"}'})
    assert sdk != limits.identity("a.refund", {"call_id": "c2", "arguments": '{"order": "A2"}'})
    assert limits.identity("a.refund", {"call_id": "c1", "arguments": "not json"}) == \
        limits.identity("a.refund", {"call_id": "c2", "arguments": "not json"})


def test_r12_an_apps_own_call_id_argument_is_part_of_what_the_call_does() -> None:
    """R12: only the call id a framework integration adds is left out; a tool of the app's own
    whose argument is named ``call_id`` (a phone call's id) does another thing per id."""
    assert limits.identity("hang_up", {"call_id": "c1"}) != \
        limits.identity("hang_up", {"call_id": "c2"})
    assert limits.identity("transfer", {"call_id": "c1", "to": "ops"}) != \
        limits.identity("transfer", {"call_id": "c2", "to": "ops"})


def test_r26_the_summary_shows_the_arguments_the_model_meant() -> None:
    """R26: a person reads the arguments, not the framework's wrapping of them."""
    assert limits.summary({"order": "A1", "amount": 5}) == "order='A1', amount=5"
    assert limits.summary({"tool_call_id": "r1", "args": {"order": "A1"}}) == "order='A1'"
    assert limits.summary({"call_id": "c1", "arguments": '{"order": "A1"}'}) == "order='A1'"


# --------------------------------------------------------------------------- the bound


async def test_r10_r12_the_second_identical_side_effect_is_held_naming_the_earlier_call() -> None:
    """R10/R12: once refund(A1, 5) succeeded, the same call planned again (under a new key)
    is held: the task goes to a person, the reason names the tool, the arguments and the
    earlier key, and the call did not run (it has no record and stays planned)."""
    task = a_task()
    first = made(task, {"order": "A1", "amount": 5})
    assert task.snap.side_effects == {limits.identity("refund", first.args): 1}
    again = planned(task, {"order": "A1", "amount": 5})
    assert await limits.repeated_side_effect(task, again) is True
    assert task.snap.status is Status.NEEDS_HUMAN and task.strategies[-1] is \
        Strategy.REPEATED_SIDE_EFFECT
    reason = task.snap.error or ""
    assert "refund with the same arguments a 2nd time (order='A1', amount=5)" in reason
    assert f"call {first.key} already succeeded" in reason and again.key in reason
    assert "did not run" in reason and "max_identical_side_effects=1" in reason
    assert task.snap.call is again and again.status is CallStatus.PLANNED
    assert [r.key for r in task.idempotency] == [first.key]  # nothing recorded for the held one


async def test_r12_other_arguments_other_tools_and_repeatable_tools_are_not_held() -> None:
    """R12: only the same tool with the same arguments is a repeat, and a tool registered
    ``repeatable=True`` is never held for being identical."""
    task = a_task(refund_tool(), refund_tool("ping", repeatable=True))
    made(task, {"order": "A1", "amount": 5})
    assert not await limits.repeated_side_effect(task, planned(task, {"order": "A1", "amount": 6}))
    made(task, {}, tool="ping")
    assert not await limits.repeated_side_effect(task, planned(task, {}, tool="ping"))
    assert limits.identity("ping", {}) not in task.snap.side_effects  # not even counted
    assert task.snap.status is Status.RUNNING


async def test_r12_calls_that_did_not_succeed_are_not_counted() -> None:
    """R12: a call that failed (retried under its own key) or was only planned is not a
    repeat: only a recorded result counts."""
    task = a_task()
    planned(task, {"order": "A1", "amount": 5})  # opened, never finished
    assert task.snap.side_effects == {}
    assert not await limits.repeated_side_effect(task, planned(task, {"order": "A1", "amount": 5}))


async def test_r12_the_limit_is_the_setting() -> None:
    """R12: ``max_identical_side_effects=2`` lets the second identical call run and holds the
    third, naming the newest earlier call."""
    task = a_task(limit=2)
    made(task, {"order": "A1"})
    assert not await limits.repeated_side_effect(task, planned(task, {"order": "A1"}))
    second = made(task, {"order": "A1"})
    assert await limits.repeated_side_effect(task, planned(task, {"order": "A1"}))
    assert "a 3rd time" in (task.snap.error or "")
    assert f"call {second.key} already succeeded" in (task.snap.error or "")


async def test_r26_a_persons_resume_does_not_forget_what_succeeded() -> None:
    """R26: a resume grants the completions budget again, but a refund already paid stays
    counted: a resume for another reason never makes it payable a second time unasked."""
    task = a_task()
    made(task, {"order": "A1"})
    task.snap.usage["completions"] = 7
    limits.grant_again(task.snap)
    assert task.snap.usage["budget_start"] == 7
    assert task.snap.side_effects == {limits.identity("refund", {"order": "A1"}): 1}


# ---------------------------------------------------------------- answering with the earlier result


async def test_r10_r26_a_held_repeat_is_answered_with_the_earlier_result_without_running() -> None:
    """R10/R26: a person's answer "it already happened": the held call gets the earlier
    call's result (from its idempotency record), recorded under its own key; the dialog shows
    the call answered from the earlier key and by whom; nothing ran, so the count stays."""
    task = a_task()
    first = made(task, {"order": "A1", "amount": 5}, result={"refund": "r-1"})
    task.fake_reads.idempotency[first.key] = task.idempotency[-1]
    held = planned(task, {"order": "A1", "amount": 5})
    assert await limits.repeated_side_effect(task, held)
    counted = dict(task.snap.side_effects)
    earlier = await limits.answer_with_earlier(task, "ana", event_id=4)
    assert earlier == limits.Earlier(first.key, {"refund": "r-1"})
    assert task.snap.call is None and task.snap.frame.last_tool_result == {"refund": "r-1"}
    assert task.idempotency[-1].key == held.key
    assert task.idempotency[-1].status is OutcomeStatus.SUCCEEDED
    assert task.rows[-2] == {"role": "assistant", "tool_call": {
        "name": "refund", "args": held.args, "key": held.key},
        "answered_from": first.key, "by": "ana"}
    assert task.rows[-1]["key"] == held.key and task.rows[-1]["content"] == {"refund": "r-1"}
    assert task.recovery_log[-1][:2] == (Strategy.REUSE_RESULT, 4)
    assert task.snap.side_effects == counted


async def test_r10_a_framework_answer_to_the_earlier_call_answers_the_new_one_by_its_value(
        ) -> None:
    """R10: PydanticAI's parts and an Agents SDK output name the earlier call's id; the value
    they hold answers the new call (its adapter answers the new id), never the parts."""
    parts = [{"part_kind": "tool-return", "tool_name": "refund", "tool_call_id": "r1",
              "content": "refunded 5 on A1"}]
    for result, answer in ((parts, "refunded 5 on A1"),
                           ({"type": "function_call_output", "call_id": "c1",
                             "output": "refunded"}, "refunded")):
        task = a_task()
        made(task, {"order": "A1"}, result=result)
        planned(task, {"order": "A1"})
        assert (await limits.answer_with_earlier(task, "ana")).result == answer
        assert task.snap.frame.last_tool_result == answer


async def test_r10_answering_with_an_earlier_result_is_refused_when_it_does_not_fit() -> None:
    """R10: refused, changing nothing, when there is no call that has not run, no earlier
    identical call succeeded, or the earlier answer holds no single value."""
    task = a_task()
    with pytest.raises(IllegalTransition, match="no open call"):
        await limits.answer_with_earlier(task, "ana")
    planned(task, {"order": "A1"})
    with pytest.raises(IllegalTransition, match="no earlier call of refund"):
        await limits.answer_with_earlier(task, "ana")
    in_doubt = a_task()
    made(in_doubt, {"order": "A1"})
    open_call(in_doubt.snap, "refund", {"order": "A1"}, status=CallStatus.STARTED)
    with pytest.raises(IllegalTransition, match="is started"):
        await limits.answer_with_earlier(in_doubt, "ana")
    parts = a_task()
    made(parts, {"order": "A1"}, result=[
        {"part_kind": "tool-return", "content": "a"}, {"part_kind": "retry-prompt", "content": "b"}])
    planned(parts, {"order": "A1"})
    rows = len(parts.rows)
    with pytest.raises(IllegalTransition, match="framework's answer"):
        await limits.answer_with_earlier(parts, "ana")
    assert len(parts.rows) == rows and parts.snap.call is not None


def test_r10_the_earlier_call_is_found_on_the_dialog_only_when_it_succeeded() -> None:
    """R10: a failed or skipped earlier call is no earlier success; the newest success is."""
    call = CallState(key="t1:f0:9", tool="refund", args={"order": "A1"}, args_hash="h")
    rows: list[dict[str, Any]] = []
    for key, outcome in (("k1", {"content": "one"}), ("k2", {"error": "declined"}),
                         ("k3", {"content": None, "skipped": True})):
        rows.append({"role": "assistant", "tool_call": {"name": "refund",
                                                        "args": {"order": "A1"}, "key": key}})
        rows.append({"role": "tool", "name": "refund", "key": key, **outcome})
    assert limits.earlier_success(rows, call) == limits.Earlier("k1", "one")
    assert limits.earlier_success(json.loads(json.dumps(rows[2:])), call) is None

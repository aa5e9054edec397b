"""The same side effect twice needs a person, by default (R10, R12, R26).

A small real model asked for ``refund(A1, 5)`` again in its next answer, and tether paid it
twice: each call had its own idempotency key, because they were two calls. Now a
side-effecting call with the same tool and arguments as one that already succeeded in the
task is held before it runs (``max_identical_side_effects=1``): the task goes to a person,
who may run it again (a plain resume) or have the agent plan again (a resume with a
message). A tool that may legitimately repeat says ``repeatable=True``. Only calls that
succeeded count, framework call ids aside, the same for a native agent, ChatAgent and
PydanticAI. A real harness on SQLite.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import fast_settings, strategies

import tether as tt
from tether.model import CallState, CallStatus
from tether.testing.fake_openai import FakeOpenAI, call, reply

pytestmark = pytest.mark.timeout(60)

REFUND = {"order": "A1", "cents": 5}


class Asks(tt.Agent):
    """A model that asks for the same call *times* times, one answer after another, then
    finishes; a person's message (a resume with one) makes it stop asking."""

    def __init__(self, tool: str = "refund", args: dict[str, Any] | None = None,
                 times: int = 2) -> None:
        self.tool, self.args, self.times = tool, args or REFUND, times

    async def plan(self, task: tt.TaskView) -> tt.Action:
        asked = task.scratch.get("asked", 0)
        if asked == self.times or any(r.get("type") == "resume" for r in task.history):
            return tt.Finish({"asked": asked})
        task.scratch["asked"] = asked + 1
        return tt.ToolCall(self.tool, self.args)


def shop(db_url: str, agent: tt.Agent, **settings: Any) -> tuple[tt.Harness, list[str]]:
    h = tt.Harness(db_url, settings=fast_settings(**settings))
    paid: list[str] = []

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, order: str, cents: int) -> dict[str, Any]:
        paid.append(ctx.idempotency_key)
        return {"refunded": cents, "order": order}

    h.add_agent("shop", agent)
    return h, paid


async def held_call(h: tt.Harness, tid: str) -> CallState:
    info = await h.get(tid)
    assert info.record.status is tt.Status.NEEDS_HUMAN, info.record.reason
    assert info.snapshot.call is not None
    return info.snapshot.call


async def test_r10_r12_the_same_refund_asked_again_is_held_naming_the_earlier_call(
        db_url: str) -> None:
    """R10/R12: refund(A1, 5) succeeded; the agent's next answer asks for it again. The
    second call is held before it runs: the task needs a person, the reason names the tool,
    the arguments and the earlier call's key, and the held call has no record (it never
    started)."""
    h, paid = shop(db_url, Asks())
    tid = await h.submit("shop")
    await h.run_until_idle(timeout=20)
    held = await held_call(h, tid)
    [first] = paid
    reason = (await h.get(tid)).record.reason or ""
    assert "refund with the same arguments a 2nd time (order='A1', cents=5)" in reason
    assert f"call {first} already succeeded" in reason
    assert f"did not run (key={held.key})" in reason and held.key != first
    assert held.status is CallStatus.PLANNED and held.args == REFUND
    assert [r.key for r in await h.store.list_idempotency(tid)] == [first]
    assert (await strategies(h, tid))[-1] == "repeated_side_effect"
    await h.close()


async def test_r26_a_plain_resume_runs_the_held_call_and_a_further_repeat_asks_again(
        db_url: str) -> None:
    """R26: a person's plain resume runs the held call as planned (under its own key). It
    does not make the refund repeatable: the third identical call is held again."""
    h, paid = shop(db_url, Asks(times=3))
    tid = await h.submit("shop")
    await h.run_until_idle(timeout=20)
    held = await held_call(h, tid)
    await h.resume(tid, by="ops")
    await h.run_until_idle(timeout=20)
    third = await held_call(h, tid)
    assert paid == [paid[0], held.key] and third.key not in paid
    assert f"a 3rd time (order='A1', cents=5); call {held.key} already succeeded" in (
        (await h.get(tid)).record.reason or "")
    await h.resume(tid, by="ops")
    await h.run_until_idle(timeout=20)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == {"asked": 3}
    assert len(paid) == 3
    await h.close()


async def test_r26_a_resume_with_a_message_drops_the_held_call(db_url: str) -> None:
    """R26: a person who says "that was already refunded" resumes with a message: the held
    call is dropped without running and the agent plans again, seeing the message."""
    h, paid = shop(db_url, Asks())
    tid = await h.submit("shop")
    await h.run_until_idle(timeout=20)
    await held_call(h, tid)
    await h.resume(tid, "A1 was refunded already", by="ops")
    await h.run_until_idle(timeout=20)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == {"asked": 2} and len(paid) == 1
    await h.close()


async def test_r12_a_repeatable_tool_is_never_held_for_being_identical(db_url: str) -> None:
    """R12: a side effect that may legitimately go twice (a status ping) is registered
    ``repeatable=True``: three identical calls all run."""
    h, _ = shop(db_url, Asks("ping", {"channel": "ops"}, times=3))
    pings: list[str] = []

    async def ping(ctx: tt.ToolContext, channel: str) -> str:
        pings.append(ctx.idempotency_key)
        return "sent"

    h.add_tool(tt.Tool(ping, name="ping", side_effect=True, idempotent=False, timeout=None,
                       retry=tt.RetryPolicy(), interruptible=False, repeatable=True))
    tid = await h.submit("shop")
    await h.run_until_idle(timeout=20)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert len(set(pings)) == 3
    await h.close()


async def test_r12_other_arguments_are_another_call(db_url: str) -> None:
    """R12: refund(A1) and refund(B2) are two refunds, not a repeat."""

    class Two(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            n = task.scratch.get("n", 0)
            task.scratch["n"] = n + 1
            orders = ["A1", "B2"]
            return tt.ToolCall("refund", {"order": orders[n], "cents": 5}) if n < 2 \
                else tt.Finish("both")

    h, paid = shop(db_url, Two())
    tid = await h.submit("shop")
    await h.run_until_idle(timeout=20)
    assert (await h.get(tid)).record.status is tt.Status.COMPLETED and len(paid) == 2
    await h.close()


async def test_r10_r12_only_calls_that_succeeded_count(db_url: str) -> None:
    """R10/R12: a call that failed for good and is asked for again has not happened, and a
    call that failed and was retried under its own key is one call: neither is held. Once
    one has succeeded, the next identical call is, naming the one that succeeded."""
    h = tt.Harness(db_url, settings=fast_settings())
    runs: list[tuple[str, str]] = []

    @h.tool(side_effect=True, retry=tt.RetryPolicy(max_attempts=2, backoff=0.0))
    async def charge(ctx: tt.ToolContext, cents: int) -> str:
        failing = len(runs) in (0, 1, 2)  # key 1 fails both attempts; key 2 fails once
        runs.append((ctx.idempotency_key, "failed" if failing else "ok"))
        if failing:
            raise RuntimeError("card network busy")
        return "charged"

    class Charges(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            n = task.scratch.get("n", 0)
            task.scratch["n"] = n + 1
            return tt.ToolCall("charge", {"cents": 5}) if n < 3 else tt.Finish("done")

        async def on_event(self, task: tt.TaskView, event: tt.Event) -> tt.Action | None:
            return tt.Replan() if event.type == "tool_error" else None  # ask again

    h.add_agent("charges", Charges())
    tid = await h.submit("charges")
    await h.run_until_idle(timeout=20)
    held = await held_call(h, tid)
    k1, k2 = runs[0][0], runs[2][0]
    assert runs == [(k1, "failed"), (k1, "failed"), (k2, "failed"), (k2, "ok")]
    reason = (await h.get(tid)).record.reason or ""
    assert f"call {k2} already succeeded" in reason and held.key not in {k1, k2}
    await h.close()


async def test_r13_r19_the_count_survives_a_restart(db_url: str) -> None:
    """R13/R19: what already succeeded is in the task's snapshot, not in a worker's memory:
    a new process (a new harness on the same store) still holds the repeat."""

    class Later(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            n = task.scratch.get("n", 0)
            task.scratch["n"] = n + 1
            if n == 1:
                return tt.Wait("user_message")
            return tt.ToolCall("refund", REFUND) if n < 3 else tt.Finish("done")

    h, paid = shop(db_url, Later())
    tid = await h.submit("shop")
    await h.run_until_idle(timeout=20)
    assert (await h.get(tid)).record.status is tt.Status.WAITING and len(paid) == 1
    await h.close()
    again, paid_later = shop(db_url, Later())
    await again.emit(tt.Event("user_message", tid, "please refund A1"))
    await again.run_until_idle(timeout=20)
    await held_call(again, tid)
    assert paid_later == []
    await again.close()


# --------------------------------------------------------------------------- model agents


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


async def test_r12_r26_a_chat_model_asking_for_the_refund_again_is_held(
        db_url: str, fake: FakeOpenAI) -> None:
    """R12/R26: the small-model case. ChatAgent's model asks for refund(A1, 5) and, in its
    next answer, for it again: the second is held (one refund). The person's message drops
    it, and the model is asked again with that message in its prompt."""
    from tether.agents import ChatAgent, RetryPolicy

    h, paid = shop(db_url, tt.Agent())
    h.agents.clear()
    h.add_agent("chat", ChatAgent("fake-model", base_url=fake.url, api_key="none",
                                  tools=[h.tools["refund"]],
                                  retry=RetryPolicy(attempts=3, base=0.001)))
    fake.add(reply(tool_calls=[call("refund", REFUND)]),
             reply(tool_calls=[call("refund", REFUND)]),
             reply("A1 was refunded once."))
    tid = await h.submit("chat", "Refund 5 cents on A1")
    await h.run_until_idle(timeout=20)
    held = await held_call(h, tid)
    assert len(paid) == 1 and held.tool == "refund"
    await h.resume(tid, "It is refunded already; do not refund it again.", by="ops")
    await h.run_until_idle(timeout=20)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "A1 was refunded once." and len(paid) == 1
    assert "do not refund it again" in str(fake.requests[-1]["messages"])
    await h.close()


async def test_r12_a_pydantic_ai_refund_asked_again_under_a_new_call_id_is_held(
        db_url: str) -> None:
    """R12: PydanticAI's tools carry the model's ``tool_call_id``; it is not part of what the
    call does, so the same refund under a new call id is held with the default setting."""
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from tether.integrations.pydantic_ai import PydanticAIAgent, current_call

    def again(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart("refund", {"order": "A1", "amount": 5},
                                                 tool_call_id=f"r{len(messages)}")])

    refunds: list[str] = []
    agent: Agent[None, str] = Agent(FunctionModel(again))

    @agent.tool_plain
    async def refund(order: str, amount: int) -> str:
        refunds.append(current_call().idempotency_key)
        return f"refunded {amount} on {order}"

    h = tt.Harness(db_url, settings=fast_settings())
    h.add_agent("support", PydanticAIAgent(agent))
    tid = await h.submit("support", "Refund A1")
    await h.run_until_idle(timeout=20)
    held = await held_call(h, tid)
    reason = (await h.get(tid)).record.reason or ""
    assert len(refunds) == 1 and held.tool == "support.refund"
    assert "a 2nd time (order='A1', amount=5)" in reason
    assert f"call {refunds[0]} already succeeded" in reason
    await h.close()


async def test_r12_a_tool_registered_repeatable_through_the_harness_is_never_held(
        tmp_path: Path) -> None:
    """``@harness.tool(side_effect=True, repeatable=True)``: the same call twice runs twice."""
    h = tt.Harness(f"sqlite:///{tmp_path / 'r.db'}")
    paid: list[str] = []

    @h.tool(side_effect=True, repeatable=True)
    async def top_up(ctx: tt.ToolContext, card: str) -> str:
        paid.append(ctx.idempotency_key)
        return "topped up"

    @h.agent("again")
    class Again(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            done = int(task.scratch.get("done", 0))
            if done == 2:
                return tt.Finish(done)
            task.scratch["done"] = done + 1
            return tt.ToolCall("top_up", {"card": "c1"})

    assert h.tools["top_up"].repeatable
    tid = await h.submit("again")
    await h.run_until_idle(timeout=10)
    assert (await h.get(tid)).record.status is tt.Status.COMPLETED
    assert len(paid) == 2 and len(set(paid)) == 2
    await h.close()


async def test_r10_r26_a_held_repeat_answered_with_the_earlier_result_does_not_run(
        db_url: str) -> None:
    """R10/R26: the person's third answer to a held repeat: "answer it with the earlier
    result". The held refund does not run; the agent gets the first refund's result; the
    dialog shows the held call answered from the earlier key, by whom; one payment."""

    class Keeps(Asks):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if task.scratch.get("asked") == 2:
                return tt.Finish({"last": task.last_tool_result})
            return await super().plan(task)

    h, paid = shop(db_url, Keeps())
    tid = await h.submit("shop")
    await h.run_until_idle(timeout=20)
    held = await held_call(h, tid)
    await h.resume(tid, by="ops", earlier_result=True)
    await h.run_until_idle(timeout=20)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == {"last": {"refunded": 5, "order": "A1"}}
    assert len(paid) == 1
    [answered] = [r for r in await h.history(tid) if r.get("answered_from")]
    assert answered["answered_from"] == paid[0] and answered["by"] == "ops"
    assert answered["tool_call"]["key"] == held.key
    assert "reuse_result" in await strategies(h, tid)
    await h.close()


async def test_r10_answering_with_the_earlier_result_is_refused_unless_a_repeat_is_held(
        db_url: str) -> None:
    """R10: the lever is checked before anything is stored: refused on a task that holds no
    repeat (it completed), and refused with a message too (two answers at once)."""
    h, paid = shop(db_url, Asks(times=1))
    done = await h.submit("shop")
    await h.run_until_idle(timeout=20)
    with pytest.raises(tt.IllegalTransition, match="holds no repeat"):
        await h.resume(done, earlier_result=True)
    h2, _ = shop(db_url, Asks())
    held = await h2.submit("shop")
    await h2.run_until_idle(timeout=20)
    with pytest.raises(tt.InvalidInput, match="choose one"):
        await h2.resume(held, "stop", earlier_result=True)
    assert [e for t in (done, held) for e in await h.store.list_events(t)] == []
    assert (await h2.get(held)).record.status is tt.Status.NEEDS_HUMAN and len(paid) == 1
    await h.close()
    await h2.close()

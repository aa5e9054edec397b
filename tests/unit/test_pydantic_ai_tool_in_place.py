"""A PydanticAI tool call runs through the tool manager of the plan that asked for it.

In the process that made the plan, a call runs as a plain PydanticAI run would run it: by
the step's ``ToolManager`` (argument validation, the tool, ``ModelRetry`` made a retry
part), with no second ``agent.iter``. A process that did not make the plan (after a crash,
a load, a rollback or a fork) runs it from a history holding only that call. Both give the
same parts; these tests hold them to that, and hold each path to when it is taken.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import (
    Agent,
    ApprovalRequired,
    CallDeferred,
    ModelRetry,
    RunContext,
    ToolFailed,
    ToolReturn,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import tether as tt
from tether import dialog
from tether.agent import TaskView
from tether.integrations import pydantic_ai as integration
from tether.integrations.pydantic_ai import KEY, PydanticAIAgent
from tether.integrations.pydantic_ai_run import LiveRun
from tether.model import Frame, Snapshot, ToolCall
from tether.tools import ToolContext

CALLS = [
    ToolCallPart("echo", {"text": "hi"}, tool_call_id="c-echo"),
    ToolCallPart("echo", {"text": 5}, tool_call_id="c-bad"),  # fails validation: a retry
    ToolCallPart("picky", {"n": 1}, tool_call_id="c-retry"),
    ToolCallPart("rich", {}, tool_call_id="c-rich"),
    ToolCallPart("broken", {}, tool_call_id="c-failed"),
    ToolCallPart("later", {}, tool_call_id="c-later"),
    ToolCallPart("asks", {}, tool_call_id="c-asks"),
    ToolCallPart("keyed", {}, tool_call_id="c-key"),
]
"""One call of each kind of outcome the graph turns into parts."""


FROM_HISTORY = "(a tool call run by tether)"
"""The prompt of the history a call is run from by a process that did not plan it."""


class Seen:
    """What the tools saw: whether they ran from a history (the fallback's, opened by its
    prompt) rather than the plan's, and the key."""

    def __init__(self) -> None:
        self.from_history: list[bool] = []
        self.keys: list[str] = []

    def saw(self, ctx: RunContext[None]) -> None:
        first = ctx.messages[0].parts[0]
        self.from_history.append(getattr(first, "content", None) == FROM_HISTORY)


def tools_agent(seen: Seen, answer: Any = None) -> Agent[None, str]:
    """An agent with a tool for each outcome; *answer* is its model (default: one call)."""
    def one_call(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("echo", {"text": "hi"}, tool_call_id="c1")])

    agent: Agent[None, str] = Agent(FunctionModel(answer or one_call))

    @agent.tool
    async def echo(ctx: RunContext[None], text: str) -> str:
        """Say it back."""
        seen.saw(ctx)
        return f"echo {text}"

    @agent.tool_plain
    async def picky(n: int) -> str:
        """Always asks again."""
        raise ModelRetry(f"not {n}, try another")

    @agent.tool_plain
    async def rich() -> ToolReturn:
        """A return with content for the model beside it."""
        return ToolReturn(return_value={"v": 1}, content="look at this", metadata={"m": 2})

    @agent.tool_plain
    async def broken() -> str:
        """Fails in a way the model is told of."""
        raise ToolFailed("the service said no")

    @agent.tool_plain
    async def later() -> str:
        """Its result comes from elsewhere."""
        raise CallDeferred(metadata={"ticket": 7})

    @agent.tool_plain
    async def asks() -> str:
        """Wants a person's approval first."""
        raise ApprovalRequired()

    @agent.tool
    async def keyed(ctx: RunContext[None]) -> str:
        """Returns tether's idempotency key from its metadata."""
        seen.keys.append((ctx.metadata or {})[KEY])
        return str((ctx.metadata or {})[KEY])

    @agent.tool(requires_approval=True)
    async def wipe(ctx: RunContext[None], disk: str) -> str:
        """Needs approval."""
        seen.saw(ctx)
        return f"wiped {disk}"

    return agent


def named(agent: Agent[None, str], **options: Any) -> PydanticAIAgent:
    pai = PydanticAIAgent(agent, stream=False, **options)
    pai.name = "a"
    return pai


def view(rows: list[dict[str, Any]], task_id: str = "t1") -> TaskView:
    snap = Snapshot(task_id=task_id, agent="a", input="go", stack=[Frame(agent="a")])
    return TaskView(snap, rows, {})


def context(call: ToolCallPart, key: str = "t1:f:1") -> ToolContext:
    return ToolContext("t1", f"a.{call.tool_name}", key, 1)


def without_times(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in part.items() if k != "timestamp"} for part in parts]


async def a_manager(pai: PydanticAIAgent) -> Any:
    """The tool manager of a plan's step, as the task's kept run hands it over."""
    live = LiveRun(pai.agent, "go", [], None, owner=None)
    _, _, manager = await live.ask(stream=False)
    live.close()
    return manager


@pytest.mark.parametrize("call", CALLS, ids=[c.tool_call_id for c in CALLS])
async def test_a_call_run_in_place_gives_the_parts_a_run_from_a_history_gives(
        call: ToolCallPart) -> None:
    """Return, validation retry, ModelRetry, ToolReturn content, ToolFailed, deferral and
    approval asked by the tool: the plan's manager and the fallback agree, part for part."""
    seen = Seen()
    pai = named(tools_agent(seen))
    manager = await a_manager(pai)
    fast = await integration._run_planned(manager, call, "t1:f:1", approved=False)
    slow = await pai._run_tool(context(call), call)  # nothing armed: from a history
    assert without_times(fast) == without_times(slow)
    assert fast, "every call is answered"


async def test_an_approved_call_runs_in_place_as_approved() -> None:
    seen = Seen()
    pai = named(tools_agent(seen))
    call = ToolCallPart("wipe", {"disk": "d1"}, tool_call_id="w1")
    fast = await integration._run_planned(await a_manager(pai), call, "k", approved=True)
    slow = await pai._run_tool(context(call), call, approved=True)
    assert without_times(fast) == without_times(slow)
    assert fast[0]["content"] == "wiped d1"


async def test_the_key_reaches_the_tool_in_metadata_on_both_paths() -> None:
    seen = Seen()
    pai = named(tools_agent(seen))
    call = ToolCallPart("keyed", {}, tool_call_id="k1")
    await integration._run_planned(await a_manager(pai), call, "t1:f:9", approved=False)
    await pai._run_tool(context(call, "t1:f:9"), call)
    assert seen.keys == ["t1:f:9", "t1:f:9"]


async def planned_task(pai: PydanticAIAgent, rows: list[dict[str, Any]]) -> ToolCall:
    """Plan once on *rows* (the plan's model row appended, as the runner does): the call."""
    task = view(rows)
    actions = await pai.plan(task)
    assert isinstance(actions, list) and isinstance(actions[0], ToolCall)
    rows += [dialog.completion(record) for record in task.completions]
    return actions[0]


async def test_prepare_arms_the_call_only_while_the_rows_are_the_plans() -> None:
    """The same rows, added to: armed, the call runs in place. A second run of an armed
    call, the rows read again (a load: other objects) or a call with other arguments under
    the same id: from a history."""
    seen = Seen()
    pai = named(tools_agent(seen))
    rows: list[dict[str, Any]] = []
    action = await planned_task(pai, rows)
    call = ToolCallPart("echo", action.args["args"], tool_call_id=action.args["tool_call_id"])

    await pai.prepare(view(rows), action)
    await pai._run_tool(context(call), call)
    await pai._run_tool(context(call), call)  # armed once: a retry runs from a history
    await pai.prepare(view(copy.deepcopy(rows)), action)  # read again, as after a load
    await pai._run_tool(context(call), call)
    other = ToolCall(action.name, {**action.args, "args": {"text": "else"}})
    await pai.prepare(view(rows), other)
    await pai._run_tool(context(call), call)
    assert seen.from_history == [False, True, True, True]


async def test_the_next_plan_disarms_the_calls_of_the_last() -> None:
    """Once the task planned again (here: the call answered, the model done), a call of the
    earlier plan is no longer run through its manager."""
    seen = Seen()
    pai = named(tools_agent(seen))
    rows: list[dict[str, Any]] = []
    action = await planned_task(pai, rows)
    rows += [dialog.call(action.name, action.args, "k1"), dialog.result(action.name, "k1", "hi")]
    assert not isinstance(await pai.plan(view(rows)), list)  # done
    await pai.prepare(view(rows), action)
    call = ToolCallPart("echo", action.args["args"], tool_call_id=action.args["tool_call_id"])
    await pai._run_tool(context(call), call)
    assert seen.from_history == [True]


def two_calls(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Two echo calls per answer, three answers with calls, then done."""
    done = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
    if done >= 6:
        return ModelResponse(parts=[TextPart(f"done {done}")])
    return ModelResponse(parts=[
        ToolCallPart("echo", {"text": f"a{done}"}, tool_call_id=f"a{done}"),
        ToolCallPart("echo", {"text": f"b{done}"}, tool_call_id=f"b{done}")])


def counted_runs(agent: Agent[None, str]) -> list[int]:
    """A list that gets one item per ``agent.iter`` the agent opens from now on."""
    runs: list[int] = []
    iter_ = agent.iter

    def counted(*args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        return iter_(*args, **kwargs)

    agent.iter = counted  # type: ignore[method-assign]
    return runs


async def test_an_uninterrupted_run_makes_one_agent_iter_in_all(tmp_path: Path) -> None:
    """No ``agent.iter`` per tool call, nor per plan: one run is kept open for the task, every
    call ran through its plan's manager (two calls of one answer too), and the task ends as
    it would."""
    seen = Seen()
    agent = tools_agent(seen, two_calls)
    runs = counted_runs(agent)
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}",
                   settings=tt.Settings(recovery_backoff=0.01, poll_interval=0.01))
    h.add_agent("a", PydanticAIAgent(agent, stream=False,
                                     tools={"echo": tt.ToolPolicy(idempotent=True)}))
    tid = await h.submit("a", "go")
    await h.run_until_idle(timeout=20)
    info = await h.get(tid)
    await h.close()
    assert info.snapshot.result == "done 6"
    assert seen.from_history == [False] * 6
    assert info.snapshot.usage["completions"] == 4
    assert len(runs) == 1  # one kept run answered every plan and settled the output


async def test_a_process_that_did_not_plan_the_call_runs_it_from_a_history(
        tmp_path: Path) -> None:
    """The plan made and committed by one harness, the call run by another (a new agent
    object, as a new process has): the fallback runs it, and the task ends as it would."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    settings = tt.Settings(recovery_backoff=0.01, poll_interval=0.01)

    def wipe_once(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if returned:
            return ModelResponse(parts=[TextPart(f"{returned[0].outcome}: {returned[0].content}")])
        return ModelResponse(parts=[ToolCallPart("wipe", {"disk": "d1"}, tool_call_id="w1")])

    results, seen = [], Seen()
    for restart in (False, True):
        first = tt.Harness(url if restart else f"sqlite:///{tmp_path / 'one.db'}",
                           settings=settings)
        first.add_agent("a", PydanticAIAgent(tools_agent(seen, wipe_once), stream=False))
        tid = await first.submit("a", "wipe")
        await first.run_until_idle(timeout=10)  # waiting for the approval
        second = first
        if restart:
            await first.close()
            second = tt.Harness(url, settings=settings)
            second.add_agent("a", PydanticAIAgent(tools_agent(seen, wipe_once), stream=False))
            seen.from_history.clear()
        await second.emit(tt.Event("approval", tid, True))
        await second.run_until_idle(timeout=10)
        results.append((await second.get(tid)).snapshot.result)
        await second.close()
    assert seen.from_history == [True]  # the restarted one ran the call from a history
    assert results == ["success: wiped d1", "success: wiped d1"]


async def test_e7_a_task_parked_for_an_approval_keeps_no_pydantic_ai_run_open(
        tmp_path: Path) -> None:
    """E7: the run kept between plans is left when the task parks (here for an approval):
    nothing of it stays in this process; the approved call still runs, and the task ends."""
    def wipe_once(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if returned:
            return ModelResponse(parts=[TextPart(f"{returned[0].outcome}: {returned[0].content}")])
        return ModelResponse(parts=[ToolCallPart("wipe", {"disk": "d1"}, tool_call_id="w1")])

    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}",
                   settings=tt.Settings(recovery_backoff=0.01, poll_interval=0.01))
    pai = PydanticAIAgent(tools_agent(Seen(), wipe_once), stream=False)
    h.add_agent("a", pai)
    tid = await h.submit("a", "wipe")
    await h.run_until_idle(timeout=10)
    assert (await h.get(tid)).record.status is tt.Status.WAITING
    kept = pai.dialogs[tid]
    assert kept.live is None
    await h.emit(tt.Event("approval", tid, True))
    await h.run_until_idle(timeout=10)
    assert (await h.get(tid)).snapshot.result == "success: wiped d1"
    await h.close()


async def test_a_user_message_between_answers_goes_to_the_same_kept_run(tmp_path: Path) -> None:
    """R3: a P1 message that arrives while a call runs reaches the next request; the kept run
    asks with it (the request holds the call's result and the message), no run is opened
    again, and the model saw the message."""
    seen_prompts: list[str] = []

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen_prompts.extend(p.content for p in messages[-1].parts
                            if isinstance(p, UserPromptPart) and isinstance(p.content, str))
        returned = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
        if returned >= 2:
            return ModelResponse(parts=[TextPart("done")])
        if returned == 0:  # the person speaks while the first answer's call is yet to run
            await h.emit(tt.Event("user_message", tid, "also say hello", priority=tt.Priority.P1))
        n = len(messages)
        return ModelResponse(parts=[ToolCallPart("echo", {"text": f"t{n}"}, tool_call_id=f"e{n}")])

    agent = tools_agent(Seen(), answer)
    runs = counted_runs(agent)
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}",
                   settings=tt.Settings(recovery_backoff=0.01, poll_interval=0.01))
    h.add_agent("a", PydanticAIAgent(agent, stream=False, tools={"echo": tt.ToolPolicy(idempotent=True)}))
    tid = await h.submit("a", "go")
    await h.run_until_idle(timeout=20)
    info = await h.get(tid)
    await h.close()
    assert info.snapshot.result == "done"
    assert seen_prompts[0] == "go"
    assert any("also say hello" in prompt for prompt in seen_prompts[1:])
    assert len(runs) == 1

"""R1, R14, R17, R22: ``CrewAIAgent`` beyond the conformance suite (issue 31): what it refuses
when it is made, crews of several tasks replayed after a rollback and a fork, and a crew
changed under a running task. The crew is ``_crew_app``'s: five tasks, one tool, a
deterministic model counting its requests in a ledger."""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("crewai", reason="CrewAI runs in its own environment: .ci/crewai-venv")

from crewai import Agent, Crew, Process, Task
from crewai.tools import tool

import tether as tt
from tether.integrations.crewai import CrewAIAgent

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("tether_crew_app_inproc", HERE / "_crew_app.py")
assert _spec is not None and _spec.loader is not None
app = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(app)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("CREW_LEDGER", str(tmp_path / "ledger.db"))
    yield


def asked() -> Counter[int]:
    """Model requests per crew task, from the ledger."""
    return Counter(step for what, step, _ in app.runs() if what == "model")


# ---------------------------------------------------------------------------- refusals


@tool("other")
def other_work(step: int) -> str:
    """Another tool under the same name as the crew's."""
    return "other"


def _agent(**fields: Any) -> Agent:
    return Agent(role="worker", goal="Do the work.", backstory="You work.", tools=[app.work],
                 llm=app.Scripted(model="scripted"), **fields)


def _crew(agent: Agent | None = None, task: dict[str, Any] | None = None,
          **fields: Any) -> Crew:
    worker = agent or _agent()
    return Crew(agents=[worker], tasks=[Task(description="Step 1 of the work: {input}",
                                             expected_output="done", agent=worker,
                                             **(task or {}))], **fields)


def _clash() -> Crew:
    twin = tool("work")(other_work.func)
    first, second = _agent(), Agent(role="other", goal="g", backstory="b", tools=[twin],
                                    llm=app.Scripted(model="scripted"))
    return Crew(agents=[first, second], tasks=[
        Task(description="Step 1 of the work", expected_output="done", agent=first),
        Task(description="Step 2 of the work", expected_output="done", agent=second)])


@pytest.mark.parametrize(("made", "named"), [
    (lambda: _crew(memory=True), "the crew's memory"),
    (lambda: _crew(planning=True), "the crew's planning"),
    (lambda: _crew(step_callback=print), "the crew's a step_callback"),
    (lambda: _crew(_agent(allow_delegation=True)), "delegation of agent 'worker'"),
    (lambda: _crew(task={"async_execution": True}), "asynchronous execution of task"),
    (lambda: _crew(task={"human_input": True}), "human input of task"),
    (lambda: _crew(task={"callback": print}), "a callback of task"),
    (lambda: _crew(process=Process.hierarchical, manager_llm=app.Scripted(model="m")),
     "a manager model"),
    (_clash, "two tools named 'work'"),
], ids=["memory", "planning", "step_callback", "delegation", "async_task", "human_input",
        "task_callback", "hierarchical", "tool_clash"])
def test_r22_what_cannot_be_made_durable_is_refused_by_name(made: Any, named: str) -> None:
    """R22: a crew using a part of CrewAI that tether cannot make durable is refused when the
    agent is made, the part named, before any task runs."""
    with pytest.raises(tt.ConfigurationError, match="cannot make durable") as refused:
        CrewAIAgent(made())
    assert named in str(refused.value), refused.value


def test_r22_a_hook_that_could_block_a_call_is_refused_by_name() -> None:
    """R22: a global before_tool_call hook could block a call of a native answer that tether
    makes itself, so it is refused, named, while it is registered."""
    from crewai.hooks import register_before_tool_call_hook, unregister_before_tool_call_hook

    def no_refunds(context: Any) -> bool | None:
        return False

    register_before_tool_call_hook(no_refunds)
    try:
        with pytest.raises(tt.ConfigurationError, match="before_tool_call hook no_refunds"):
            CrewAIAgent(_crew())
    finally:
        unregister_before_tool_call_hook(no_refunds)
    CrewAIAgent(_crew())  # without it, the crew is taken


def test_r22_only_a_crew_or_an_agent_is_taken() -> None:
    with pytest.raises(tt.ConfigurationError, match="takes a CrewAI Crew or Agent, not Task"):
        CrewAIAgent(Task(description="d", expected_output="e"))  # type: ignore[arg-type]


def test_r22_a_single_agent_is_checked_as_its_crew_would_be() -> None:
    with pytest.raises(tt.ConfigurationError, match="delegation of agent 'worker'"):
        CrewAIAgent(_agent(allow_delegation=True))


async def test_r17_a_single_agent_is_a_crew_of_one_task(tmp_path: Path) -> None:
    """R17: a single CrewAI agent runs as a crew of one task whose description is the task's
    input: its tool call a tether call, its answer the task's result."""
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}", settings=app.SETTINGS)
    h.add_agent("alone", CrewAIAgent(_agent(), tools={"work": tt.ToolPolicy(idempotent=True)}))
    async with h:
        task = await h.submit("alone", "Step 1 of the work: the list")
        await h.run_until_idle(timeout=60)
        info = await h.get(task)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "step 1 done"
    assert asked() == Counter({1: 2}) and [w for w, *_ in app.runs()].count("work") == 1


def test_r22_a_policy_for_a_tool_the_crew_lacks_is_refused() -> None:
    with pytest.raises(tt.ConfigurationError, match="names refund, which the crew does not"):
        CrewAIAgent(_crew(), tools={"refund": tt.ToolPolicy(side_effect=True)})


# ---------------------------------------------------------------------------- crews of tasks


async def _run_until_limited(tmp_path: Path) -> tuple[str, int]:
    """Run the crew with a budget of 4 completions: it stops (needs_human) with tasks 1 and 2
    done. The task and its version then."""
    h = app.harness(str(tmp_path / "t.db"), max_completions=4)
    async with h:
        task = await h.submit("crew", "the list")
        await h.run_until_idle(timeout=60)
        info = await h.get(task)
    assert info.record.status is tt.Status.NEEDS_HUMAN, info.record.reason
    assert asked() == Counter({1: 2, 2: 2}), asked()
    return task, info.record.head_version


async def test_r09_r14_a_rolled_back_crew_replays_its_first_tasks_and_asks_for_the_rest(
        tmp_path: Path) -> None:
    """R9, R14: a crew stopped after tasks 1 and 2 (a completion budget), resumed and run to
    the end, then rolled back to the version it stopped at (paused, as a task stopped for a
    person is) and resumed: the run from that version replays tasks 1 and 2 from the dialog
    (their model not asked again) and asks for 3 to 5 again; the task completes with task
    5's answer both times."""
    task, version = await _run_until_limited(tmp_path)
    async with app.harness(str(tmp_path / "t.db")) as h:
        await h.resume(task)
        await h.run_until_idle(timeout=60)
        assert (await h.get(task)).snapshot.result == "step 5 done"
        assert asked() == Counter({n: 2 for n in range(1, 6)}), asked()
        await h.rollback(task, version)
        await h.run_until_idle(timeout=60)
        assert (await h.get(task)).record.status is tt.Status.PAUSED  # as it was then
        await h.resume(task)
        await h.run_until_idle(timeout=60)
        info = await h.get(task)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "step 5 done"
    assert asked() == Counter({1: 2, 2: 2, 3: 4, 4: 4, 5: 4}), asked()


async def test_r09_r14_a_fork_of_a_crew_replays_the_source_and_goes_on_alone(
        tmp_path: Path) -> None:
    """R9, R14: a fork of the crew at the version after its second task runs tasks 3 to 5
    (tasks 1 and 2 replayed from the source's dialog, their model not asked), under keys of
    its own; the source is untouched."""
    task, version = await _run_until_limited(tmp_path)
    async with app.harness(str(tmp_path / "t.db")) as h:
        fork = await h.fork(task, version)
        await h.run_until_idle(timeout=60)
        assert (await h.get(fork)).record.status is tt.Status.PAUSED  # as the source was then
        await h.resume(fork)
        await h.run_until_idle(timeout=60)
        info, source = await h.get(fork), await h.get(task)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "step 5 done"
    assert source.record.status is tt.Status.NEEDS_HUMAN
    assert asked() == Counter({n: 2 for n in range(1, 6)}), asked()
    worked = [(step, key) for what, step, key in app.runs() if what == "work"]
    assert [step for step, _ in worked] == [1, 2, 3, 4, 5], worked
    assert all(fork in key for step, key in worked if step >= 3), worked


async def test_r14_a_task_deleted_and_submitted_again_under_its_id_starts_its_crew_anew(
        tmp_path: Path) -> None:
    """R14: a crew stopped after tasks 1 and 2 (a budget of 4 completions) is deleted and
    submitted again under the same id, in the same harness, whose agent still keeps the first
    task's run: the new task replays nothing of the old one. Its model is asked again for
    tasks 1 and 2, and its tool runs again under keys that are not the old task's."""
    async with app.harness(str(tmp_path / "t.db"), max_completions=4) as h:
        task = await h.submit("crew", "the list")
        await h.run_until_idle(timeout=60)
        assert (await h.get(task)).record.status is tt.Status.NEEDS_HUMAN
        first_keys = {key for what, _, key in app.runs() if what == "work"}
        await h.delete(task)
        assert await h.submit("crew", "the list", task_id=task) == task
        await h.run_until_idle(timeout=60)
        info = await h.get(task)
    assert info.record.status is tt.Status.NEEDS_HUMAN, info.record.reason
    assert asked() == Counter({1: 4, 2: 4}), asked()
    again = [key for what, _, key in app.runs() if what == "work"][len(first_keys):]
    assert len(first_keys) == 2 and len(again) == 2 and not first_keys & set(again), again


async def test_r17_a_crew_changed_under_a_running_task_is_not_guessed_at(
        tmp_path: Path) -> None:
    """R17, R22: the crew's code changed while a task was half-way (its agent renamed): the
    replay finds the dialog's answers were asked by another agent and the plan fails naming
    both, instead of handing the new crew answers made for the old one. Nothing runs again."""
    task, _ = await _run_until_limited(tmp_path)
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}", settings=app.SETTINGS.replace(
        max_recovery_attempts=1))
    h.add_agent("crew", CrewAIAgent(app.crew(first_role="renamed"),
                                    tools={"work": tt.ToolPolicy(idempotent=True)}))
    async with h:
        await h.resume(task)
        await h.run_until_idle(timeout=60)
        info = await h.get(task)
        log = [str(r) for r in await h.store.list_recovery_log(task)]
    assert info.record.status is tt.Status.NEEDS_HUMAN, info.record.reason
    said = " ".join([info.record.reason or "", *log])
    assert "asked by agent 'renamed' where the dialog has it from 'worker'" in said, said
    assert asked() == Counter({1: 2, 2: 2}), asked()


async def test_r13_tasks_of_one_crew_run_side_by_side_and_one_after_another(
        tmp_path: Path) -> None:
    """R13: three tasks of one crew at once, then two more: each runs a copy of the crew of
    its own (a copy whose kickoff ended is kicked off again by a later task), and each gets
    its own answers: every crew task of every task asked its model twice, and ran its tool
    once under a key of its own task."""
    async with app.harness(str(tmp_path / "t.db")) as h:
        first = [await h.submit("crew", f"list {n}") for n in range(3)]
        await h.run_until_idle(timeout=60)
        later = [await h.submit("crew", f"list {n}") for n in range(3, 5)]
        await h.run_until_idle(timeout=60)
        infos = [await h.get(task) for task in [*first, *later]]
    assert all(i.record.status is tt.Status.COMPLETED for i in infos), infos
    assert all(i.snapshot.result == "step 5 done" for i in infos)
    assert asked() == Counter({n: 10 for n in range(1, 6)}), asked()
    worked = [key for what, _, key in app.runs() if what == "work"]
    assert len(worked) == 25 and len(set(worked)) == 25
    assert all(sum(task in key for key in worked) == 5 for task in [*first, *later]), worked


async def test_r17_tools_given_to_a_task_are_tether_calls_too(tmp_path: Path) -> None:
    """R17: a crew whose tool is given to its tasks (not to its agent): each call of it is
    a tether call under a key of its own, run once, answered as the tool returned."""
    model = app.Scripted(model="scripted")
    worker = Agent(role="worker", goal="Do the work.", backstory="You work.", llm=model)
    tasks = [Task(description=f"Step {n} of the work: {{input}}", agent=worker, tools=[app.work],
                  expected_output=f"step {n} done") for n in (1, 2)]
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}", settings=app.SETTINGS)
    h.add_agent("crew", CrewAIAgent(Crew(agents=[worker], tasks=tasks),
                                    tools={"work": tt.ToolPolicy(idempotent=True)}))
    async with h:
        task = await h.submit("crew", "the list")
        await h.run_until_idle(timeout=60)
        info = await h.get(task)
        calls = [r for r in await h.history(task) if "tool_call" in r]
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "step 2 done"
    assert asked() == Counter({1: 2, 2: 2}), asked()
    assert [r["tool_call"]["name"] for r in calls] == ["crew.work", "crew.work"], calls
    assert len({r["tool_call"]["key"] for r in calls}) == 2, calls

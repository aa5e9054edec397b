"""TaskSaver: a graph's newest checkpoint as plain data (R8, R14; issue 28).

The graph is driven one super-step at a time, as LangGraphAgent drives it; after every step
the saver is turned into JSON text and read back into a new saver, as a task's scratch is
committed and loaded. The run must end exactly as an uninterrupted run with LangGraph's own
InMemorySaver: same output, a finished sibling of an interrupted node never run again.
"""

from __future__ import annotations

import json
import operator
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from tether.integrations.langgraph_saver import TaskSaver


class State(TypedDict):
    n: int
    log: Annotated[list[str], operator.add]


def graph(ran: list[str]) -> Any:
    def a(state: State) -> dict[str, Any]:
        ran.append("a")
        return {"n": state["n"] + 1, "log": ["a"]}

    def b(state: State) -> dict[str, Any]:
        ran.append("b")
        return {"log": [f"b {interrupt('ok?')}"]}

    def c(state: State) -> dict[str, Any]:
        ran.append("c")
        return {"log": ["c"]}

    def d(state: State) -> dict[str, Any]:
        ran.append("d")
        return {"log": [f"d {state['n']}"]}

    builder = StateGraph(State)
    for node in (a, b, c, d):
        builder.add_node(node)
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("a", "c")
    builder.add_edge("b", "d")
    builder.add_edge("c", "d")
    builder.add_edge("d", END)
    return builder.compile()


async def stepwise(saver_of: Any, ran: list[str]) -> dict[str, Any]:
    """Run the graph a super-step at a time, a new saver from *saver_of* each step."""
    compiled = graph(ran)
    nodes = ["a", "b", "c", "d"]
    config: Any = {"configurable": {"thread_id": "t"}}
    given: Any = {"n": 0, "log": []}
    kept: Any = None
    values: dict[str, Any] = {}
    for _ in range(20):
        saver = saver_of(kept)
        run = compiled.copy(update={"checkpointer": saver})
        asked: list[Any] = []
        stopped = False
        async for mode, chunk in run.astream(given, config, interrupt_before=nodes,
                                             stream_mode=["values", "updates"]):
            if mode == "values":
                values = chunk
            elif "__interrupt__" in chunk:
                stopped, asked = True, asked + list(chunk["__interrupt__"])
        kept = saver.plain() if isinstance(saver, TaskSaver) else saver
        if not stopped:
            return values
        given = Command(resume={asked[0].id: "yes"}) if asked else None
    raise AssertionError("the graph never ended")


async def test_r08_a_checkpoint_read_back_from_json_every_step_runs_as_an_unbroken_one() -> None:
    ours: list[str] = []
    result = await stepwise(
        lambda kept: TaskSaver.from_plain(json.loads(json.dumps(kept)) if kept else None), ours)
    theirs: list[str] = []
    memory = InMemorySaver()
    expected = await stepwise(lambda kept: memory, theirs)
    assert result == expected == {"n": 1, "log": ["a", "b yes", "c", "d 1"]}
    assert ours == theirs
    assert ours.count("c") == 1 and ours.count("b") == 2  # c's writes were kept while b waited


async def test_r08_a_saver_keeps_only_the_newest_checkpoint_and_its_current_channels() -> None:
    saver = TaskSaver()
    run = graph([]).copy(update={"checkpointer": saver})
    config: Any = {"configurable": {"thread_id": "t"}}
    async for _ in run.astream({"n": 0, "log": []}, config, interrupt_before=["b", "c"]):
        pass
    plain = saver.plain()
    assert list(plain) == [""]  # one namespace, one checkpoint
    newest = plain[""]
    state = await run.aget_state(config)
    assert newest["id"] == state.config["configurable"]["checkpoint_id"]
    again = TaskSaver.from_plain(json.loads(json.dumps(plain)))
    found = again.get_tuple(config)
    assert found is not None
    versions = found.checkpoint["channel_versions"]
    assert {c: v for c, (v, _) in newest["blobs"].items()} == versions  # no older version kept
    assert again.get_tuple({"configurable": {"thread_id": "t", "checkpoint_id": "old"}}) is None

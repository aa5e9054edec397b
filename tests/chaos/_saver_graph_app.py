"""The child of ``test_r10_tether_saver_killed.py``: a four-node LangGraph graph whose
checkpoints TetherSaver keeps in a tether store, run until a node blocks (to be SIGKILLed
there) or, resumed, to its end.

    python _saver_graph_app.py STORE_URL LEDGER run|resume [BLOCK_AT]

Each node first records that it started in the ledger (its own SQLite file, committed at
once), so the parent counts what ran again across the kill."""

from __future__ import annotations

import asyncio
import json
import operator
import sqlite3
import sys
import time
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from tether.integrations.tether_saver import TetherSaver
from tether.store import open_store

NODES = ("plan", "fetch", "write", "send")
THREAD = {"configurable": {"thread_id": "report-1"}}


class Report(TypedDict):
    log: Annotated[list[str], operator.add]
    messages: Annotated[list[Any], add_messages]


def node(name: str, ledger: str, block_at: str | None) -> Any:
    def run(state: Report) -> dict[str, Any]:
        with sqlite3.connect(ledger) as db:
            db.execute("CREATE TABLE IF NOT EXISTS runs (what TEXT)")
            db.execute("INSERT INTO runs VALUES (?)", (name,))
        if name == block_at:
            print(f"IN {name}", flush=True)
            time.sleep(3600)  # the parent kills the process here
        return {"log": [name], "messages": [AIMessage(f"{name} done " + "x" * 200, id=name)]}
    return run


def graph(saver: TetherSaver, ledger: str, block_at: str | None) -> Any:
    builder = StateGraph(Report)
    for name in NODES:
        builder.add_node(name, node(name, ledger, block_at))
    for before, after in zip((START, *NODES), (*NODES, END), strict=True):
        builder.add_edge(before, after)
    return builder.compile(checkpointer=saver)


async def main(url: str, ledger: str, mode: str, block_at: str | None) -> None:
    store = open_store(url)
    await store.migrate()
    try:
        app = graph(TetherSaver(store), ledger, block_at)
        print("READY", flush=True)
        state = await app.ainvoke({"log": [], "messages": []} if mode == "run" else None, THREAD,
                                  durability="sync")  # each super-step stored before the next
        print("DONE " + json.dumps({"log": state["log"],
                                    "messages": [m.id for m in state["messages"]]}), flush=True)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], (sys.argv[4:] or [None])[0]))

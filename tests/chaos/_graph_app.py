"""A hand-built LangGraph graph under tether, in a process the chaos tests SIGKILL (R10, R11).

``python _graph_app.py DB LEDGER`` submits one task (printing ``TASK <id>``) and works on it
until it settles; the parent kills it where ``GRAPH_BLOCK`` names (a node, a tool), then
finishes the task with a harness of its own on the same store, importing this module for
the same code. Every node run and every side effect is a row in the ledger, written (and
committed) before the process blocks, so the parent counts what ran again.

The graph: ``START -> prepare -> pay -> (ask -> tools) -> ship -> END``. ``pay`` calls the
side-effecting ``charge`` (a ``tether_tool``); ``ask`` answers with a call of ``lookup``, an
idempotent tool of a ``ToolNode`` built with ``through_tether``.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import time
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

import tether as tt
from tether.integrations.langgraph import LangGraphAgent, tether_tool, through_tether

SETTINGS = tt.Settings(lease_seconds=1.0, poll_interval=0.02, recovery_backoff=0.01)


def ledger() -> sqlite3.Connection:
    db = sqlite3.connect(os.environ["GRAPH_LEDGER"], isolation_level=None)
    db.execute("create table if not exists runs (what text, key text)")
    return db


def mark(what: str, key: str = "") -> None:
    with ledger() as db:
        db.execute("insert into runs values (?, ?)", (what, key))


def block(point: str) -> None:
    """Stop here for the parent's SIGKILL, the first time the run reaches *point*."""
    if os.environ.get("GRAPH_BLOCK") == point and os.environ.get("GRAPH_CHILD") == "1":
        print(f"IN {point}", flush=True)
        time.sleep(600)


@tether_tool
async def charge(order: str, amount: int) -> dict[str, Any]:
    """Charge an order: a side effect, marked in the ledger with tether's key."""
    key = tt.current_call().idempotency_key
    mark("charge", key)
    block("charge")
    return {"charged": amount, "key": key}


async def find_charge(ctx: tt.ToolContext, order: str, amount: int) -> Any:
    """The reconcile hook: the ledger says whether the charge with this key happened."""
    with ledger() as db:
        found = db.execute("select 1 from runs where what = 'charge' and key = ?",
                           (ctx.idempotency_key,)).fetchone()
    return {"charged": amount, "key": ctx.idempotency_key, "found": True} if found else None


@tool
async def lookup(order: str) -> str:
    """Look an order up (idempotent)."""
    mark("lookup", tt.current_call().idempotency_key)
    block("lookup")
    return f"order {order}: paid"


class State(TypedDict):
    order: str
    messages: Annotated[list[AnyMessage], add_messages]
    log: list[str]


def prepare(state: State) -> dict[str, Any]:
    mark("prepare")
    return {"log": ["prepared"]}


async def pay(state: State) -> dict[str, Any]:
    mark("pay")
    block("pay")
    paid = await charge(state["order"], 5)
    return {"log": [*state["log"], f"paid {paid['charged']}"]}


def ask(state: State) -> dict[str, Any]:
    mark("ask")
    if any(m.type == "tool" for m in state["messages"]):
        return {"messages": [AIMessage("looked up")]}
    return {"messages": [AIMessage("", tool_calls=[
        {"name": "lookup", "args": {"order": state["order"]}, "id": "call_lookup"}])]}


def route(state: State) -> str:
    return "tools" if state["messages"][-1].tool_calls else "ship"


def ship(state: State) -> dict[str, Any]:
    mark("ship")
    block("ship")
    return {"log": [*state["log"], "shipped"]}


def graph() -> Any:
    builder = StateGraph(State)
    builder.add_node(prepare)
    builder.add_node(pay)
    builder.add_node(ask)
    builder.add_node("tools", ToolNode([lookup], awrap_tool_call=through_tether))
    builder.add_node(ship)
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "pay")
    builder.add_edge("pay", "ask")
    builder.add_conditional_edges("ask", route, ["tools", "ship"])
    builder.add_edge("tools", "ask")
    builder.add_edge("ship", END)
    return builder.compile()


def harness(db: str) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}", settings=SETTINGS)
    reconcile = find_charge if os.environ.get("GRAPH_RECONCILE") == "1" else None
    h.add_agent("orders", LangGraphAgent(graph(), calls=[charge], tools={
        "lookup": tt.ToolPolicy(idempotent=True),
        "charge": tt.ToolPolicy(side_effect=True, reconcile=reconcile)}))
    return h


async def main(db: str) -> None:
    h = harness(db)
    task = await h.submit("orders", {"order": "A1", "messages": [], "log": []})
    print(f"TASK {task}", flush=True)
    await h.run_until_idle(timeout=60)
    await h.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))

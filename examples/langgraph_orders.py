"""A hand-built LangGraph graph run durably by tether: an order is checked, charged, approved
by a person and shipped.

    python examples/langgraph_orders.py [--db orders.db]

The graph is plain LangGraph: a ``StateGraph`` of four nodes. Two lines make it durable:
``charge`` is decorated with ``@tether_tool`` (under tether, the node's call is a tether
call with an idempotency key, made once; elsewhere it runs as written), and
``LangGraphAgent`` runs the graph one super-step at a time, each committed. ``approve``
asks a person with LangGraph's own ``interrupt()``: under tether the task waits for an
``approval`` event (the console, ``tether emit``, the API or a webhook); here the script
answers it itself, as a person would.
"""

from __future__ import annotations

import argparse
import asyncio
import operator
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import tether as tt
from tether.integrations.langgraph import LangGraphAgent, tether_tool

CHARGES: dict[str, dict[str, Any]] = {}
"""The payment service: charges by idempotency key (a retry with the same key is one charge)."""


@tether_tool
async def charge(order: str, amount: int) -> dict[str, Any]:
    """Charge the customer; the key makes a repeated request one charge."""
    key = tt.current_call().idempotency_key
    return CHARGES.setdefault(key, {"order": order, "amount": amount, "receipt": f"R-{order}"})


async def find_charge(ctx: tt.ToolContext, order: str, amount: int) -> dict[str, Any] | None:
    """After a crash mid-charge: ask the payment service whether it happened."""
    return CHARGES.get(ctx.idempotency_key)


class Order(TypedDict):
    order: str
    amount: int
    log: Annotated[list[str], operator.add]


def check(state: Order) -> dict[str, Any]:
    return {"log": [f"checked {state['order']}"]}


async def pay(state: Order) -> dict[str, Any]:
    paid = await charge(state["order"], state["amount"])
    return {"log": [f"charged {paid['amount']} EUR ({paid['receipt']})"]}


def approve(state: Order) -> dict[str, Any]:
    answer = interrupt({"question": f"Ship order {state['order']}?"})
    return {"log": [f"approved by {answer.get('by', 'someone')}" if isinstance(answer, dict)
                    else f"approved: {answer}"]}


def ship(state: Order) -> dict[str, Any]:
    return {"log": [f"shipped {state['order']}"]}


def order_graph() -> Any:
    builder = StateGraph(Order)
    for node in (check, pay, approve, ship):
        builder.add_node(node)
    builder.add_edge(START, "check")
    builder.add_edge("check", "pay")
    builder.add_edge("pay", "approve")
    builder.add_edge("approve", "ship")
    builder.add_edge("ship", END)
    return builder.compile()


async def run(db: str) -> None:
    harness = tt.Harness(f"sqlite:///{db}")
    harness.add_agent("orders", LangGraphAgent(order_graph(), calls=[charge], tools={
        "charge": tt.ToolPolicy(reconcile=find_charge)}))
    async with harness:
        task = await harness.submit("orders", {"order": "A1", "amount": 40, "log": []})
        await harness.run_until_idle()
        waiting = await harness.get(task)
        print(f"{waiting.record.status.value}: {waiting.record.reason or 'a person is asked'}")
        await harness.emit(tt.Event("approval", task, {"approved": True, "by": "ops"}))
        await harness.run_until_idle()
        info = await harness.get(task)
        print(f"{info.record.status.value}: {'; '.join(info.snapshot.result['log'])}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--db", default="orders.db", help="the SQLite file tether keeps")
    asyncio.run(run(parser.parse_args().db))

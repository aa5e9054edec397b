"""The source's scenarios as runnable example agents (used by ``tether demo`` and the CLI).

- ``contracts``: a batch of contracts; a user cuts in with "stop, re-parse #5"
  and the batch then continues from exactly where it was (R1, R9, R15).
- ``refund``: a side-effecting refund whose worker is killed mid-call and
  recovered by ``reconcile`` with no second refund (R10).
- ``report``: a report analysis with nested subtasks (R9).
- ``inventory``: a flaky upstream, retried with backoff, then handed to a
  person who points it at a mirror and resumes it (R12, R22, R26).

``build_harness(store_url)`` registers them all; ``demo_app`` is the default
application of the CLI (``--app tether.examples:demo_app``).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import tether as tt
from tether.examples.ledger import Ledger

FAST_SETTINGS = tt.Settings(lease_seconds=2.0, poll_interval=0.05, recovery_backoff=0.05)


def contract_files(count: int = 20) -> list[str]:
    return [f"contract-{n:02d}.pdf" for n in range(1, count + 1)]


class ContractBatch(tt.Agent):
    """Parses contracts one by one; a user interrupt spawns a re-parse on top of the stack."""

    async def plan(self, task: tt.TaskView) -> tt.Action:
        files = task.input["files"]
        index = task.scratch.get("next", 0)
        if index >= len(files):
            return tt.Finish({"parsed": index - len(task.scratch.get("skipped", [])),
                              "skipped": task.scratch.get("skipped", []),
                              "reparsed": task.scratch.get("reparsed", [])})
        task.scratch["next"] = index + 1
        return tt.ToolCall("parse_contract", {"file": files[index]})

    async def on_event(self, task: tt.TaskView, event: tt.Event) -> tt.Action | None:
        if event.type == "user_interrupt" and isinstance(event.payload, dict) \
                and event.payload.get("reparse"):
            task.scratch.setdefault("reparsed", []).append(event.payload["reparse"])
            return tt.Spawn("reparse_contract", {"file": event.payload["reparse"]})
        if event.type == "tool_error":
            failed = event.payload["key"]
            task.scratch.setdefault("skipped", []).append(failed)
            return tt.Reply(f"skipped a contract that could not be parsed: {event.payload['error']}")
        return None


class ReparseContract(tt.Agent):
    """A one-call subtask: parse one file again, hand the result back to the batch."""

    async def plan(self, task: tt.TaskView) -> tt.Action:
        if task.last_tool_result is None:
            return tt.ToolCall("parse_contract", {"file": task.input["file"], "careful": True})
        return tt.Finish(task.last_tool_result)


class RefundAgent(tt.Agent):
    """Refunds each order of the input once."""

    async def plan(self, task: tt.TaskView) -> tt.Action:
        orders = task.input["orders"]
        index = task.scratch.get("next", 0)
        if index >= len(orders):
            return tt.Finish({"orders_refunded": len(orders)})
        task.scratch["next"] = index + 1
        order = orders[index]
        return tt.ToolCall("refund", {"order_id": order["id"], "cents": order["cents"]})


class ReportAnalysis(tt.Agent):
    """Analyse a financial report through three subtasks, the second with its own subtask."""

    STAGES = ("extract_metrics", "compare_history", "write_summary")

    async def plan(self, task: tt.TaskView) -> tt.Action:
        stage = task.scratch.get("stage", 0)
        if stage > 0:
            task.scratch.setdefault("results", {})[self.STAGES[stage - 1]] = task.child_result
        if stage >= len(self.STAGES):
            return tt.Finish(task.scratch["results"])
        task.scratch["stage"] = stage + 1
        return tt.Spawn(self.STAGES[stage], {"report": task.input["report"],
                                             "so_far": task.scratch.get("results", {})})


class OneToolStage(tt.Agent):
    """A subtask that calls one tool and finishes with its result."""

    def __init__(self, tool: str, child: str | None = None) -> None:
        self.tool = tool
        self.child = child

    async def plan(self, task: tt.TaskView) -> tt.Action:
        if self.child and "prior" not in task.scratch:
            task.scratch["prior"] = True
            return tt.Spawn(self.child, task.input)
        if task.last_tool_result is None:
            args = {"report": task.input["report"]}
            if self.child:
                args["prior"] = task.child_result
            return tt.ToolCall(self.tool, args)
        return tt.Finish(task.last_tool_result)


class InventorySync(tt.Agent):
    """Fetch inventory from the source named in scratch (a person may switch it)."""

    async def plan(self, task: tt.TaskView) -> tt.Action:
        if task.last_tool_result is not None:
            return tt.Finish(task.last_tool_result)
        return tt.ToolCall("fetch_inventory", {"source": task.scratch.get("source", "primary")})


def build_harness(store: str | None = None, ledger_path: str | None = None,
                  settings: tt.Settings | None = None, **kwargs: Any) -> tt.Harness:
    """A harness with every example agent and tool registered."""
    harness = tt.Harness(store, settings=settings or FAST_SETTINGS, **kwargs)
    ledger_file = ledger_path or os.environ.get("TETHER_DEMO_LEDGER", "ledger.db")
    ledger: Ledger | None = None

    def get_ledger() -> Ledger:
        nonlocal ledger
        ledger = ledger or Ledger(ledger_file)
        return ledger

    @harness.tool(idempotent=True, timeout=10)
    async def parse_contract(ctx: tt.ToolContext, file: str, careful: bool = False) -> dict[str, Any]:
        await asyncio.sleep(float(os.environ.get("TETHER_DEMO_PARSE_SECONDS", "0.02")))
        number = int(file.split("-")[1].split(".")[0])
        return {"file": file, "parties": 2, "value_eur": 1000 * number, "careful": careful}

    @harness.tool(side_effect=True, timeout=60, retry=tt.RetryPolicy(max_attempts=1))
    async def refund(ctx: tt.ToolContext, order_id: str, cents: int) -> dict[str, Any]:
        result = get_ledger().refund(order_id, cents, reference=ctx.idempotency_key)
        if order_id == os.environ.get("TETHER_DEMO_SLOW_ORDER"):
            await asyncio.sleep(60)
        return result

    @refund.reconcile
    async def _find_refund(ctx: tt.ToolContext, order_id: str, cents: int) -> dict[str, Any] | None:
        return get_ledger().find(ctx.idempotency_key)

    for name in ("extract_metrics", "compare_history", "write_summary", "fetch_prior_year"):
        harness.tool(idempotent=True, name=name)(_stage_tool(name))

    @harness.tool(idempotent=True, timeout=5,
                  retry=tt.RetryPolicy(max_attempts=3, backoff=0.05))
    async def fetch_inventory(ctx: tt.ToolContext, source: str) -> dict[str, Any]:
        if source == "primary":
            raise ConnectionError(f"upstream {source} answered 503 (request {ctx.attempt})")
        return {"source": source, "skus": 1284}

    harness.add_agent("contracts", ContractBatch())
    harness.add_agent("reparse_contract", ReparseContract())
    harness.add_agent("refund", RefundAgent())
    harness.add_agent("report", ReportAnalysis())
    harness.add_agent("extract_metrics", OneToolStage("extract_metrics"))
    harness.add_agent("compare_history", OneToolStage("compare_history", child="prior_year"))
    harness.add_agent("prior_year", OneToolStage("fetch_prior_year"))
    harness.add_agent("write_summary", OneToolStage("write_summary"))
    harness.add_agent("inventory", InventorySync())
    return harness


def _stage_tool(name: str) -> Any:
    async def stage(ctx: tt.ToolContext, report: str, prior: Any = None) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return {"stage": name, "report": report, "prior": prior}

    stage.__name__ = name
    return stage


def demo_app(store: str | None = None) -> tt.Harness:
    """The CLI's default application: every example, on the given store."""
    return build_harness(store)

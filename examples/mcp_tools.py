"""An MCP server's tools under tether: registered in one call, a crash mid-refund survived.

    python examples/mcp_tools.py             # no model needed: a scripted agent calls the tools
    python examples/mcp_tools.py --fake      # the same (accepted like the other examples)

The file is both sides. Run with ``serve`` it is a small payments MCP server (the mcp SDK's
MCPServer, over stdio) keeping refunds in a JSON ledger, deduplicated by the idempotency key
tether sends in each request's ``_meta``. Run without it, it starts that server as a child
process, registers its tools on a harness and runs a task that looks an order up and
refunds it. The first refund crashes the server after the money moved and before it
answers: tether does not pay again, it asks the ``reconcile`` hook, which looks the key up
through the server's own read-only ``find_refund`` tool (a new process by then).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

import tether as tt
from tether.integrations.mcp import META_KEY, MCPTools


def serve() -> None:
    """The MCP server: three tools, a ledger file, a crash after the first refund."""
    ledger = Path(os.environ["LEDGER"])
    server = MCPServer("payments", version="1.0", log_level="WARNING")

    def refunds() -> dict[str, dict[str, Any]]:
        done: dict[str, dict[str, Any]] = json.loads(ledger.read_text()) if ledger.exists() else {}
        return done

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def lookup_order(order: str) -> dict[str, Any]:
        """The order's total and status."""
        return {"order": order, "total_cents": 4200, "status": "delivered damaged"}

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def find_refund(key: str) -> dict[str, Any]:
        """The refund made under an idempotency key, if any ({} if none)."""
        return refunds().get(key, {})

    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    def refund(order: str, cents: int, ctx: Context) -> dict[str, Any]:
        """Refund an order (once per idempotency key)."""
        key = str((ctx.request_context.meta or {}).get(META_KEY))
        done = refunds()
        if key not in done:
            done[key] = {"order": order, "cents": cents, "refund_id": f"R{len(done) + 1}"}
            ledger.write_text(json.dumps(done))
            if not ledger.with_suffix(".crashed").exists():  # once: the answer is lost
                ledger.with_suffix(".crashed").touch()
                os._exit(9)
        return done[key]  # a key seen before: the refund it made

    server.run("stdio")


class RefundDamaged(tt.Agent):
    """Looks the order up, refunds it in full, finishes with what happened."""

    async def plan(self, task: tt.TaskView) -> tt.Action:
        step = task.scratch.get("step", 0)
        task.scratch["step"] = step + 1
        if step == 0:
            return tt.ToolCall("pay_lookup_order", {"order": task.input["order"]})
        if step == 1:
            total = task.last_tool_result["total_cents"]
            return tt.ToolCall("pay_refund", {"order": task.input["order"], "cents": total})
        return tt.Finish({"refund": task.last_tool_result})


async def run(db: str, ledger: Path) -> None:
    harness = tt.Harness(f"sqlite:///{db}")
    harness.add_agent("refund_damaged", RefundDamaged())

    async def find_refund(ctx: tt.ToolContext, order: str, cents: int) -> dict[str, Any] | None:
        """Asked when a refund's outcome is unknown: did the provider pay under this key?"""
        found = await harness.tools["pay_find_refund"](ctx, key=ctx.idempotency_key)
        return found or None

    async with harness, MCPTools.stdio(harness, sys.executable, [__file__, "serve"],
                                       env={"LEDGER": str(ledger)}, prefix="pay_",
                                       reconcile={"refund": find_refund}) as tools:
        task_id = await harness.submit("refund_damaged", {"order": "A-17"})
        await harness.run_until_idle()  # workers run inside the block: the tools are there
        info = await harness.get(task_id)
        log = await harness.reads.recovery_log(task_id)
    print(f"{info.record.status.value}: {info.snapshot.result or info.record.reason}")
    print("tools:", ", ".join(f"{t.name} ({'side effect' if t.side_effect else 'idempotent'})"
                              for t in tools.registered))
    print("recovery:", " -> ".join(r["resume_strategy"] for r in log) or "none needed")
    print("ledger:", json.loads(ledger.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", choices=["serve"], help="run as the MCP server")
    parser.add_argument("--fake", action="store_true", help="no model needed (always true here)")
    parser.add_argument("--db", help="tether's SQLite file (default: a temporary one)")
    args = parser.parse_args()
    if args.mode == "serve":
        serve()
        return
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(args.db or os.path.join(tmp, "tether.db"), Path(tmp) / "ledger.json"))


if __name__ == "__main__":
    main()

"""The application of ``tests/integration/test_cli_lifespan.py``: an app with lifespans, run by
real ``tether worker`` and ``tether serve --with-worker`` processes as
``--app _lifespan_app:harness`` (this folder on PYTHONPATH).

Everything it does is written to ``LIFESPAN_DIR/journal.txt``, one line per act, appended
and flushed by the one process that acts (the worker), so the file's order is the order the
worker did things in:

- ``enter <name>`` / ``exit <name>``: a lifespan's code before and after its ``yield``
  (lifespans ``first`` and ``second``, in that order of registration);
- ``call start <task> <i>`` / ``call end <task> <i>``: the side-effecting tool ``record``;
- ``enter mcp refunds=<n> tools=<names>`` / ``exit mcp refunds=<n>``: the MCP lifespan (only
  with ``LIFESPAN_MCP=1``), with the refunds in the MCP server's ledger at that moment.

The environment says what goes wrong: ``LIFESPAN_FAIL=enter`` makes ``second`` raise before
its ``yield`` (``first`` is entered by then), ``LIFESPAN_FAIL=exit`` makes it raise after.
``LIFESPAN_DIR/gates/<task>``, while it exists, holds the task's calls inside ``record``
(after ``call start``), and ``gates/<task>.at`` says one got there.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import tether as tt

MCP_SERVER = Path(__file__).with_name("_mcp_server.py")


def folder() -> Path:
    return Path(os.environ["LIFESPAN_DIR"])


def journal(line: str) -> None:
    with open(folder() / "journal.txt", "a") as out:
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


def read_journal(where: Path) -> list[str]:
    path = where / "journal.txt"
    return path.read_text().splitlines() if path.exists() else []


def ledger_refunds(path: Path) -> int:
    """Refunds in the MCP server's ledger (none before it made its table)."""
    if not path.exists():
        return 0
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as db:
        try:
            return int(db.execute("SELECT COUNT(*) FROM refunds").fetchone()[0])
        except sqlite3.OperationalError:  # no table yet
            return 0


class Calls(tt.Agent):
    """Makes ``input.calls`` calls of ``record``, one per step, then finishes."""

    async def plan(self, task: tt.TaskView) -> tt.Action:
        i = int(task.scratch.get("i", 0))
        if i >= int(task.input["calls"]):
            return tt.Finish({"calls": i})
        task.scratch["i"] = i + 1
        return tt.ToolCall("record", {"i": i})


class MCPRefund(tt.Agent):
    """Refunds an order through the MCP server's ``refund``, reads its balance, finishes."""

    async def plan(self, task: tt.TaskView) -> tt.Action:
        step = int(task.scratch.get("step", 0))
        task.scratch["step"] = step + 1
        order = task.input["order"]
        if step == 0:
            return tt.ToolCall("pay_refund", {"order": order, "cents": 250})
        if step == 1:
            task.scratch["refund"] = task.last_tool_result
            return tt.ToolCall("pay_read_balance", {"order": order})
        return tt.Finish({"refund": task.scratch["refund"], "balance": task.last_tool_result})


def harness(url: str) -> tt.Harness:
    """The factory ``--app _lifespan_app:harness`` names."""
    h = tt.Harness(url, settings=tt.Settings(poll_interval=0.02, housekeeping_interval=3600.0))
    fail = os.environ.get("LIFESPAN_FAIL", "")

    @h.lifespan
    async def first(h: tt.Harness) -> AsyncIterator[None]:
        journal("enter first")
        yield
        journal("exit first")

    @h.lifespan
    async def second(h: tt.Harness) -> AsyncIterator[None]:
        if fail == "enter":
            raise RuntimeError("the database pool at db.internal refused the connection")
        journal("enter second")
        yield
        journal("exit second")
        if fail == "exit":
            raise RuntimeError("the database pool did not close in time")

    @h.tool(side_effect=True)
    async def record(ctx: tt.ToolContext, i: int) -> int:
        journal(f"call start {ctx.task_id} {i}")
        gate = folder() / "gates" / ctx.task_id
        if gate.exists():
            (gate.parent / f"{ctx.task_id}.at").write_text(str(os.getpid()))
            while gate.exists():
                await asyncio.sleep(0.01)
        journal(f"call end {ctx.task_id} {i}")
        return i

    h.add_agent("calls", Calls())

    if os.environ.get("LIFESPAN_MCP") == "1":
        from tether.integrations.mcp import MCPTools  # the mcp extra, only when asked for

        ledger = folder() / "mcp-ledger.db"
        env = {"MCP_LEDGER": str(ledger), "MCP_PIDFILE": str(folder() / "mcp.pid")}
        payments = MCPTools.stdio(h, sys.executable, [str(MCP_SERVER)], env=env, prefix="pay_",
                                  only=("refund", "read_balance"))

        @h.lifespan
        async def mcp(h: tt.Harness) -> AsyncIterator[None]:
            async with payments:
                names = ",".join(tool.name for tool in payments.registered)
                journal(f"enter mcp refunds={ledger_refunds(ledger)} tools={names}")
                yield
                journal(f"exit mcp refunds={ledger_refunds(ledger)}")

        h.add_agent("mcp_refund", MCPRefund())
    return h

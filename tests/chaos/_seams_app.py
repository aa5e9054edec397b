"""The application of the seams tests (``tests/chaos/test_r10_r21_r26_levers_at_the_seams.py``).

Workers run it as ``tether worker --app _seams_app:harness`` (``tests/chaos`` on PYTHONPATH),
as an operator would; the test process loads it too, to submit tasks and to pull levers with
the app's code. Everything it pays goes to a **ledger outside tether**: ``SEAMS_DIR/ledger.jsonl``,
one JSON line per payment naming the idempotency key, appended and fsynced before the tool
returns. Nothing tether does can roll it back, so it is the judge of "nothing twice".

The agent is named ``refund`` and its ``refund`` tool takes ``(order_id, cents)``: the names
and arguments of the built-in examples' agent and tool. The examples' ``refund`` has a
reconcile hook, this one has none, so a process that steers this app's tasks with the
examples' code judges a call in doubt by the wrong rules (issue 26, defect 1).

The agent makes the calls its input's ``steps`` list, one per step, in order; order ids are
``<task id>.<step>`` (a fork's copied call keeps its source's order; the calls it plans itself
have orders of its own):

- ``refund``    side-effecting, no reconcile hook, no retries of its own: in doubt after a
                crash in flight, only a person may settle it;
- ``lookup``    idempotent (re-run freely after a crash).

Files the test controls make interleavings exact instead of lucky:

- ``SEAMS_DIR/gates/<order>``: while it exists, a call for that order stops before paying
  and says so in ``gates/<order>.at`` (the worker's pid);
- ``SEAMS_DIR/fail/<order>``: the next call for that order removes it and fails before
  paying (a known failure, not one in doubt).

Settings come from the environment, so each test can say what it needs: ``SEAMS_LEASE``
(1 s), ``SEAMS_RECOVERY_TIMEOUT`` (600 s) and ``SEAMS_MAX_RECOVERY`` (3).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import tether as tt

LEDGER = "ledger.jsonl"


def site_dir() -> Path:
    return Path(os.environ["SEAMS_DIR"])


def settings() -> tt.Settings:
    return tt.Settings(
        lease_seconds=float(os.environ.get("SEAMS_LEASE", "1.0")),
        poll_interval=0.02,
        recovery_backoff=0.05,
        recovery_timeout=float(os.environ.get("SEAMS_RECOVERY_TIMEOUT", "600")),
        max_recovery_attempts=int(os.environ.get("SEAMS_MAX_RECOVERY", "3")),
        keep_versions=1000,  # every version stays: tests fork and roll back to early ones
        housekeeping_interval=3600.0,
    )


# ---------------------------------------------------------------------- the ledger


def payments(folder: Path) -> list[dict[str, Any]]:
    """Every payment the provider made, in order."""
    path = folder / LEDGER
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def keys_paid_twice(folder: Path) -> list[str]:
    """Idempotency keys under which more than one payment went out (must stay empty)."""
    return sorted(key for key, n in Counter(p["key"] for p in payments(folder)).items() if n > 1)


def _pay(ctx: tt.ToolContext, tool: str, order_id: str, cents: int) -> dict[str, Any]:
    line = json.dumps({"key": ctx.idempotency_key, "task": ctx.task_id, "tool": tool,
                       "order": order_id, "cents": cents, "attempt": ctx.attempt,
                       "pid": os.getpid(), "at": time.time()})
    out = os.open(site_dir() / LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(out, (line + "\n").encode())
        os.fsync(out)
    finally:
        os.close(out)
    return {"tool": tool, "order": order_id, "cents": cents, "paid": True}


async def _gate(order_id: str) -> None:
    gate = site_dir() / "gates" / order_id
    if not gate.exists():
        return
    (gate.parent / f"{order_id}.at").write_text(str(os.getpid()))
    while gate.exists():
        await asyncio.sleep(0.01)


def _fails_once(order_id: str) -> None:
    flag = site_dir() / "fail" / order_id
    if flag.exists():
        flag.unlink()
        raise RuntimeError(f"bank busy for {order_id}; nothing was paid")


# ---------------------------------------------------------------------- the agent


class Steps(tt.Agent):
    """Makes the calls of ``input.steps`` in order, then finishes with the last result."""

    async def plan(self, task: tt.TaskView) -> tt.Action:
        steps = task.input["steps"]
        i = int(task.scratch.get("i", 0))
        if i >= len(steps):
            return tt.Finish({"steps": len(steps), "last": task.last_tool_result})
        task.scratch["i"] = i + 1
        order = f"{task.task_id}.{i}"
        if steps[i] == "lookup":
            return tt.ToolCall("lookup", {"order_id": order})
        return tt.ToolCall("refund", {"order_id": order, "cents": 100 + i})


# ---------------------------------------------------------------------- the harness


def harness(url: str) -> tt.Harness:
    """The factory ``--app _seams_app:harness`` names."""
    h = tt.Harness(url, settings=settings())

    @h.tool(side_effect=True, retry=tt.RetryPolicy(max_attempts=1))
    async def refund(ctx: tt.ToolContext, order_id: str, cents: int) -> dict[str, Any]:
        await _gate(order_id)
        _fails_once(order_id)
        return _pay(ctx, "refund", order_id, cents)

    @h.tool(idempotent=True)
    async def lookup(ctx: tt.ToolContext, order_id: str) -> dict[str, Any]:
        await _gate(order_id)
        return {"order": order_id, "balance": 1000}

    h.add_agent("refund", Steps())
    return h

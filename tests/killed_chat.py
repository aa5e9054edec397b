"""What the ChatAgent kill tests share: a refund tool that pays into a ledger file (with the
reconcile hook that looks there), and a worker run as a child process that a failpoint may
SIGKILL (used by the chaos tier against the fake server and the real-model tier)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import tether as tt

KILLED = -9


def refund_tool(h: tt.Harness, ledger: str) -> tt.Tool:
    """A side-effecting refund recorded under its idempotency key in *ledger*."""

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, order: str, amount: int) -> str:
        """Refund an order."""
        with _ledger(ledger) as conn:
            conn.execute("INSERT INTO paid VALUES (?, ?)", (ctx.idempotency_key, order))
        return f"refunded {amount} dollars on order {order}"

    @refund.reconcile
    async def _(ctx: tt.ToolContext, order: str, amount: int) -> str | None:
        with _ledger(ledger) as conn:
            row = conn.execute("SELECT 1 FROM paid WHERE key = ?",
                               (ctx.idempotency_key,)).fetchone()
        return f"refunded {amount} dollars on order {order}" if row else None

    return refund


def paid(ledger: Path) -> int:
    """Refunds paid so far."""
    with _ledger(str(ledger)) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM paid").fetchone()[0])


def _ledger(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE IF NOT EXISTS paid (key TEXT, order_id TEXT)")
    return conn


def run_child(script: str, args: list[str], failpoints: str | None, timeout: float) -> int:
    """Run *script* with *args* as a worker process; its exit code (KILLED at a failpoint)."""
    env = {k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINTS"}
    if failpoints:
        env["TETHER_FAILPOINTS"] = failpoints
    proc = subprocess.run([sys.executable, script, *args], env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode in (0, KILLED), proc.stderr[-3000:]
    return proc.returncode


def wait_out_dead_lease(db: Path, task_id: str = "t1") -> None:
    """Until a killed worker's lease on *task_id* has run out (a worker run until idle finds
    no claimable work under a live lease and stops; a child that started quicker than the
    lease lasts would do nothing)."""
    with sqlite3.connect(db) as conn:
        (until,) = conn.execute("SELECT lease_until FROM tasks WHERE task_id = ?",
                                (task_id,)).fetchone()
    time.sleep(max(0.0, (until or 0) - time.time()) + 0.05)

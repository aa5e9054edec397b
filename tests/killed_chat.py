"""What the ChatAgent kill tests share: a refund tool that pays into a ledger file (with the
reconcile hook that looks there), and a worker run as a child process that a failpoint may
SIGKILL (used by the chaos tier against the fake server and the real-model tier)."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import tether as tt
from tether.testing.fake_openai import FakeOpenAI, Reply, call, reply

KILLED = -9


def refund_tool(h: tt.Harness, ledger: str) -> tt.Tool:
    """A side-effecting refund recorded under its idempotency key in *ledger*."""

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, order: str, amount: int) -> str:
        """Refund an order."""
        with ledger_db(ledger) as conn:
            conn.execute("INSERT INTO paid VALUES (?, ?)", (ctx.idempotency_key, order))
        return f"refunded {amount} dollars on order {order}"

    @refund.reconcile
    async def _(ctx: tt.ToolContext, order: str, amount: int) -> str | None:
        with ledger_db(ledger) as conn:
            row = conn.execute("SELECT 1 FROM paid WHERE key = ?",
                               (ctx.idempotency_key,)).fetchone()
        return f"refunded {amount} dollars on order {order}" if row else None

    return refund


def paid(ledger: Path) -> int:
    """Refunds paid so far."""
    with ledger_db(str(ledger)) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM paid").fetchone()[0])


def ledger_db(path: str) -> sqlite3.Connection:
    """The ledger file, its table created if it is new."""
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


Build = Callable[[str, str, str], tt.Harness]
"""A kill test's harness, from (store file, ledger file, model base URL)."""


def serve(build: Build, argv: list[str], timeout: float = 60) -> int:
    """The worker a kill-test file runs as when it is started as a script: its harness,
    run until idle (``python test_x.py DB LEDGER BASE_URL``)."""
    async def go() -> None:
        async with build(*argv[:3]) as h:
            await h.run_until_idle(timeout=timeout)

    asyncio.run(go())
    return 0


class KilledRun:
    """One task ``t1`` in *tmp*, run by worker processes of *script* (a kill-test file that
    doubles as the worker), some of them killed at failpoints."""

    def __init__(self, script: str, build: Build, tmp: Path, base_url: str,
                 agent: str, prompt: str, timeout: float = 60) -> None:
        self.script, self.build, self.base_url = script, build, base_url
        self.db, self.ledger = tmp / "t.db", tmp / "ledger.db"
        self.agent, self.prompt, self.timeout = agent, prompt, timeout

    def submit(self) -> None:
        async def go() -> None:
            async with self._harness() as h:
                await h.submit(self.agent, self.prompt, task_id="t1")

        asyncio.run(go())

    def worker(self, failpoints: str | None) -> int:
        """A worker process run until idle; its exit code (KILLED at a failpoint)."""
        return run_child(self.script, [str(self.db), str(self.ledger), self.base_url],
                         failpoints, self.timeout)

    def kill(self, point: str) -> None:
        """A worker killed at *point*; returns once its lease has run out."""
        assert self.worker(point) == KILLED
        wait_out_dead_lease(self.db)

    def finish(self) -> None:
        """A fresh worker runs the task until nothing is left to do."""
        assert self.worker(None) == 0

    def info(self) -> tt.TaskInfo:
        async def go() -> tt.TaskInfo:
            async with self._harness() as h:
                return await h.get("t1")

        return asyncio.run(go())

    def _harness(self) -> tt.Harness:
        return self.build(str(self.db), str(self.ledger), self.base_url)


def kill_during_first_request(run: KilledRun, fake: FakeOpenAI) -> None:
    """Start a worker and SIGKILL it once the fake server has its first request (script a
    slow stream there so the kill lands inside it); returns once its lease has run out."""
    proc = subprocess.Popen([sys.executable, run.script, str(run.db), str(run.ledger),
                             run.base_url], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                            env={k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINTS"})
    deadline = time.monotonic() + 30
    while fake.completions == 0:
        assert time.monotonic() < deadline and proc.poll() is None, "no request came"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=10) == KILLED
    wait_out_dead_lease(run.db)


def slow_answer_then_refund() -> list[Reply]:
    """A model's script for a kill mid-stream: a slow answer (6 s, for the kill to land
    inside), then a refund call, then the final answer."""
    return [reply("I will look into this for you now, one moment please " * 10, chunks=300,
                  chunk_delay=0.02),
            reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})]),
            reply("Refunded.")]

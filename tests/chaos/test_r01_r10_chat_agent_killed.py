"""R1, R10: a ChatAgent worker process SIGKILLed between the model's answer and the tool call.

The parent runs the fake OpenAI-compatible server and counts completions; the child (this
file run as a script) runs a worker with a ChatAgent pointed at it. The answer (a tool call)
is committed before the tool runs, so the next worker resumes with the call and asks the
model only for the step after it: zero extra completions, and the refund is paid once.

Child usage: ``python test_r01_r10_chat_agent_killed.py DB LEDGER BASE_URL``.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tether as tt
from tether.agents import ChatAgent
from tether.testing.fake_openai import FakeOpenAI, call, reply

pytestmark = pytest.mark.timeout(60)
KILLED = -9


def build(db: str, ledger: str, base_url: str) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}", settings=tt.Settings(lease_seconds=0.5, poll_interval=0.02))

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, order: str, amount: int) -> str:
        """Refund an order."""
        with sqlite3.connect(ledger) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS paid (key TEXT, order_id TEXT)")
            conn.execute("INSERT INTO paid VALUES (?, ?)", (ctx.idempotency_key, order))
        return f"refunded {amount}"

    @refund.reconcile
    async def _(ctx: tt.ToolContext, order: str, amount: int) -> str | None:
        with sqlite3.connect(ledger) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS paid (key TEXT, order_id TEXT)")
            row = conn.execute("SELECT 1 FROM paid WHERE key = ?", (ctx.idempotency_key,)).fetchone()
        return f"refunded {amount}" if row else None

    h.add_agent("chat", ChatAgent("fake-model", base_url=base_url, api_key="none", tools=[refund]))
    return h


def child(db: str, ledger: str, base_url: str) -> int:
    async def go() -> None:
        async with build(db, ledger, base_url) as h:
            await h.run_until_idle(timeout=30)

    asyncio.run(go())
    return 0


def run_child(tmp: Path, base_url: str, failpoints: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINTS"}
    if failpoints:
        env["TETHER_FAILPOINTS"] = failpoints
    proc = subprocess.run([sys.executable, __file__, str(tmp / "t.db"), str(tmp / "ledger.db"),
                           base_url], env=env, capture_output=True, text=True, timeout=40)
    return proc.returncode


@pytest.mark.parametrize("point", ["before_plan_recorded@1", "after_resume_point@1",
                                   "after_tool_before_commit@1"])
def test_r10_a_worker_killed_after_the_answer_resumes_without_a_second_completion(
        tmp_path: Path, point: str) -> None:
    with FakeOpenAI([reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})]),
                     reply("Refunded.")]) as fake:
        asyncio.run(_submit(tmp_path, fake.url))
        assert run_child(tmp_path, fake.url, point) == KILLED
        assert fake.completions == 1  # the answer came, then the worker died
        wait_out_dead_lease(tmp_path / "t.db")
        assert run_child(tmp_path, fake.url, None) == 0
        assert fake.completions == 2  # only the step after the tool: zero extra
    info = asyncio.run(_info(tmp_path, fake.url))
    assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == "Refunded."
    with sqlite3.connect(tmp_path / "ledger.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM paid").fetchone()[0] == 1


def wait_out_dead_lease(db: Path) -> None:
    """Until the killed worker's lease on t1 has run out (a worker run until idle finds no
    claimable work under a live lease and stops; a child that started quicker than the lease
    lasts would do nothing)."""
    with sqlite3.connect(db) as conn:
        (until,) = conn.execute("SELECT lease_until FROM tasks WHERE task_id = 't1'").fetchone()
    time.sleep(max(0.0, until - time.time()) + 0.05)


async def _submit(tmp: Path, url: str) -> None:
    async with build(str(tmp / "t.db"), str(tmp / "ledger.db"), url) as h:
        await h.submit("chat", "Refund 5 on A1", task_id="t1")


async def _info(tmp: Path, url: str) -> tt.TaskInfo:
    async with build(str(tmp / "t.db"), str(tmp / "ledger.db"), url) as h:
        return await h.get("t1")


if __name__ == "__main__":
    sys.exit(child(*sys.argv[1:4]))

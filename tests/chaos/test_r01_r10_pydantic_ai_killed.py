"""R1, R10: a PydanticAI agent's worker process SIGKILLed mid-tool and mid-stream (issue 17).

The parent runs the fake OpenAI-compatible server and counts requests; the child (this
file run as a script) runs a worker with a ``PydanticAIAgent`` whose model is PydanticAI's
own OpenAI model pointed at it, streaming. A refund tool pays into a ledger file under
tether's idempotency key, with a reconcile hook that looks there.

- Killed after the answer was committed, at the resume point, or after the refund ran but
  before its result was committed: the next worker asks the model only for the step after
  the tool (no extra request) and the refund is paid once.
- Killed while the answer streams: that answer was never committed, so it is asked for
  again (one more request, no extra committed answer), and nothing was paid twice.

Child usage: ``python test_r01_r10_pydantic_ai_killed.py DB LEDGER BASE_URL``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import tether as tt
from tether.integrations.pydantic_ai import PydanticAIAgent, current_call
from tether.testing.fake_openai import FakeOpenAI, call, reply

sys.path.insert(0, str(Path(__file__).parents[1]))  # the child runs this file as a script

from killed_chat import KILLED, paid, run_child, wait_out_dead_lease

pytestmark = pytest.mark.timeout(90)


def build(db: str, ledger: str, base_url: str) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}", settings=tt.Settings(lease_seconds=0.5, poll_interval=0.02))
    model = OpenAIChatModel("fake", provider=OpenAIProvider(base_url=base_url, api_key="none"))
    agent: Agent[None, str] = Agent(model)

    def pay(key: str, order: str) -> None:
        with sqlite3.connect(ledger) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS paid (key TEXT, order_id TEXT)")
            conn.execute("INSERT INTO paid VALUES (?, ?)", (key, order))

    @agent.tool_plain
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        pay(current_call().idempotency_key, order)
        return f"refunded {amount} dollars on order {order}"

    async def reconcile(ctx: tt.ToolContext, tool_call_id: str, args: dict[str, Any]) -> Any:
        with sqlite3.connect(ledger) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS paid (key TEXT, order_id TEXT)")
            row = conn.execute("SELECT 1 FROM paid WHERE key = ?",
                               (ctx.idempotency_key,)).fetchone()
        return [{"part_kind": "tool-return", "tool_name": "refund", "tool_call_id": tool_call_id,
                 "content": "refunded (found in the ledger)"}] if row else None

    h.add_agent("support", PydanticAIAgent(agent, tools={
        "refund": tt.ToolPolicy(side_effect=True, reconcile=reconcile)}))
    return h


def child(db: str, ledger: str, base_url: str) -> int:
    async def go() -> None:
        async with build(db, ledger, base_url) as h:
            await h.run_until_idle(timeout=60)

    asyncio.run(go())
    return 0


def worker(tmp: Path, base_url: str, failpoints: str | None) -> int:
    return run_child(__file__, [str(tmp / "t.db"), str(tmp / "ledger.db"), base_url],
                     failpoints, timeout=60)


async def _submit(tmp: Path, url: str) -> None:
    async with build(str(tmp / "t.db"), str(tmp / "ledger.db"), url) as h:
        await h.submit("support", "Refund 5 on A1", task_id="t1")


async def _info(tmp: Path, url: str) -> tt.TaskInfo:
    async with build(str(tmp / "t.db"), str(tmp / "ledger.db"), url) as h:
        return await h.get("t1")


@pytest.mark.parametrize("point", ["before_plan_recorded@1", "after_resume_point@1",
                                   "after_tool_before_commit@1"])
def test_r10_killed_around_the_tool_costs_no_extra_request_and_no_second_refund(
        tmp_path: Path, point: str) -> None:
    with FakeOpenAI([reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})]),
                     reply("Refunded.")]) as fake:
        asyncio.run(_submit(tmp_path, fake.url))
        assert worker(tmp_path, fake.url, point) == KILLED
        assert fake.completions == 1
        wait_out_dead_lease(tmp_path / "t.db")
        assert worker(tmp_path, fake.url, None) == 0
        assert fake.completions == 2  # only the step after the tool: zero extra
        info = asyncio.run(_info(tmp_path, fake.url))
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "Refunded."
    assert paid(tmp_path / "ledger.db") == 1


def test_r01_killed_mid_stream_asks_again_and_pays_once(tmp_path: Path) -> None:
    slow = reply("I will look into this for you now, one moment please " * 10, chunks=300,
                 chunk_delay=0.02)
    with FakeOpenAI([slow, reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})]),
                     reply("Refunded.")]) as fake:
        asyncio.run(_submit(tmp_path, fake.url))
        proc = subprocess.Popen([sys.executable, __file__, str(tmp_path / "t.db"),
                                 str(tmp_path / "ledger.db"), fake.url],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={k: v for k, v in os.environ.items()
                                     if k != "TETHER_FAILPOINTS"})
        deadline = time.monotonic() + 30
        while fake.completions == 0:  # the stream takes 6 s: the kill lands inside it
            assert time.monotonic() < deadline and proc.poll() is None, "no request came"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == KILLED
        wait_out_dead_lease(tmp_path / "t.db")
        assert worker(tmp_path, fake.url, None) == 0
        assert fake.completions == 3  # the cut answer once more, then the step after the tool
        info = asyncio.run(_info(tmp_path, fake.url))
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert paid(tmp_path / "ledger.db") == 1


if __name__ == "__main__":
    sys.exit(child(*sys.argv[1:4]))

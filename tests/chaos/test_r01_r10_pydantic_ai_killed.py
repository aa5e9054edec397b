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

import sqlite3
import sys
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

from killed_chat import KilledRun, kill_during_first_request, paid, serve, slow_answer_then_refund

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


@pytest.mark.parametrize("point", ["before_plan_recorded@1", "after_resume_point@1",
                                   "after_tool_before_commit@1"])
def test_r10_killed_around_the_tool_costs_no_extra_request_and_no_second_refund(
        tmp_path: Path, point: str) -> None:
    with FakeOpenAI([reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})]),
                     reply("Refunded.")]) as fake:
        run = KilledRun(__file__, build, tmp_path, fake.url, "support", "Refund 5 on A1")
        run.submit()
        run.kill(point)
        assert fake.completions == 1
        run.finish()
        assert fake.completions == 2  # only the step after the tool: zero extra
        info = run.info()
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "Refunded."
    assert paid(run.ledger) == 1


def test_r01_killed_mid_stream_asks_again_and_pays_once(tmp_path: Path) -> None:
    with FakeOpenAI(slow_answer_then_refund()) as fake:
        run = KilledRun(__file__, build, tmp_path, fake.url, "support", "Refund 5 on A1")
        run.submit()
        kill_during_first_request(run, fake)
        run.finish()
        assert fake.completions == 3  # the cut answer once more, then the step after the tool
        info = run.info()
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert paid(run.ledger) == 1


if __name__ == "__main__":
    sys.exit(serve(build, sys.argv[1:4]))

"""R1, R10: an OpenAI Agents SDK worker process SIGKILLed between the model's answer and the
tool call, during it, or after it before the result was committed.

The parent runs the fake OpenAI-compatible server and counts completions; the child (this
file run as a script) runs a worker with an ``OpenAIAgentsAgent`` whose SDK model is the
SDK's own ``OpenAIChatCompletionsModel`` pointed at it. The answer (a tool call) is committed
before the tool runs, so the next worker resumes with the call (asking the refund tool's
``reconcile`` hook when the call was in doubt) and asks the model only for the step after
it: zero extra completions, and the refund is paid once.

Child usage: ``python test_r01_r10_openai_agents_killed.py DB LEDGER BASE_URL``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, OpenAIChatCompletionsModel, RunConfig, function_tool
from openai import AsyncOpenAI

import tether as tt
from tether.integrations.openai_agents import OpenAIAgentsAgent, current_call
from tether.testing.fake_openai import FakeOpenAI, call, reply

sys.path.insert(0, str(Path(__file__).parents[1]))  # the child runs this file as a script

from killed_chat import (
    KilledRun,
    kill_during_first_request,
    ledger_db,
    paid,
    serve,
    slow_answer_then_refund,
)

pytestmark = pytest.mark.timeout(60)


def build(db: str, ledger: str, base_url: str) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}", settings=tt.Settings(lease_seconds=0.5, poll_interval=0.02))

    @function_tool
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        with ledger_db(ledger) as conn:
            conn.execute("INSERT INTO paid VALUES (?, ?)", (current_call().idempotency_key, order))
        return f"refunded {amount} dollars on order {order}"

    async def reconcile(ctx: tt.ToolContext, order: str, amount: int) -> Any:
        with ledger_db(ledger) as conn:
            row = conn.execute("SELECT 1 FROM paid WHERE key = ?",
                               (ctx.idempotency_key,)).fetchone()
        return f"refunded {amount} dollars on order {order}" if row else None

    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)
    agent = Agent(name="support", tools=[refund],
                  model=OpenAIChatCompletionsModel("fake-model", openai_client=client))
    h.add_agent("support", OpenAIAgentsAgent(
        agent, tools={"refund": tt.ToolPolicy(reconcile=reconcile)},
        run_config=RunConfig(tracing_disabled=True)))
    return h


@pytest.mark.parametrize("point", ["before_plan_recorded@1", "after_resume_point@1",
                                   "after_tool_before_commit@1"])
def test_r10_a_worker_killed_after_the_answer_resumes_without_a_second_completion(
        tmp_path: Path, point: str) -> None:
    with FakeOpenAI([reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})]),
                     reply("Refunded.")]) as fake:
        run = KilledRun(__file__, build, tmp_path, fake.url, "support", "Refund 5 on A1", 40)
        run.submit()
        run.kill(point)
        assert fake.completions == 1  # the answer came, then the worker died
        run.finish()
        assert fake.completions == 2  # only the step after the tool: zero extra
        answered = fake.requests[1]["messages"][-1]
        info = run.info()
    assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == "Refunded."
    assert paid(run.ledger) == 1
    assert answered["role"] == "tool" and answered["content"] == "refunded 5 dollars on order A1"


def test_r01_killed_mid_stream_asks_again_and_pays_once(tmp_path: Path) -> None:
    """Killed while the answer streams: it was never committed, so it is asked for once
    more (one extra request, no extra committed answer), and nothing is paid twice."""
    with FakeOpenAI(slow_answer_then_refund()) as fake:
        run = KilledRun(__file__, build, tmp_path, fake.url, "support", "Refund 5 on A1", 40)
        run.submit()
        kill_during_first_request(run, fake)
        run.finish()
        assert fake.completions == 3  # the cut answer once more, then the step after the tool
        info = run.info()
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert paid(run.ledger) == 1


if __name__ == "__main__":
    sys.exit(serve(build, sys.argv[1:4], timeout=30))

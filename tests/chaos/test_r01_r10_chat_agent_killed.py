"""R1, R10: a ChatAgent worker process SIGKILLed between the model's answer and the tool call.

The parent runs the fake OpenAI-compatible server and counts completions; the child (this
file run as a script) runs a worker with a ChatAgent pointed at it. The answer (a tool call)
is committed before the tool runs, so the next worker resumes with the call and asks the
model only for the step after it: zero extra completions, and the refund is paid once.

Child usage: ``python test_r01_r10_chat_agent_killed.py DB LEDGER BASE_URL``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tether as tt
from tether.agents import ChatAgent
from tether.testing.fake_openai import FakeOpenAI, call, reply

sys.path.insert(0, str(Path(__file__).parents[1]))  # the child runs this file as a script

from killed_chat import KilledRun, paid, refund_tool, serve

pytestmark = pytest.mark.timeout(60)


def build(db: str, ledger: str, base_url: str) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}", settings=tt.Settings(lease_seconds=0.5, poll_interval=0.02))
    h.add_agent("chat", ChatAgent("fake-model", base_url=base_url, api_key="none",
                                  tools=[refund_tool(h, ledger)]))
    return h


@pytest.mark.parametrize("point", ["before_plan_recorded@1", "after_resume_point@1",
                                   "after_tool_before_commit@1"])
def test_r10_a_worker_killed_after_the_answer_resumes_without_a_second_completion(
        tmp_path: Path, point: str) -> None:
    with FakeOpenAI([reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})]),
                     reply("Refunded.")]) as fake:
        run = KilledRun(__file__, build, tmp_path, fake.url, "chat", "Refund 5 on A1", 40)
        run.submit()
        run.kill(point)
        assert fake.completions == 1  # the answer came, then the worker died
        run.finish()
        assert fake.completions == 2  # only the step after the tool: zero extra
        info = run.info()
    assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == "Refunded."
    assert paid(run.ledger) == 1


if __name__ == "__main__":
    sys.exit(serve(build, sys.argv[1:4], timeout=30))

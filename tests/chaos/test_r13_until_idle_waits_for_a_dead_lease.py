"""A worker run until idle right after a crash waits for the dead worker's lease (issue 18).

Before, ``tether worker --until-idle`` started right after a worker was SIGKILLed exited at
once, doing nothing: the task sat under the dead worker's lease. Now the idle run sees a
lease its holder stopped renewing, waits for it to run out, and takes the task over. (The
lease here is long enough that the new worker starts well inside it.)

Child usage: ``python test_r13_until_idle_waits_for_a_dead_lease.py DB LEDGER BASE_URL``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tether as tt
from tether.agents import ChatAgent
from tether.testing.fake_openai import FakeOpenAI, call, reply

sys.path.insert(0, str(Path(__file__).parents[1]))  # the child runs this file as a script

from killed_chat import KILLED, KilledRun, paid, refund_tool, serve

pytestmark = pytest.mark.timeout(90)
LEASE = 4.0


def build(db: str, ledger: str, base_url: str) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}", settings=tt.Settings(lease_seconds=LEASE,
                                                           poll_interval=0.05))
    h.add_agent("chat", ChatAgent("fake-model", base_url=base_url, api_key="none",
                                  tools=[refund_tool(h, ledger)]))
    return h


def test_r13_a_run_until_idle_right_after_a_crash_takes_the_task_over(tmp_path: Path) -> None:
    with FakeOpenAI([reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})]),
                     reply("Refunded.")]) as fake:
        run = KilledRun(__file__, build, tmp_path, fake.url, "chat", "Refund 5 on A1", 60)
        run.submit()
        assert run.worker("after_resume_point@1") == KILLED
        held = run.info().record
        assert held.lease_owner is not None and held.status is tt.Status.RUNNING
        run.finish()  # at once: no waiting out the lease here
        info = run.info()
    assert info.record.status is tt.Status.COMPLETED, info.record
    assert info.snapshot.result == "Refunded." and paid(run.ledger) == 1


if __name__ == "__main__":
    sys.exit(serve(build, sys.argv[1:4]))

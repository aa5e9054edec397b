"""A SIGKILLed worker's task is taken over at once on the same host (issue 29).

Before, the next worker waited out the dead worker's whole lease (14.5 s on SQLite, 15 s on
PostgreSQL) even when the holder was a dead process it could see. Now a worker that shares
the holder's place (the same kernel and PID namespace, :mod:`tether.engine.holders`) sees
that the holder's process is gone, ends the lease and takes the task over in its next
claim round. The lease here is two minutes and the finishing worker has one: had it waited
for the lease, it would be killed by its own timeout and the test would fail.

Child usage: ``python test_r13_a_dead_workers_tasks_are_taken_over_at_once.py DB LEDGER URL``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

import tether as tt
from tether.agents import ChatAgent
from tether.testing.fake_openai import FakeOpenAI, call, reply

sys.path.insert(0, str(Path(__file__).parents[1]))  # the child runs this file as a script

from killed_chat import KILLED, KilledRun, paid, refund_tool, serve

pytestmark = pytest.mark.timeout(150)
LEASE = 120.0


def build(db: str, ledger: str, base_url: str) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}", settings=tt.Settings(lease_seconds=LEASE,
                                                           poll_interval=0.05))
    h.add_agent("chat", ChatAgent("fake-model", base_url=base_url, api_key="none",
                                  tools=[refund_tool(h, ledger)]))
    return h


def test_r13_a_task_whose_worker_died_on_this_host_is_taken_over_without_waiting_the_lease(
        tmp_path: Path) -> None:
    with FakeOpenAI([reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})]),
                     reply("Refunded.")]) as fake:
        run = KilledRun(__file__, build, tmp_path, fake.url, "chat", "Refund 5 on A1",
                        LEASE / 2)
        run.submit()
        assert run.worker("after_resume_point@1") == KILLED
        held = run.info().record
        assert held.lease_owner is not None and (held.lease_until or 0) > time.time() + 60
        run.finish()  # within LEASE / 2: it cannot have waited for the lease
        info = run.info()
    assert info.record.status is tt.Status.COMPLETED, info.record
    assert info.snapshot.result == "Refunded." and paid(run.ledger) == 1


if __name__ == "__main__":
    sys.exit(serve(build, sys.argv[1:4]))

"""R13/R21: a run until idle waits out a lease its holder stopped renewing and takes the task
over. The lease can run out between the claim round (still live: nothing claimed) and the look
at who holds what (run out: nobody holds it); that look must then ask for one more claim
round, not end the run with the task left running and unowned."""

from __future__ import annotations

import time
from pathlib import Path

import tether as tt
from tether.engine.worker import Worker
from tether.model import Status, TaskRecord


def _leased(until: float) -> TaskRecord:
    return TaskRecord("t1", "agent", Status.RUNNING, created_at=1.0, updated_at=1.0,
                      head_version=2, lease_owner="dead-worker", lease_until=until)


def test_a_lease_seen_live_then_run_out_asks_for_one_more_claim_round(tmp_path: Path) -> None:
    worker = Worker(tt.Harness(f"sqlite:///{tmp_path / 't.db'}"), 1)
    now = time.time()
    assert worker._held_by_the_dead([_leased(now + 60)])  # live, never renewed: wait for it
    assert worker._held_by_the_dead([_leased(now - 0.001)])  # ran out since: claim it
    assert not worker._held_by_the_dead([_leased(now - 0.001)])  # only once, not for ever


def test_a_lease_never_seen_live_that_ran_out_is_left_to_the_claim_round(tmp_path: Path) -> None:
    worker = Worker(tt.Harness(f"sqlite:///{tmp_path / 't.db'}"), 1)
    assert not worker._held_by_the_dead([_leased(time.time() - 5)])

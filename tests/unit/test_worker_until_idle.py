"""R13/R21: a run until idle waits out a lease its holder stopped renewing and takes the task
over. The lease can run out between the claim round (still live: nothing claimed) and the look
at who holds what (run out: nobody holds it); that look must then ask for one more claim
round, not end the run with the task left running and unowned."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

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


async def test_r13_a_lease_looked_after_once_its_task_ended_and_was_purged_is_let_go(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The keeper renews from a list of claims taken before a task ended; by the renewal the
    task may be released and deleted by another worker's housekeeping (retention 0). That is
    no error: nothing is logged as a failure, and the worker's running tasks are untouched."""
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}")
    worker = Worker(h, 1)
    await h.store.create_task(_leased(0.0), b"{}")
    claim = await h.store.claim_task("t1", h.worker_id, time.time(), 30.0)
    assert claim is not None
    await h.store.release(claim)
    await h.store.delete_task("t1", time.time())
    with caplog.at_level(logging.WARNING, logger="tether"):
        await worker._look_after("t1", claim, renew=True)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    await h.close()


async def test_r03_the_keeper_reads_a_held_task_s_inbox_only_with_its_renewal(
        tmp_path: Path) -> None:
    """R3, R13: events other processes store reach a running task through the watcher, as
    their notice arrives; the keeper reads a held task's inbox only when it renews the lease
    (a backstop), not every round: each round read every held task's inbox before."""
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}")
    worker = Worker(h, 1)
    await h.store.create_task(_leased(0.0), b"{}")
    claim = await h.store.claim_task("t1", h.worker_id, time.time(), 30.0)
    assert claim is not None
    reads: list[str] = []
    pending_events = h.store.pending_events

    async def counted(task_id: str) -> Any:
        reads.append(task_id)
        return await pending_events(task_id)

    class Running:  # what the keeper asks of the task's runner
        def unseen(self, events: list[Any]) -> list[Any]:
            return events

        def notify(self, priority: int) -> None: ...

    h.store.pending_events = counted  # type: ignore[method-assign]
    h.runners["t1"] = Running()  # type: ignore[assignment]
    await worker._look_after("t1", claim, renew=False)
    assert reads == []
    await worker._look_after("t1", claim, renew=True)
    assert reads == ["t1"]
    renewed = (await h.store.get_task("t1")).lease_until or 0.0
    assert abs(renewed - time.time() - h.settings.lease_seconds) < 5  # was 30 s out
    await h.close()

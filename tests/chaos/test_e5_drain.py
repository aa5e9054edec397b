"""E5 with real ``tether worker`` processes: a graceful drain (SIGTERM) against a crash
(SIGKILL) in the middle of a long side-effecting call.

A drained worker lets the call finish (paid once), commits, releases the task and exits 0;
the next worker takes it at once and no recovery attempt is spent. A killed worker leaves
the call in doubt; the next worker waits out the lease, reconciles, and counts one recovery.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _child import ChildProcess
from _workers import Site, app

import tether as tt

pytestmark = pytest.mark.timeout(90)

CALLS = [["refund_keyed", "d1", 10], ["lookup", "d2", 0]]
SLOW = {"TETHER_CHAOS_SLOW_TOOL": "refund_keyed", "TETHER_CHAOS_SLOW": "1.5"}


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    s = Site.make(tmp_path)
    yield s
    s.kill_all()


def start_in_slow_refund(site: Site, slow: dict[str, str] = SLOW) -> ChildProcess:
    site.submit("refunder", {"calls": CALLS}, "t1")
    worker = site.worker("--drain-timeout", "20", env=slow)
    worker.expect("IN_TOOL d1")  # paid; the call has not returned
    return worker


def finish_with_a_second_worker(site: Site) -> tt.TaskInfo:
    rescuer = site.app_child("drain")
    rescuer.expect("READY")
    assert rescuer.wait() == 0, rescuer.stderr()
    info = site.info("t1")
    assert info.record.status is tt.Status.COMPLETED, (info.record.reason, site.strategies("t1"))
    assert app.refund_counts(site.ledger) == {"d1": 1}
    return info


def test_e5_sigterm_lets_the_paid_call_finish_releases_the_task_and_spends_no_recovery(
        site: Site) -> None:
    worker = start_in_slow_refund(site)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.stderr()
    assert "draining" in worker.stderr() and "released" in worker.stderr()
    record = site.info("t1").record
    assert record.lease_owner is None and record.status is tt.Status.RUNNING
    assert site.info("t1").snapshot.call is None  # the refund's result was committed
    assert "released" in site.strategies("t1")
    info = finish_with_a_second_worker(site)
    assert info.snapshot.recovery.reasons == []  # no crash was ever counted
    log = site.read(lambda h: h.store.list_recovery_log("t1"))
    assert [r["recovery_attempt"] for r in log] == [0] * len(log)
    assert "resume" not in site.strategies("t1")


def test_e5_sigkill_in_the_same_place_costs_one_recovery_and_is_reconciled(site: Site) -> None:
    worker = start_in_slow_refund(site)
    worker.kill()
    finish_with_a_second_worker(site)
    strategies = site.strategies("t1")
    assert "released" not in strategies
    assert strategies.count("resume") == 1 and "reconcile" in strategies, strategies
    log = site.read(lambda h: h.store.list_recovery_log("t1"))
    resume = next(r for r in log if r["resume_strategy"] == "resume")
    assert resume["recovery_attempt"] == 1


def test_e5_a_second_sigterm_exits_at_once_and_the_lease_expiry_recovers_the_task(
        site: Site) -> None:
    worker = start_in_slow_refund(site, {**SLOW, "TETHER_CHAOS_SLOW": "60"})
    worker.signal(signal.SIGTERM)
    time.sleep(0.2)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 128 + signal.SIGTERM, worker.stderr()
    assert "exiting now" in worker.stderr()
    assert site.info("t1").record.lease_owner is not None  # not released: a crash, in effect
    finish_with_a_second_worker(site)
    assert site.strategies("t1").count("resume") == 1

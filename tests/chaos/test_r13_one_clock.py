"""R13 (issue 13): on PostgreSQL, leases are judged by one clock, the database's.

Two real ``tether worker`` processes share a PostgreSQL store; one runs on a machine whose
clock is 30 s behind (its ``time.time`` is skewed in that process only). Every task spans
several leases. No live task may be taken over: no crash recovery in any task's log, no
task in needs_human, no "lease lost" in either worker's log, every refund paid once, and
both workers did part of the work.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _child import ChildProcess
from _workers import HERE, Site, app

pytestmark = [pytest.mark.timeout(240), pytest.mark.postgres]

TASKS = 8
STEPS = 5  # x 0.3 s per call: each task holds its lease for about 1.5 leases or more


def calls(i: int) -> list[list[object]]:
    return [["lookup" if n % 2 else "refund_reconciled", f"o{i}-{n}", n] for n in range(STEPS)]


def start_worker(site: Site, url: str, n: int, skew: float) -> ChildProcess:
    env = site.env({"PYTHONPATH": str(HERE), "TETHER_CHAOS_LOG": "1",
                    "TETHER_CHAOS_CLOCK_SKEW": str(skew), "TETHER_CHAOS_TOOL_DELAY": "0.3",
                    "TETHER_CHAOS_DEADLINE": "200"})
    argv = [sys.executable, "-m", "tether", "--store", url, "--app", "_outage_app:cli_harness",
            "worker", "--concurrency", "2"]
    child = ChildProcess(argv, env, site.dir, f"worker{n}", 200)
    site.started.append(child)
    return Site.wait_ready(child)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    site = Site.make(tmp_path)
    yield site
    site.kill_all()


def test_r13_a_worker_whose_clock_is_30s_behind_takes_over_no_live_task(
        site: Site, pg_url: str) -> None:
    async def submit_all() -> None:
        async with app.build_harness(pg_url, site.ledger) as h:
            for i in range(TASKS):
                await h.submit("refunder", {"calls": calls(i)}, task_id=f"t{i}")

    asyncio.run(submit_all())
    behind = start_worker(site, pg_url, 1, skew=-30.0)
    end = time.monotonic() + 60
    while behind.proc.pid not in app.ledger_pids(site.ledger):  # it holds tasks now
        assert behind.proc.poll() is None and time.monotonic() < end, behind.stderr()
        time.sleep(0.02)
    on_time = start_worker(site, pg_url, 2, skew=0.0)

    async def settled() -> dict[str, int]:
        async with app.build_harness(pg_url, site.ledger) as h:
            return await h.store.count_by_status()

    end = time.monotonic() + 150
    while (counts := asyncio.run(settled())).get("completed", 0) + counts.get(
            "needs_human", 0) + counts.get("failed", 0) < TASKS:
        for child in (behind, on_time):
            assert child.proc.poll() is None, child.stderr()
        assert time.monotonic() < end, counts
        time.sleep(0.1)
    for child in (behind, on_time):
        child.signal(signal.SIGTERM)
        assert child.wait(60) == 0, child.stderr()

    async def logs() -> dict[str, list[str]]:
        async with app.build_harness(pg_url, site.ledger) as h:
            return {f"t{i}": [r["resume_strategy"] for r in await h.store.list_recovery_log(
                f"t{i}")] for i in range(TASKS)}

    assert counts == {"completed": TASKS}, counts
    strategies = asyncio.run(logs())
    taken_over = {t: s for t, s in strategies.items() if "resume" in s or "needs_human" in s}
    assert taken_over == {}, f"live tasks were taken over: {taken_over}"
    for child in (behind, on_time):
        assert "lease lost" not in child.stderr_path.read_text(errors="replace"), child.label
    paid = app.refund_counts(site.ledger)
    assert set(paid.values()) == {1} and len(paid) == TASKS * len(range(0, STEPS, 2)), paid
    workers = app.ledger_pids(site.ledger)
    assert {behind.proc.pid, on_time.proc.pid} <= workers, "both workers should have run tasks"

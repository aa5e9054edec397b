"""R13 (issue 13): a worker rides out a store outage instead of dying of it.

Two real ``tether worker`` processes run a batch of tasks with side-effecting calls while the
store goes away under them:

- PostgreSQL: a private cluster (its own data directory and port) is stopped with
  ``pg_ctl stop -m fast`` mid-run, kept down until both workers have said so, and started
  again;
- SQLite: another process holds the write lock (``BEGIN IMMEDIATE``) for more than three
  busy timeouts, until both workers have said so.

Afterwards both workers are still alive (and drain cleanly on SIGTERM), every task has
completed, every refund was paid exactly once (the provider's ledger holds one row per
order and per idempotency key), and each worker logged the outage once when it began and
once when it ended, not once per retry.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from _child import ChildProcess
from _pgcluster import Cluster
from _workers import HERE, Site, app

pytestmark = [pytest.mark.timeout(300)]

TASKS = 48
BUSY_MS = 500
OUTAGE_BEGAN = re.compile(r"^LOG WARNING tether: store unavailable", re.M)
OUTAGE_ENDED = re.compile(r"^LOG INFO tether: store available again after ([0-9.]+) s"
                          r" \((\d+) failed attempts?\)", re.M)


def calls(i: int) -> list[list[object]]:
    return [["lookup", f"q{i}", 0], ["refund_reconciled", f"r{i}", i],
            ["refund_keyed", f"k{i}", i], ["lookup", f"p{i}", 0]]


def start_worker(site: Site, store: str, n: int) -> ChildProcess:
    """``tether worker`` as an operator runs it, on the chaos app, logging at INFO."""
    env = site.env({"PYTHONPATH": str(HERE), "TETHER_CHAOS_LOG": "1",
                    "TETHER_CHAOS_TOOL_DELAY": "0.05", "TETHER_CHAOS_BUSY_MS": str(BUSY_MS),
                    "TETHER_CHAOS_DEADLINE": "250"})
    argv = [sys.executable, "-m", "tether", "--store", store, "--app",
            "_outage_app:cli_harness", "worker", "--concurrency", "4"]
    child = ChildProcess(argv, env, site.dir, f"worker{n}", 250)
    site.started.append(child)
    return Site.wait_ready(child)


def counts(store: str, ledger: Path) -> dict[str, int]:
    async def go() -> dict[str, int]:
        async with app.build_harness(store, ledger) as h:
            return await h.store.count_by_status()

    return asyncio.run(go())


def submit_all(store: str, ledger: Path) -> None:
    async def go() -> None:
        async with app.build_harness(store, ledger) as h:
            for i in range(TASKS):
                await h.submit("refunder", {"calls": calls(i)}, task_id=f"t{i:03d}")

    asyncio.run(go())


def wait_until(what: str, condition: object, workers: list[ChildProcess],
               timeout: float = 120) -> None:
    """Poll *condition* (a callable) until true; fail at once, with its stderr, if a worker
    exits meanwhile (the bug this file is about), or after *timeout* (a hang)."""
    end = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        for child in workers:
            code = child.proc.poll()
            assert code is None, (f"{child.label} exited with status {code} while waiting for"
                                  f" {what}; stderr:\n{child.stderr()}")
        assert time.monotonic() < end, f"no {what} within {timeout}s; " + "; ".join(
            f"{c.label} stderr:\n{c.stderr()}" for c in workers)
        time.sleep(0.05)


def check_outcome(store: str, site: Site, workers: list[ChildProcess]) -> list[tuple[float, int]]:
    """Both workers alive, every task completed, every refund paid once, the outage logged
    once per worker; returns each worker's (seconds, failed attempts) from its log."""
    wait_until("every task completed", lambda: counts(store, site.ledger).get("completed", 0)
               == TASKS, workers)
    for child in workers:
        assert child.proc.poll() is None, f"{child.label} died:\n{child.stderr()}"
    assert counts(store, site.ledger) == {"completed": TASKS}
    paid = app.refund_counts(site.ledger)
    expected = Counter({f"r{i}": 1 for i in range(TASKS)} | {f"k{i}": 1 for i in range(TASKS)})
    assert paid == expected, {order: n for order, n in paid.items() if n != 1}
    memos = Counter(row[0] for row in app.ledger_query(
        site.ledger, "SELECT memo FROM refunds WHERE memo IS NOT NULL"))
    assert len(memos) == TASKS and set(memos.values()) == {1}, memos
    # a worker still waiting out a back-off delay (up to 5 s) when the others finished the
    # work logs the end of its outage at its next attempt
    wait_until("each worker to log the end of its outage", lambda: all(
        OUTAGE_ENDED.search(c.stderr_path.read_text(errors="replace")) for c in workers), workers)
    ridden = []
    for child in workers:
        log = child.stderr_path.read_text(errors="replace")
        began, ended = OUTAGE_BEGAN.findall(log), OUTAGE_ENDED.findall(log)
        assert len(began) == 1 and len(ended) == 1, (
            f"{child.label}: the outage should be logged once when it began and once when it"
            f" ended, not per retry; began {len(began)}, ended {ended}:\n{log[-3000:]}")
        ridden.append((float(ended[0][0]), int(ended[0][1])))
    for child in workers:  # still a healthy worker: it drains and exits 0
        child.signal(signal.SIGTERM)
        assert child.wait(60) == 0, child.stderr()
    return ridden


def check_results(store: str, ledger: Path) -> None:
    async def go() -> list[str]:
        problems = []
        async with app.build_harness(store, ledger) as h:
            for i in range(TASKS):
                info = await h.get(f"t{i:03d}")
                if info.snapshot.result != app.expected_summary(calls(i)):
                    problems.append(f"t{i:03d}: {info.snapshot.result}")
        return problems

    assert asyncio.run(go()) == []


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    site = Site.make(tmp_path)
    yield site
    site.kill_all()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    cluster = Cluster()
    try:
        yield cluster.init()
    finally:
        cluster.destroy()


@pytest.mark.postgres
def test_r13_workers_ride_out_a_postgres_restart(site: Site, cluster: Cluster) -> None:
    submit_all(cluster.url, site.ledger)
    workers = [start_worker(site, cluster.url, n) for n in (1, 2)]
    wait_until("a few tasks completed", lambda: counts(cluster.url, site.ledger).get(
        "completed", 0) >= 4, workers)
    cluster.stop("fast")
    down = time.monotonic()
    wait_until("both workers to notice the outage", lambda: all(
        OUTAGE_BEGAN.search(c.stderr_path.read_text(errors="replace")) for c in workers), workers)
    while time.monotonic() - down < 3.0:  # leases (1 s) lapse while the server is away
        time.sleep(0.05)
    cluster.start()
    ridden = check_outcome(cluster.url, site, workers)
    check_results(cluster.url, site.ledger)
    print(f"\nPostgreSQL down {time.monotonic() - down:.1f}s before completion;"
          f" workers logged (seconds, failed attempts): {ridden}")


def test_r13_workers_ride_out_a_sqlite_write_lock_held_past_the_busy_timeout(
        site: Site) -> None:
    store = f"sqlite:///{site.db}"
    submit_all(str(site.db), site.ledger)
    workers = [start_worker(site, store, n) for n in (1, 2)]
    wait_until("a few tasks completed", lambda: counts(str(site.db), site.ledger).get(
        "completed", 0) >= 4, workers)
    gate = site.dir / "release-the-lock"
    locker = ChildProcess([sys.executable, "-c", LOCKER, str(site.db), str(gate)],
                          site.env(), site.dir, "locker", 250)
    site.started.append(locker)
    locker.expect("LOCKED")
    locked = time.monotonic()
    wait_until("both workers to notice the lock", lambda: all(
        OUTAGE_BEGAN.search(c.stderr_path.read_text(errors="replace")) for c in workers), workers)
    while time.monotonic() - locked < 3 * BUSY_MS / 1000:  # held for 3x the busy timeout
        time.sleep(0.05)
    gate.touch()
    locker.expect("RELEASED")
    held = time.monotonic() - locked
    assert locker.wait(30) == 0
    ridden = check_outcome(str(site.db), site, workers)
    check_results(str(site.db), site.ledger)
    print(f"\nSQLite write lock held {held:.1f}s (busy timeout {BUSY_MS} ms); workers logged"
          f" (seconds, failed attempts): {ridden}")


@pytest.mark.postgres
async def test_r13_after_a_postgres_restart_one_call_fails_and_the_pool_drops_the_rest(
        cluster: Cluster) -> None:
    """Every pooled connection breaks with a restart. The first call to meet one gets
    StoreUnavailable; the store then drops the pool's other broken connections, so the calls
    after it are served by fresh ones instead of each meeting a broken connection in turn."""
    from tether.errors import StoreUnavailable
    from tether.store.conformance.helpers import make_task
    from tether.store.postgres import PostgresStore

    store = PostgresStore(cluster.url, max_size=6)
    try:
        await make_task(store, "t1")

        async def slow_read() -> None:
            await store._rows("SELECT pg_sleep(0.05)")

        await asyncio.gather(*(slow_read() for _ in range(6)))  # six connections opened
        assert store._pool.get_stats()["pool_available"] >= 4
        cluster.stop("fast")
        cluster.start()
        outcomes = []
        for _ in range(10):
            try:
                outcomes.append((await store.get_task("t1")).task_id)
            except StoreUnavailable:
                outcomes.append("unavailable")
        assert outcomes.count("unavailable") <= 1 and outcomes[1:] == ["t1"] * 9, outcomes
    finally:
        await store.close()


LOCKER = """
import os, sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
db.execute("BEGIN IMMEDIATE")
print("LOCKED", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
db.execute("ROLLBACK")
print("RELEASED", flush=True)
"""

"""R13 (issue 26): a SQLite store file that changes under a running worker is noticed.

A real ``tether worker`` runs a task that keeps stepping (a side-effecting refund a step,
paid into the provider's ledger outside tether). Its store file is then replaced by a
fresh store (``os.replace``, as a restore by rename does) or deleted. Before, the worker
went on paying and committing into a file nobody could see any more (60 payments
recorded nowhere, exit 0). Now it stops within a bounded time with exit 1 and one line
saying what happened; it pays nothing after the swap but the one call that may already
have been under way, commits no step after it (the old file, kept by a hard link, has
none), and writes nothing to the file now at the path.
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _workers import Site, app

from tether.errors import StoreReplaced

pytestmark = [pytest.mark.timeout(120)]

CALLS = 2_000  # far more than run before the swap: the task is still stepping then
STOPPED_WITHIN = 10.0
LINE = re.compile(r"the store file (?P<path>\S+) was (?P<what>replaced|deleted) while this"
                  r" process had it open \(inode (?P<old>\d+) → (?P<new>\d+|missing)\);"
                  r" stopping: nothing more is written to it")


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    site = Site.make(tmp_path)
    yield site
    site.kill_all()


def refunds(site: Site) -> list[tuple[str, float]]:
    return [(str(order), float(at)) for order, at in
            app.ledger_query(site.ledger, "SELECT order_id, at FROM refunds ORDER BY id")]


async def empty_store(path: Path, ledger: Path) -> None:
    harness = app.build_harness(path, ledger)
    try:
        assert await harness.reads.counts() == {}  # (opening it made the schema)
    finally:
        await harness.close()


def newest_commit(db: Path) -> float:
    with sqlite3.connect(db) as conn:
        return float(conn.execute("SELECT MAX(created_at) FROM snapshots").fetchone()[0] or 0)


def tasks_in(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM tasks").fetchone()[0])


@pytest.mark.parametrize("how", ["replaced", "deleted"])
def test_r13_a_worker_whose_store_file_is_replaced_or_deleted_stops_and_says_so(
        site: Site, how: str) -> None:
    calls = [["refund_keyed", f"o{n}", n] for n in range(CALLS)]
    site.submit("refunder", {"calls": calls}, task_id="t1")
    old_inode = os.stat(site.db).st_ino
    fresh = site.dir / "fresh.db"
    if how == "replaced":  # a fresh, empty tether store, ready to take its place
        asyncio.run(empty_store(fresh, site.ledger))
    worker = Site.wait_ready(site.worker("--concurrency", "1", env={
        "TETHER_CHAOS_TOOL_DELAY_AFTER": "0.01", "TETHER_CHAOS_DEADLINE": "100"}))
    end = time.monotonic() + 30
    while len(refunds(site)) < 20:  # the task is stepping
        assert worker.proc.poll() is None, worker.stderr()
        assert time.monotonic() < end, worker.stderr()
        time.sleep(0.01)

    os.link(site.db, site.dir / "gone.db")  # the old file, kept to look into afterwards
    if how == "replaced":
        os.replace(fresh, site.db)
    else:
        os.remove(site.db)
    swapped, swapped_clock = time.time(), time.monotonic()
    code = worker.wait(30)
    took = time.monotonic() - swapped_clock
    stderr = worker.stderr()

    assert code == 1, stderr
    assert took < STOPPED_WITHIN, (took, stderr)
    assert len(LINE.findall(stderr)) == 1, stderr
    found = LINE.search(stderr)
    assert found is not None
    assert (found["path"], found["what"], found["old"]) == (str(site.db), how, str(old_inode))
    assert found["new"] == ("missing" if how == "deleted" else str(os.stat(site.db).st_ino))
    assert "Traceback" not in stderr, stderr
    assert "completed; released" not in stderr and "stopped; its tasks were released" not in stderr

    paid = refunds(site)
    after = [order for order, at in paid if at > swapped]
    assert len(after) <= 1, after  # at most the call already under way when the file went
    assert len(paid) < CALLS
    last_step = newest_commit(site.dir / "gone.db")  # the worker's connection still had it
    assert 0 < last_step <= swapped  # no step was committed (acknowledged) after the swap
    if how == "replaced":  # the file there now got nothing from the worker
        assert tasks_in(site.db) == 0
    else:
        assert not site.db.exists()  # not even recreated


def test_r13_an_idle_worker_notices_at_its_next_claim_round(
        site: Site, caplog: pytest.LogCaptureFixture) -> None:
    """No task to commit, nothing to renew: the claim round looks at the file, so an idle
    worker stops too (one ERROR line, StoreReplaced raised from serve)."""
    async def go() -> float:
        harness = app.build_harness(site.db, site.ledger)
        try:
            serving = asyncio.create_task(harness.serve(concurrency=2))
            await asyncio.sleep(0.3)
            assert not serving.done()
            os.remove(site.db)
            began = time.monotonic()
            with pytest.raises(StoreReplaced, match="was deleted while this process had it open"):
                await asyncio.wait_for(serving, STOPPED_WITHIN)
            return time.monotonic() - began
        finally:
            await harness.close()

    took = asyncio.run(go())
    assert took < 1.0, took  # a claim round every poll interval (0.05 s here)
    lines = [r.getMessage() for r in caplog.records if "while this process had it open" in r.getMessage()]
    assert len(lines) == 1, lines

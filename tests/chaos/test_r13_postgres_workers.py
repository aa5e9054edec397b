"""R13 on PostgreSQL: three worker processes on different "machines" (processes that share
nothing but the database) run 300 tasks. One is SIGKILLed mid-run; another is frozen with
SIGSTOP past its lease and then resumed. Every task completes, every refund is paid once,
and the frozen worker's late writes are refused by the lease fence instead of landing.

The frozen worker may wake up inside a refund whose call another worker has meanwhile
taken over. Tether's fence cannot stop a provider call, so the reconcile-only refund
fences at the provider (``ToolContext.fence``: a smaller token than one already seen for
the key is refused). A run of this test once caught exactly that double payment before
the provider fenced.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from _child import ChildProcess
from _workers import HERE, app

pytestmark = [pytest.mark.timeout(240), pytest.mark.postgres]

TASKS = 300
LEASE = 1.0


def calls(i: int) -> list[list[object]]:
    return [["lookup", f"q{i}", 0], ["refund_keyed", f"k{i}", i], ["refund_reconciled", f"r{i}", i]]


@pytest.fixture
def workers(tmp_path: Path, pg_url: str) -> Iterator[tuple[Path, list[ChildProcess]]]:
    ledger = tmp_path / "provider.db"
    app.init_ledger(ledger)
    started: list[ChildProcess] = []
    yield ledger, started
    for child in started:
        if child.proc.poll() is None:
            child.kill()


def start_worker(pg_url: str, ledger: Path, n: int, started: list[ChildProcess]) -> ChildProcess:
    env = {k: v for k, v in os.environ.items()
           if k != "TETHER_FAILPOINTS" and not k.startswith("TETHER_CHAOS")}
    env.update(TETHER_CHAOS_DB=pg_url, TETHER_CHAOS_LEDGER=str(ledger), PYTHONUNBUFFERED="1",
               TETHER_CHAOS_LEASE=str(LEASE), TETHER_CHAOS_POLL="0.02",
               TETHER_CHAOS_TOOL_DELAY="0.05", TETHER_CHAOS_DEADLINE="200")
    child = ChildProcess([sys.executable, str(HERE / "app.py"), "serve"], env, ledger.parent,
                         f"pgworker{n}", 30)
    started.append(child)
    child.expect("SERVING")
    return child


def counts(pg_url: str, ledger: Path) -> dict[str, int]:
    async def go() -> dict[str, int]:
        async with app.build_harness(pg_url, ledger) as h:
            return await h.store.count_by_status()

    return asyncio.run(go())


def leased_by(pg_url: str, ledger: Path, pid: int) -> list[str]:
    """The tasks whose lease a worker process holds now (worker ids carry the pid)."""
    async def go() -> list[str]:
        async with app.build_harness(pg_url, ledger) as h:
            return [r.task_id for r in await h.reads.tasks(None, 10_000)
                    if r.lease_owner is not None and f":{pid}:" in r.lease_owner]

    return asyncio.run(go())


def test_r13_three_workers_one_killed_one_frozen_past_its_lease_every_task_once(
        workers: tuple[Path, list[ChildProcess]], pg_url: str) -> None:
    ledger, started = workers

    async def submit_all() -> None:
        async with app.build_harness(pg_url, ledger) as h:
            for i in range(TASKS):
                await h.submit("refunder", {"calls": calls(i)}, task_id=f"t{i:03d}")

    asyncio.run(submit_all())
    killed, frozen, steady = (start_worker(pg_url, ledger, n, started) for n in range(3))
    while counts(pg_url, ledger).get("completed", 0) < TASKS // 5:
        time.sleep(0.05)
    assert killed.kill() == -signal.SIGKILL
    # frozen at a moment it is not writing to the shared ledger file: a worker frozen inside
    # a ledger write would stall the others' refunds (a test artefact: real providers do not
    # share a lock with their clients), and then nobody could take its tasks over
    frozen.stop_outside_write_lock(ledger)
    held = leased_by(pg_url, ledger, frozen.proc.pid)  # what it held when it froze
    time.sleep(4 * LEASE)  # past its lease and PostgreSQL's idle-in-transaction timeout (2x)
    frozen.signal(signal.SIGCONT)
    end = time.monotonic() + 180
    while counts(pg_url, ledger).get("completed", 0) < TASKS:
        assert time.monotonic() < end, counts(pg_url, ledger)
        time.sleep(0.2)
    for child in (frozen, steady):
        child.kill()

    assert counts(pg_url, ledger) == {"completed": TASKS}
    paid = app.refund_counts(ledger)
    expected = Counter({f"k{i}": 1 for i in range(TASKS)} | {f"r{i}": 1 for i in range(TASKS)})
    assert paid == expected, {o: n for o, n in paid.items() if n != 1}

    async def check_results() -> list[str]:
        problems = []
        async with app.build_harness(pg_url, ledger) as h:
            for i in range(TASKS):
                info = await h.get(f"t{i:03d}")
                history = await h.history(f"t{i:03d}")
                if info.snapshot.result != app.expected_summary(calls(i)):
                    problems.append(f"t{i:03d}: result {info.snapshot.result}")
                if len(history) != info.snapshot.history_len:
                    problems.append(f"t{i:03d}: dialog {len(history)} rows, head says"
                                    f" {info.snapshot.history_len}")
        return problems

    assert asyncio.run(check_results()) == []
    woke = frozen.stderr()  # its tasks were taken over: every late write of it was refused
    assert not held or "lease lost" in woke or "leaving it for recovery" in woke, (
        f"the frozen worker held {held} when stopped and says nothing of losing them:\n{woke}")

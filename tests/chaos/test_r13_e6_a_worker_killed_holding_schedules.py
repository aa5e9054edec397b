"""R13, E6 (issue 29): a worker SIGKILLed while it holds due schedules costs no run.

Workers take their own share of the due schedules and hold them while they start their runs
(``Settings.schedule_hold``). A real ``tether worker`` process takes every one of twenty
every-second schedules and kills itself (failpoint ``schedule_run_started``) after starting
the fifth run, before moving that schedule on. Two fresh workers then carry on: once the
dead worker's hold ends they start what it held. For every schedule, the runs are one a
second from its first to its last (none missed, none started twice: a run is a task whose id
is the schedule's name and time), the run started by the dead worker is there once, and
every run finishes, the runs it had claimed and not yet begun included: their lease is
taken over at once, as a running task's is (its process is gone), not left pending.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest

import tether as tt

pytestmark = pytest.mark.timeout(240)

APP = '''
import tether as tt

harness = tt.Harness(settings=tt.Settings(poll_interval=0.05, schedule_hold=2.0))


@harness.agent("tick")
class Tick(tt.Agent):
    async def plan(self, t):
        return tt.Finish(t.input)
'''
SCHEDULES = 20
KILLED_AT = 5  # the dead worker died after its fifth run started, before moving it on
AFTER = 4  # seconds of runs every schedule must have after the kill


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'schedules.db'}"


def test_r13_a_worker_killed_holding_schedules_costs_no_run(store_url: str,
                                                            tmp_path: Path) -> None:
    module = f"heldapp_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(APP)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TETHER_STORE": store_url,
           "TETHER_APP": f"{module}:harness"}
    env.pop("TETHER_FAILPOINTS", None)
    tether = [sys.executable, "-m", "tether"]
    asyncio.run(_add_schedules(store_url))

    doomed = subprocess.run([*tether, "worker"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120,
                            env={**env, "TETHER_FAILPOINTS": f"schedule_run_started@{KILLED_AT}"})
    assert doomed.returncode == -signal.SIGKILL, doomed.stderr
    killed_at = time.time()
    before = _runs(asyncio.run(_task_ids(store_url)))
    assert sum(map(len, before.values())) >= KILLED_AT  # runs started side by side; it died

    workers = [subprocess.Popen([*tether, "worker"], env=env, cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            runs = _runs(asyncio.run(_task_ids(store_url)))
            if len(runs) == SCHEDULES and all(max(s) >= killed_at + AFTER for s in runs.values()):
                break
            time.sleep(0.3)
        asyncio.run(_pause_all(store_url))
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        errors = [worker.communicate(timeout=60)[1] for worker in workers]
    assert all("Traceback" not in err for err in errors), errors
    subprocess.run([*tether, "worker", "--until-idle"], env=env, cwd=tmp_path, check=True,
                   capture_output=True, timeout=120)

    ids = asyncio.run(_task_ids(store_url))
    runs = _runs(ids)
    assert len(runs) == SCHEDULES
    for name, seconds in runs.items():
        assert seconds == [seconds[0] + n for n in range(len(seconds))], name  # none missed
        assert seconds[-1] >= killed_at + AFTER, name  # it went on after the kill
    for name, seconds in before.items():
        assert set(seconds) <= set(runs[name])  # the dead worker's runs are kept, once each
    assert asyncio.run(_statuses(store_url)) == {"completed": len(ids)}


async def _add_schedules(url: str) -> None:
    async with _harness(url) as h:
        for n in range(SCHEDULES):
            await h.schedule(f"s{n:02d}", "* * * * * *", "tick", n)


async def _pause_all(url: str) -> None:
    async with _harness(url) as h:
        for n in range(SCHEDULES):
            await h.pause_schedule(f"s{n:02d}")


async def _task_ids(url: str) -> list[str]:
    async with _harness(url) as h:
        return [record.task_id for record in await h.store.list_tasks(limit=100_000)]


async def _statuses(url: str) -> dict[str, int]:
    async with _harness(url) as h:
        return await h.store.count_by_status()


def _harness(url: str) -> tt.Harness:
    h = tt.Harness(url)

    @h.agent("tick")
    class Tick(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Finish(t.input)

    return h


def _runs(task_ids: list[str]) -> dict[str, list[float]]:
    """Each schedule's run times, in order, from the ids of the tasks its runs are."""
    runs: dict[str, list[float]] = defaultdict(list)
    for task_id in task_ids:
        name, _, at = task_id.rpartition("-")
        runs[name].append(datetime.strptime(at, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp())
    return {name: sorted(seconds) for name, seconds in runs.items()}

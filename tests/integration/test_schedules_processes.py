"""R13, E6 (issue 19): a schedule fires once across worker processes. Three `tether worker`
processes share a store (SQLite, then PostgreSQL) and a schedule that runs every second;
every second from its first run to its last has exactly one task (each run started by one
worker, none missed), and each run's task ran to the end. The CLI drives it as an operator
would: `tether schedule add`, `ls`, `pause`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest

APP = '''
import tether as tt

harness = tt.Harness(settings=tt.Settings(poll_interval=0.05))


@harness.agent("tick")
class Tick(tt.Agent):
    async def plan(self, t):
        return tt.Finish(t.input)
'''
RUNS = 4


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'schedules.db'}"


def test_a_schedule_fires_once_per_run_across_worker_processes(store_url: str,
                                                               tmp_path: Path) -> None:
    name = f"tickapp_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(APP)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TETHER_STORE": store_url,
           "TETHER_APP": f"{name}:harness", "COLUMNS": "200"}
    tether = [sys.executable, "-m", "tether"]

    def cli(*args: str) -> str:
        done = subprocess.run([*tether, *args], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    added = cli("schedule", "add", "ticker", "--cron", "* * * * * *", "--agent", "tick",
                "--input", '"tock"')
    assert "ticker" in added and "next run" in added
    workers = [subprocess.Popen([*tether, "worker"], env=env, cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
               for _ in range(3)]
    try:
        deadline = time.monotonic() + 60
        while len(_runs(cli)) < RUNS and time.monotonic() < deadline:
            time.sleep(0.2)
        cli("schedule", "pause", "ticker")
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        errors = [worker.communicate(timeout=60)[1] for worker in workers]
    assert all("Traceback" not in err for err in errors), errors
    cli("worker", "--until-idle")  # what the stopped workers had not run yet
    runs = _runs(cli)
    assert len(runs) >= RUNS
    seconds = sorted(datetime.strptime(r.rsplit("-", 1)[1], "%Y%m%dT%H%M%SZ").timestamp()
                     for r in runs)
    assert seconds == [seconds[0] + n for n in range(len(seconds))]  # one a second, none twice
    listed = cli("schedule", "ls")
    assert re.search(r"ticker .*paused", listed), listed
    for run in runs:
        assert json.loads(cli("show", run, "--json"))["snapshot"]["result"] == "tock"


def _runs(cli: object) -> list[str]:
    listed = json.loads(cli("ls", "--json"))  # type: ignore[operator]
    return [t["task_id"] for t in listed if t["task_id"].startswith("ticker-")]


async def test_r13_a_worker_whose_clock_runs_fast_starts_nothing_early_on_postgres(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler judges due times by the PostgreSQL server's clock: a worker whose own
    clock runs two minutes fast neither starts a run due in a minute nor moves the
    schedule past it (the run a slow-clocked worker would then never start)."""
    import dataclasses

    import tether as tt
    from tether.engine.scheduling import fire_due

    h = tt.Harness(pg_url)

    @h.agent("tick")
    class Tick(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Finish(t.input)

    record = await h.schedule("soon", "* * * * *", "tick")
    server = await h.store.clock()
    assert abs(server - time.time()) < 5
    await h.store.put_schedule(dataclasses.replace(record, next_at=server + 60))
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 120)
    assert await fire_due(h.store, h.start_run, h.log, h.agents) == 0
    monkeypatch.undo()
    assert (await h.schedule_named("soon")).next_at == server + 60  # not moved on
    assert await h.store.list_tasks() == []
    await h.close()

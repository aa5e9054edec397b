"""Schedules at scale: 10,000 every-minute schedules falling due at once, started by real
``tether worker`` processes, on SQLite and on PostgreSQL.

For each store and each number of workers: a fresh store with N schedules (``* * * * *``,
an agent that finishes at once), every one due at the next minute's turn; W ``tether
worker`` processes started before it (as an operator runs them, scheduler and runner in
one). From that minute's turn, the run tasks are counted until all N exist or two minutes
pass. Figures: runs started per minute (N over the time the last one took), the first and
the latest start after the due time, and runs missing (skipped as late, or never
started). Each run's time is its task's ``created_at`` as the store recorded it.

    .bench-venv/bin/python bench/schedules_scale.py [--schedules 10000] [--workers 1,2,4]
        [--pg postgresql://127.0.0.1:5432/test] [--out docs/benchmarks-schedules.md]

prints markdown (and writes it to --out) and exits 0 (1 if a configuration failed).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tether as tt
from tether import schedules

APP = '''
import tether as tt

harness = tt.Harness()


@harness.agent("tick")
class Tick(tt.Agent):
    async def plan(self, t):
        return tt.Finish(t.input)
'''
PG = os.environ.get("TETHER_BENCH_PG", "postgresql://127.0.0.1:5432/test")
WAIT = 120.0
"""Seconds after the due time a configuration is given to start every run."""


async def fill(url: str, count: int, due: float) -> None:
    """A fresh store holding *count* every-minute schedules, all due at *due*."""
    h = tt.Harness(url)

    @h.agent("tick")
    class Tick(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Finish(t.input)

    first = await h.schedule("s-00000", "* * * * *", "tick")
    records = [dataclasses.replace(first, name=f"s-{n:05d}", next_at=due) for n in range(count)]
    for start in range(0, count, 500):
        await asyncio.gather(*(h.store.put_schedule(r) for r in records[start:start + 500]))
    await h.close()


async def started_runs(url: str, due: float) -> list[float]:
    """The creation times of the run tasks of the minute *due*."""
    h = tt.Harness(url)
    try:
        stamp = schedules.run_id("x", due)[1:]  # "-YYYYmmddTHHMMSSZ"
        return [t.created_at for t in await h.store.list_tasks(limit=1_000_000)
                if t.task_id.endswith(stamp)]
    finally:
        await h.close()


def fresh_database(admin: str) -> str:
    """A new database on the server of *admin* (dropped by :func:`drop_database`)."""
    import uuid

    import psycopg

    name = f"tether_bench_schedules_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{admin.rpartition('/')[0]}/{name}"


def drop_database(admin: str, url: str) -> None:
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.rpartition("/")[2]}" WITH (FORCE)')


def one(store: str, url: str, count: int, workers: int, folder: Path) -> dict[str, Any]:
    """One configuration: fill, start the workers, count the runs of the due minute."""
    due = (time.time() // 60 + 2) * 60  # the workers are up well before it
    asyncio.run(fill(url, count, due))
    env = {**os.environ, "PYTHONPATH": str(folder), "TETHER_STORE": url,
           "TETHER_APP": "scheduleapp:harness"}
    procs = [subprocess.Popen([sys.executable, "-m", "tether", "worker"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(workers)]
    try:
        found: list[float] = []
        while time.time() < due + WAIT:
            time.sleep(2.0)
            if time.time() > due:
                found = asyncio.run(started_runs(url, due))
                if len(found) >= count:
                    break
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    latest = max(found) - due if found else None
    return {"store": store, "workers": workers, "schedules": count, "started": len(found),
            "first": min(found) - due if found else None, "latest": latest,
            "per_minute": len(found) / latest * 60 if latest and latest > 0 else None}


def markdown(rows: list[dict[str, Any]], count: int, seconds: float) -> str:
    lines = [
        "### Schedules at scale: every-minute schedules falling due at once", "",
        f"{count:,} schedules (`* * * * *`, an agent that finishes at once), all due at the"
        " same minute's turn, started by real `tether worker` processes (scheduler and runner"
        " in one, as an operator runs them) on a fresh store. Runs started per minute: the"
        " runs over the time the latest took after its due time. First and latest start:"
        " each run task's `created_at`, as the store recorded it, after the due time. Missing:"
        f" runs of that minute not started within {WAIT:.0f} s (`bench/schedules_scale.py`).",
        "",
        "| store | workers | runs started | missing | runs started per minute"
        " | first start after due, s | latest start after due, s |",
        "|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['store']} | {row['workers']} | did not run: {row['error']} "
                         "| | | | |")
            continue
        per = f"{row['per_minute']:,.0f}" if row["per_minute"] else "-"
        first = f"{row['first']:.2f}" if row["first"] is not None else "-"
        latest = f"{row['latest']:.2f}" if row["latest"] is not None else "-"
        lines.append(f"| {row['store']} | {row['workers']} | {row['started']:,} |"
                     f" {row['schedules'] - row['started']:,} | {per} | {first} | {latest} |")
    lines += ["", f"Python {platform.python_version()}, tether {tt.__version__}, on"
              f" {os.cpu_count()} CPUs. Ran in {seconds:,.0f} s."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--pg", default=PG)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    started = time.time()
    rows: list[dict[str, Any]] = []
    stores = ["sqlite"] + ([] if args.no_postgres else ["postgres"])
    with tempfile.TemporaryDirectory(prefix="tether-schedules-") as work:
        folder = Path(work)
        (folder / "scheduleapp.py").write_text(APP)
        for store in stores:
            for workers in (int(w) for w in args.workers.split(",")):
                print(f"[{time.time() - started:5.0f}s] {store}, {workers} worker(s)",
                      file=sys.stderr, flush=True)
                url = ""
                try:
                    url = fresh_database(args.pg) if store == "postgres" else \
                        f"sqlite:///{folder / f'{store}-{workers}.db'}"
                    rows.append(one(store, url, args.schedules, workers, folder))
                except Exception as error:  # one configuration failing must not lose the rest
                    rows.append({"store": store, "workers": workers,
                                 "error": f"{type(error).__name__}: {error}"})
                finally:
                    if store == "postgres" and url:
                        drop_database(args.pg, url)
    text = markdown(rows, args.schedules, time.time() - started)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    sys.exit(1 if any("error" in r or r["started"] < r["schedules"] for r in rows) else 0)


if __name__ == "__main__":
    main()

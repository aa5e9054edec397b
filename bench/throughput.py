"""Throughput with many tasks (issue 15): steps per second when 1, 16 or 256 tasks run side
by side in ONE worker process, tether beside DBOS, each on SQLite and on PostgreSQL.

A step cost measured one task at a time (``systems.py``) says nothing of what a worker
sustains when many tasks share its store connection and its event loop (or, for DBOS, its
threads). Here every task runs the workload of :mod:`workload` (S quick tool calls, a
200-byte argument, a 500-byte result):

* tether (default settings): N tasks submitted, then ``run_until_idle(concurrency=N)``;
* DBOS: N workflows enqueued, then their queue registered with ``worker_concurrency=N``
  (after the enqueues, so that its first poll dequeues all N at once, as tether's worker
  finds all N submitted); the model turn and the tool call are each a ``@DBOS.step``, as
  in :func:`systems.run_dbos`.

The clock runs from the first tool call of any task until every task is finished (tether:
``run_until_idle`` has returned; DBOS: the last ``get_result`` has returned, each polling
every 5 ms). It leaves out submitting and the wait before the first task starts (DBOS's
queue is polled once a second by default), so it reads as sustained throughput;
``from_submit_s`` in the JSON line covers everything from the first submit, for reference.

    python bench/throughput.py SYSTEM TASKS STEPS FOLDER [--pg URL]

prints one JSON line. ``compare.py`` calls :func:`interleaved`, every run its own process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from systems import bench_harness, dbos_agent, fresh_database
from workload import Meter

SYSTEMS = ("tether-sqlite", "dbos-sqlite", "tether-postgres", "dbos-postgres")
PEERS = {"tether-sqlite": "dbos-sqlite", "tether-postgres": "dbos-postgres"}
"""Each tether store and the DBOS system on the same database, for the ratio."""
QUEUE = "bench"
RESULT_POLL = 0.005
"""Seconds between a DBOS handle's looks at its result: DBOS's default (1 s) would add up
to a second to the clock."""
Span = tuple[float, float]
"""perf_counter at the first submit (or enqueue), and when every task was finished."""


def run_tether(meter: Meter, tasks: int, steps: int, url: str) -> Span:
    """N tether tasks of the workload, submitted, then run by one worker N at a time."""

    async def main() -> Span:
        harness = bench_harness(meter, steps, url)
        async with harness:
            began = time.perf_counter()
            for _ in range(tasks):
                await harness.submit("bench")
            await harness.run_until_idle(concurrency=tasks)
            done = time.perf_counter()
            counts = await harness.store.count_by_status()
        if counts != {"completed": tasks}:
            sys.exit(f"tether: statuses {counts}, expected {tasks} completed")
        return began, done

    return asyncio.run(main())


def run_dbos(meter: Meter, tasks: int, steps: int, url: str) -> Span:
    """N DBOS workflows of the workload from one queue, all of them running at once."""
    from dbos import DBOS

    agent = dbos_agent(meter, steps, url)
    DBOS.launch()
    try:
        began = time.perf_counter()
        handles = [DBOS.enqueue_workflow(QUEUE, agent) for _ in range(tasks)]
        DBOS.register_queue(QUEUE, worker_concurrency=tasks)
        results = [h.get_result(polling_interval_sec=RESULT_POLL) for h in handles]
        done = time.perf_counter()
    finally:
        DBOS.destroy()
    if results != [steps] * tasks:
        sys.exit(f"dbos: workflows returned {sorted(set(results))}, expected {steps} each")
    return began, done


RUNNERS: dict[str, Callable[[Meter, int, int, str], Span]] = {
    "tether-sqlite": run_tether, "tether-postgres": run_tether,
    "dbos-sqlite": run_dbos, "dbos-postgres": run_dbos}


def measure(system: str, tasks: int, steps: int, folder: Path, pg: str) -> dict[str, Any]:
    """One run of *tasks* tasks of *steps* steps each, in this process; steps per second."""
    if system.startswith("dbos"):
        import dbos  # noqa: F401  (imported before any clock starts)
    meter = Meter(steps)
    if system.endswith("postgres"):
        with fresh_database(pg) as url:
            began, done = RUNNERS[system](meter, tasks, steps, url)
    else:
        db = folder / ("tether.db" if system.startswith("tether") else "dbos.sqlite")
        began, done = RUNNERS[system](meter, tasks, steps, f"sqlite:///{db}")
    calls = len(meter.stamps)
    if calls != tasks * steps:
        sys.exit(f"{system}: {calls} tool calls ran, expected {tasks} x {steps}")
    seconds = done - meter.stamps[0]
    return {"system": system, "tasks": tasks, "steps": steps, "calls": calls,
            "seconds": seconds, "steps_per_s": calls / seconds,
            "from_submit_s": done - began, "steps_per_s_from_submit": calls / (done - began)}


def interleaved(run_one: Callable[[str, int], dict[str, Any]], systems: Sequence[str],
                task_counts: Sequence[int], rounds: int,
                say: Callable[[str], None]) -> dict[str, dict[int, list[float] | Exception]]:
    """Steps per second of every (system, N), one run each per round, rounds interleaved so
    that a noisy moment of the shared machine hits every system alike. *run_one* runs one
    (system, N) in a process of its own and returns its JSON line; a run that fails is kept
    as its exception, and that (system, N) is not tried again."""
    found: dict[str, dict[int, list[float] | Exception]] = {s: {} for s in systems}
    for round_ in range(1, rounds + 1):
        for tasks in task_counts:
            for system in systems:
                slot = found[system].setdefault(tasks, [])
                if isinstance(slot, Exception):
                    continue
                say(f"throughput round {round_}/{rounds}: {system}, {tasks} tasks")
                try:
                    slot.append(float(run_one(system, tasks)["steps_per_s"]))
                except Exception as failure:  # one system that cannot run must not lose the rest
                    found[system][tasks] = failure
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system", choices=SYSTEMS)
    parser.add_argument("tasks", type=int)
    parser.add_argument("steps", type=int)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    if args.tasks < 1 or args.steps < 1:
        parser.error("TASKS and STEPS must be at least 1")
    args.folder.mkdir(parents=True, exist_ok=True)
    print(json.dumps(measure(args.system, args.tasks, args.steps, args.folder, args.pg)))


if __name__ == "__main__":
    main()

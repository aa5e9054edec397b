"""A worker's scheduler: every second it starts the runs of the schedules that are due and
moves each schedule on. Starting a run first and moving the schedule after means a worker
that dies in between leaves the schedule due, and the next worker starts the same runs again
under the same task ids, which the store refuses: each run starts once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from tether import schedules
from tether.errors import StoreUnavailable, TaskExists, TetherError
from tether.store.base import ScheduleRecord, WorkerStore

StartRun = Callable[[ScheduleRecord, str], Awaitable[None]]
"""Starts one run: a task of the schedule's agent with its input, under the id given."""
LOOK_EVERY = 1.0
"""Seconds between a worker's looks for due schedules (cron counts in minutes)."""


async def fire_due(store: WorkerStore, start: StartRun, log: logging.Logger,
                   warned: set[str] | None = None) -> int:
    """Start the due runs of every due schedule; how many were started here. A schedule
    this app cannot start is named in the log once per worker (in *warned*), not each
    second."""
    warned = set() if warned is None else warned
    started = 0
    now = time.time()
    for schedule in await store.due_schedules(now):
        assert schedule.next_at is not None
        runs, following = schedules.runs_due(schedule.cron, schedule.timezone, schedule.next_at,
                                             schedule.catch_up, now)
        try:
            for at in runs:
                started += await _start(start, schedule, schedules.run_id(schedule.name, at))
        except TetherError as error:  # this app cannot start it (say, the agent is unknown)
            if schedule.name not in warned:
                warned.add(schedule.name)
                log.warning("schedule %s: its runs cannot be started by this worker (%s);"
                            " left to a worker whose app can", schedule.name, error)
            continue
        if await store.advance_schedule(schedule.name, schedule.next_at, following, now):
            log.info("schedule %s: started %d run(s)%s; next at %s", schedule.name, len(runs),
                     f", {len(runs) - 1} of them late" if len(runs) > 1 else "",
                     time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(following)))
    return started


async def _start(start: StartRun, schedule: ScheduleRecord, task_id: str) -> int:
    try:
        await start(schedule, task_id)
    except TaskExists:
        return 0  # another worker started this run first
    return 1


async def keep_schedules(store: WorkerStore, start: StartRun, log: logging.Logger) -> None:
    """Look for due schedules every :data:`LOOK_EVERY` seconds until cancelled."""
    failed = False
    unstartable: set[str] = set()
    while True:
        await asyncio.sleep(LOOK_EVERY)
        try:
            await fire_due(store, start, log, unstartable)
        except StoreUnavailable:
            continue
        except Exception:  # the scheduler must never stop the worker
            if not failed:
                log.exception("starting scheduled runs failed; trying again every %.0fs",
                              LOOK_EVERY)
            failed = True

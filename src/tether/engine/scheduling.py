"""A worker's scheduler: every second it takes its share of the schedules that are due,
starts their runs and moves each schedule on. Workers side by side take different schedules
(the store holds each taken one for ``Settings.schedule_hold`` seconds), so their work adds up. Starting a
run first and moving the schedule after means a worker that dies in between leaves the
schedule due, and once its hold ends the next worker starts the same runs again under the same
task ids, which the store refuses: each run starts once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection

from tether import schedules
from tether.errors import CorruptStore, StoreUnavailable, TaskExists, TetherError, UnknownAgent
from tether.failpoints import failpoint
from tether.store.base import ScheduleRecord, WorkerStore

StartRun = Callable[[ScheduleRecord, str], Awaitable[None]]
"""Starts one run: a task of the schedule's agent with its input, under the id given."""
LOOK_EVERY = 1.0
"""Seconds between a worker's looks for due schedules (cron counts in minutes)."""
BATCH = 200
"""Due schedules read at a time."""
MAX_BATCHES = 50
"""Batches one look may start (10,000 schedules), so a look ends and the next begins."""
AT_ONCE = 32
"""Schedules of a batch started side by side."""
async def fire_due(store: WorkerStore, start: StartRun, log: logging.Logger,
                   agents: Collection[str] | None = None, warned: set[str] | None = None,
                   hold: float = 30.0) -> int:
    """Start the due runs of every due schedule of *agents* that this worker takes (the
    app's: a schedule of an agent this app lacks is left to a worker that has it, and never
    fills this one's window); how many were started here. Due is judged by the store's clock, so a worker
    whose own clock is off starts nothing early or late. Batch after batch while the window
    comes back full, each batch's schedules started side by side (SQLite commits them
    together), so thousands due in the same minute start in that minute. A schedule whose
    runs this app cannot start is named in the log once per worker (in *warned*)."""
    warned = set() if warned is None else warned
    started = 0
    gate = asyncio.Semaphore(AT_ONCE)
    for _ in range(MAX_BATCHES):
        now = await store.clock()
        due = await store.claim_due_schedules(now, BATCH, agents, hold)
        fired = await asyncio.gather(*(_fire(store, start, log, schedule, now, warned, gate)
                                       for schedule in due))
        started += sum(count for count, _ in fired)
        if len(due) < BATCH or not any(moved for _, moved in fired):
            break  # the window is not full, or holds only schedules no one here can start
    return started


async def _fire(store: WorkerStore, start: StartRun, log: logging.Logger,
                schedule: ScheduleRecord, now: float, warned: set[str],
                gate: asyncio.Semaphore) -> tuple[int, bool]:
    """Start one schedule's due runs, then move it on (if no other worker did first): how
    many runs started here, and whether the schedule moved on."""
    assert schedule.next_at is not None
    runs, following = schedules.runs_due(schedule.cron, schedule.timezone, schedule.next_at,
                                         schedule.catch_up, now)
    started = 0
    async with gate:
        try:
            for at in runs:
                started += await _start(start, schedule, schedules.run_id(schedule.name, at))
        except (StoreUnavailable, CorruptStore):
            raise  # the store's trouble, not the schedule's: the worker rides it out
        except UnknownAgent as error:  # another app's agent: left due for a worker that has it
            if schedule.name not in warned:
                warned.add(schedule.name)
                log.warning("schedule %s: its runs cannot be started by this worker (%s);"
                            " left to a worker whose app can", schedule.name, error)
            return started, False
        except TetherError as error:  # no worker could start it (its input is refused)
            log.error("schedule %s: its run could not be started (%s); it is skipped and the"
                      " schedule moves on: fix the schedule (`tether schedule add` again)",
                      schedule.name, error)
        failpoint("schedule_run_started")  # started, not yet moved on: held until its hold ends
        moved = await store.advance_schedule(schedule.name, schedule.next_at, following, now)
        if moved:
            log.debug("schedule %s: started %d run(s)%s; next at %s", schedule.name, len(runs),
                      f", {len(runs) - 1} of them late" if len(runs) > 1 else "",
                      time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(following)))
    return started, moved


async def _start(start: StartRun, schedule: ScheduleRecord, task_id: str) -> int:
    try:
        await start(schedule, task_id)
    except TaskExists:
        return 0  # another worker started this run first
    return 1


async def keep_schedules(store: WorkerStore, start: StartRun, log: logging.Logger,
                         agents: Collection[str] | None = None, hold: float = 30.0) -> None:
    """Look for due schedules of *agents* every :data:`LOOK_EVERY` seconds until cancelled,
    holding those taken for *hold* seconds."""
    failed = False
    unstartable: set[str] = set()
    while True:
        await asyncio.sleep(LOOK_EVERY)
        try:
            await fire_due(store, start, log, agents, unstartable, hold)
        except StoreUnavailable:
            continue
        except Exception:  # the scheduler must never stop the worker
            if not failed:
                log.exception("starting scheduled runs failed; trying again every %.0fs",
                              LOOK_EVERY)
            failed = True

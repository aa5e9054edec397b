"""R13, E6 (issue 19): cron schedules stored in the store start tasks; missed runs are
skipped or caught up (bounded); pause, resume, run now and delete; a worker that dies
between starting a run and moving the schedule on does not start the run twice."""

from __future__ import annotations

import dataclasses
import time

import pytest
from _support import fast_settings

import tether as tt
from tether import schedules
from tether.engine.scheduling import fire_due


def app() -> tt.Harness:
    h = tt.Harness("memory://", settings=fast_settings())

    @h.agent("report")
    class Report(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Finish({"scope": t.input})

    return h


async def started(h: tt.Harness) -> list[str]:
    return sorted(t.task_id for t in await h.store.list_tasks())


async def test_missed_runs_are_caught_up_to_the_bound_and_the_schedule_moves_on() -> None:
    h = app()
    record = await h.schedule("minutely", "* * * * *", "report", "eu", catch_up=2)
    assert record.next_at is not None and record.next_at > time.time()
    await h.store.put_schedule(dataclasses.replace(record, next_at=time.time() - 600))
    assert await fire_due(h.store, h.start_run, h.log) == 3  # two late, one on time
    runs = await started(h)
    assert len(runs) == 3 and all(r.startswith("minutely-") for r in runs)
    moved = await h.schedule_named("minutely")
    assert moved.next_at is not None and moved.next_at > time.time()
    assert await fire_due(h.store, h.start_run, h.log) == 0  # nothing is due any more
    await h.run_until_idle(timeout=10)
    assert {(await h.get(r)).snapshot.result["scope"] for r in runs} == {"eu"}
    await h.close()


async def test_a_worker_that_died_before_moving_the_schedule_does_not_run_it_twice() -> None:
    h = app()
    record = await h.schedule("hourly", "* * * * *", "report", "us")
    due = dataclasses.replace(record, next_at=time.time() - 120)
    await h.store.put_schedule(due)
    for run in schedules.runs_due(due.cron, due.timezone, due.next_at, 0, time.time())[0]:
        await h.start_run(due, schedules.run_id("hourly", run))
    # ... and the worker died here, before moving the schedule on: the next one finds it due
    assert await fire_due(h.store, h.start_run, h.log) == 0  # the run exists: not again
    assert len(await started(h)) == 1
    assert (await h.schedule_named("hourly")).next_at > time.time()  # type: ignore[operator]
    await h.close()


async def test_pause_resume_run_now_and_delete() -> None:
    h = app()
    await h.schedule("daily", "0 9 * * 1-5", "report", "all", timezone="Europe/Paris")
    paused = await h.pause_schedule("daily")
    assert paused.paused
    assert await h.store.claim_due_schedules(time.time() + 10 * 86400) == []
    task_id = await h.run_schedule_now("daily")  # run now works while paused, once
    assert task_id.startswith("daily-now-") and await started(h) == [task_id]
    resumed = await h.pause_schedule("daily", paused=False)
    assert not resumed.paused and resumed.next_at is not None and resumed.next_at > time.time()
    await h.delete_schedule("daily")
    with pytest.raises(tt.ScheduleNotFound, match="daily"):
        await h.schedule_named("daily")
    with pytest.raises(tt.ScheduleNotFound):
        await h.delete_schedule("daily")
    assert await started(h) == [task_id]  # its tasks stay
    await h.close()


async def test_a_schedule_is_refused_by_name_when_it_cannot_run() -> None:
    h = app()
    with pytest.raises(tt.UnknownAgent, match="nobody"):
        await h.schedule("x", "* * * * *", "nobody")
    with pytest.raises(tt.InvalidInput, match="not a cron expression"):
        await h.schedule("x", "every day at nine", "report")
    with pytest.raises(tt.InvalidInput, match="unknown time zone"):
        await h.schedule("x", "* * * * *", "report", timezone="Nowhere/Land")
    assert await h.store.list_schedules() == []
    await h.close()


async def test_a_schedule_this_worker_cannot_start_is_logged_once_and_left_due(
        caplog: pytest.LogCaptureFixture) -> None:
    """A worker whose app lacks the schedule's agent leaves the run to one that has it,
    and says so once, not every second."""
    h = app()
    record = await h.schedule("other-app", "* * * * *", "report")
    await h.store.put_schedule(dataclasses.replace(record, agent="elsewhere",
                                                   next_at=time.time() - 120))
    warned: set[str] = set()
    for _ in range(3):  # a worker told nothing of its agents tries, and says so once
        assert await fire_due(h.store, h.start_run, h.log, None, warned) == 0
    messages = [r.getMessage() for r in caplog.records if "other-app" in r.getMessage()]
    assert len(messages) == 1 and "left to a worker whose app can" in messages[0]
    assert (await h.schedule_named("other-app")).next_at < time.time()  # type: ignore[operator]
    await h.close()


async def test_r13_schedules_of_an_agent_this_app_lacks_never_fill_the_window() -> None:
    """250 due schedules of an agent this worker's app does not have (more than one window
    of due schedules) and one of its own: a worker asking for its own agents' schedules
    starts its own at once; the others stay due for a worker that has their agent."""
    h = app()
    # yearly, the last run missed and caught up (one run each, whenever the test runs)
    own = await h.schedule("own", "0 0 1 1 *", "report", "mine", catch_up=1)
    year_ago = time.time() - 366 * 86400
    await h.store.put_schedule(dataclasses.replace(own, next_at=year_ago))
    for n in range(250):
        await h.store.put_schedule(dataclasses.replace(
            own, name=f"foreign-{n:03d}", agent="elsewhere", next_at=year_ago))
    assert await fire_due(h.store, h.start_run, h.log, h.agents) == 1
    runs = await started(h)
    assert len(runs) == 1 and runs[0].startswith("own-")
    foreign = [s for s in await h.store.list_schedules() if s.agent == "elsewhere"]
    assert len(foreign) == 250 and all(s.next_at < time.time() for s in foreign)  # type: ignore[operator]
    await h.close()


async def test_r13_a_thousand_schedules_due_in_one_minute_start_in_one_look() -> None:
    """1,000 schedules due at once: one look starts every run (batch after batch), each
    once, and moves every schedule on."""
    h = app()
    # yearly, the last run missed and caught up: one run each, and no new one can fall due
    # while the test runs (an every-minute schedule could, at a minute's turn)
    first = await h.schedule("s-0000", "0 0 1 1 *", "report", catch_up=1)
    year_ago = time.time() - 366 * 86400
    for n in range(1000):
        await h.store.put_schedule(dataclasses.replace(first, name=f"s-{n:04d}",
                                                       next_at=year_ago))
    assert await fire_due(h.store, h.start_run, h.log, h.agents) == 1000
    assert len(await started(h)) == 1000
    assert all(s.next_at > time.time() for s in await h.store.list_schedules())  # type: ignore[operator]
    assert await fire_due(h.store, h.start_run, h.log, h.agents) == 0
    await h.close()


async def test_r13_schedules_that_can_never_start_do_not_block_the_others(
        caplog: pytest.LogCaptureFixture) -> None:
    """A schedule whose runs the store refuses (its input is over the size limit, here) is
    moved on with an error naming it, not left due: 250 of them, older than a healthy one,
    no longer fill every look's window. A schedule without the input its agent requires is
    refused when it is made."""
    h = tt.Harness("memory://", settings=fast_settings(max_payload_bytes=2_000))

    @h.agent("report")
    class Report(tt.Agent):
        input_required = True

        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Finish({"scope": t.input})

    with pytest.raises(tt.InvalidInput, match="needs an input"):
        await h.schedule("no-input", "0 0 1 1 *", "report")
    healthy = await h.schedule("healthy", "0 0 1 1 *", "report", "eu", catch_up=1)
    year_ago = time.time() - 366 * 86400
    await h.store.put_schedule(dataclasses.replace(healthy, next_at=year_ago))
    for n in range(250):
        await h.store.put_schedule(dataclasses.replace(
            healthy, name=f"huge-{n:03d}", input="x" * 5_000, next_at=year_ago - 60))
    assert await fire_due(h.store, h.start_run, h.log, h.agents) == 1
    runs = await started(h)
    assert len(runs) == 1 and runs[0].startswith("healthy-")
    assert all(s.next_at > time.time() for s in await h.store.list_schedules())  # type: ignore[operator]
    assert any("huge-000: its run could not be started" in r.getMessage()
               for r in caplog.records)
    await h.close()

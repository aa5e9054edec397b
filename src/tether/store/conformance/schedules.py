"""Conformance: cron schedules in the store (issue 19): definitions, what is due, and the one
worker that moves a schedule on."""

from __future__ import annotations

import asyncio

from tether.store.base import ScheduleRecord, Store


def nightly(name: str = "nightly", next_at: float | None = 1000.0, **changes: object
            ) -> ScheduleRecord:
    fields: dict[str, object] = {"name": name, "cron": "0 2 * * *", "timezone": "Europe/Paris",
                                 "agent": "report", "input": {"scope": ["eu", "us"]},
                                 "catch_up": 2, "next_at": next_at, "created_at": 900.0}
    fields.update(changes)
    return ScheduleRecord(**fields)  # type: ignore[arg-type]


class ScheduleConformance:
    """Schedules. Needs a ``store`` fixture."""

    async def test_a_schedule_is_stored_whole_and_replaced_by_name(self, store: Store) -> None:
        await store.put_schedule(nightly())
        assert await store.list_schedules() == [nightly()]
        assert await store.list_schedules("nightly") == [nightly()]
        assert await store.list_schedules("other") == []
        await store.put_schedule(nightly(cron="30 3 * * *", paused=True))
        assert [(s.cron, s.paused) for s in await store.list_schedules()] == [("30 3 * * *", True)]

    async def test_only_schedules_not_paused_and_due_are_taken(self, store: Store) -> None:
        await store.put_schedule(nightly("late", next_at=1000.0))
        await store.put_schedule(nightly("later", next_at=1500.0))
        await store.put_schedule(nightly("paused", next_at=900.0, paused=True))
        await store.put_schedule(nightly("future", next_at=5000.0))
        assert [s.name for s in await store.claim_due_schedules(2000.0, limit=1)] == ["late"]
        assert [s.name for s in await store.claim_due_schedules(2000.0)] == ["later"]
        assert await store.claim_due_schedules(2000.0) == []

    async def test_due_schedules_of_named_agents_only(self, store: Store) -> None:
        """Issue 29: a worker takes the schedules its app can start; another agent's due
        schedules, however many, are not in its window."""
        for n in range(5):
            await store.put_schedule(nightly(f"theirs-{n}", next_at=900.0, agent="billing"))
        await store.put_schedule(nightly("mine", next_at=1000.0))
        await store.put_schedule(nightly("also", next_at=1100.0, agent="audit"))
        assert [s.name for s in await store.claim_due_schedules(2000.0, 2, ["report"])] \
            == ["mine"]
        assert await store.claim_due_schedules(2000.0, 10, []) == []
        assert [s.name for s in await store.claim_due_schedules(2000.0, 10, ["report", "audit"])
                ] == ["also"]
        assert len(await store.claim_due_schedules(2000.0, 10)) == 5

    async def test_a_taken_schedule_is_held_until_moved_on_or_its_hold_ends(
            self, store: Store) -> None:
        """Issue 29: a worker holds what it took, so no other worker starts it meanwhile;
        moving it on lets it go at once, a dead worker's hold ends by itself, and a schedule
        replaced by a person is free again."""
        await store.put_schedule(nightly("a", next_at=1000.0))
        await store.put_schedule(nightly("b", next_at=1000.0))
        assert len(await store.claim_due_schedules(2000.0, hold=30.0)) == 2
        assert await store.claim_due_schedules(2029.0) == []
        assert await store.advance_schedule("a", 1000.0, 1500.0, 2000.0)
        assert [s.name for s in await store.claim_due_schedules(2001.0)] == ["a"]
        assert [s.name for s in await store.claim_due_schedules(2030.0)] == ["b"]  # hold over
        await store.put_schedule(nightly("b", next_at=1000.0, cron="5 2 * * *"))
        assert [s.name for s in await store.claim_due_schedules(2030.5)] == ["b"]

    async def test_workers_side_by_side_take_different_schedules(self, store: Store) -> None:
        """Issue 29: five workers taking at the same moment share 60 due schedules out,
        none taken twice and none left behind."""
        for n in range(60):
            await store.put_schedule(nightly(f"s{n:02d}", next_at=1000.0 + n))
        names: list[str] = []
        for _ in range(10):  # rounds of five at once, until the due are all taken
            taken = await asyncio.gather(*(store.claim_due_schedules(2000.0, 15)
                                           for _ in range(5)))
            assert all(len(batch) <= 15 for batch in taken)
            names += [s.name for batch in taken for s in batch]
            if not any(taken):
                break
        assert sorted(names) == [f"s{n:02d}" for n in range(60)]  # each once

    async def test_the_stores_clock_is_the_time_now(self, store: Store) -> None:
        """The clock schedules are judged by: the server's or this machine's, near enough to
        this process's on a test machine (the same host)."""
        import time

        assert abs(await store.clock() - time.time()) < 5

    async def test_one_worker_moves_a_schedule_on(self, store: Store) -> None:
        """Issue 19: workers that find the same run due race to move the schedule; one wins,
        so a run is counted once, and a paused schedule is not moved."""
        await store.put_schedule(nightly(next_at=1000.0))
        moved = await asyncio.gather(*(store.advance_schedule("nightly", 1000.0, 87400.0, 1001.0)
                                       for _ in range(5)))
        assert sorted(moved) == [False, False, False, False, True]
        got = (await store.list_schedules("nightly"))[0]
        assert (got.next_at, got.last_run_at) == (87400.0, 1001.0)
        await store.put_schedule(nightly(next_at=2000.0, paused=True))
        assert not await store.advance_schedule("nightly", 2000.0, 3000.0, 2001.0)

    async def test_a_deleted_schedule_is_gone(self, store: Store) -> None:
        await store.put_schedule(nightly())
        assert await store.delete_schedule("nightly")
        assert not await store.delete_schedule("nightly")
        assert await store.list_schedules() == []

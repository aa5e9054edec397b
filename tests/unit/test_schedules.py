"""Issue 19: the cron arithmetic of schedules: which runs are due, missed runs and catch-up,
time zones and daylight saving time, run ids, and definitions refused by name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from tether import schedules
from tether.errors import InvalidInput


def at(*parts: int, zone: str = "UTC") -> float:
    return datetime(*parts, tzinfo=ZoneInfo(zone)).timestamp()  # type: ignore[misc]


def test_a_run_on_time_starts_and_the_next_is_after_now() -> None:
    runs, following = schedules.runs_due("*/5 * * * *", "UTC", at(2026, 12, 1, 10, 0),
                                         0, at(2026, 12, 1, 10, 0, 20))
    assert runs == [at(2026, 12, 1, 10, 0)]
    assert following == at(2026, 12, 1, 10, 5)


def test_missed_runs_are_skipped_or_the_latest_few_caught_up() -> None:
    first = at(2026, 12, 1, 9, 0)
    now = at(2026, 12, 1, 10, 0, 20)
    skipped, _ = schedules.runs_due("*/5 * * * *", "UTC", first, 0, now)
    assert skipped == [at(2026, 12, 1, 10, 0)]  # only the one on time
    caught, following = schedules.runs_due("*/5 * * * *", "UTC", first, 2, now)
    assert caught == [at(2026, 12, 1, 9, 50), at(2026, 12, 1, 9, 55), at(2026, 12, 1, 10, 0)]
    assert following == at(2026, 12, 1, 10, 5)
    few, _ = schedules.runs_due("*/5 * * * *", "UTC", at(2026, 12, 1, 9, 55), 50, now)
    assert few == [at(2026, 12, 1, 9, 55), at(2026, 12, 1, 10, 0)]  # never before next_at


def test_a_year_missed_is_bounded_by_catch_up() -> None:
    runs, _ = schedules.runs_due("* * * * *", "UTC", at(2025, 12, 1, 0, 0), 3,
                                 at(2026, 12, 1, 10, 0, 30))
    assert len(runs) == 4  # three caught up, one on time


def test_runs_follow_the_schedule_s_time_zone_across_daylight_saving_time() -> None:
    paris = "Europe/Paris"
    before = at(2026, 3, 27, 12, 0, zone=paris)
    first = schedules.next_after("0 9 * * *", paris, before)
    second = schedules.next_after("0 9 * * *", paris, first)
    assert datetime.fromtimestamp(first, ZoneInfo(paris)).hour == 9
    assert datetime.fromtimestamp(second, ZoneInfo(paris)).hour == 9
    assert second - first == 23 * 3600  # the night the clocks go forward is an hour short


def fired(cron: str, zone: str, start: float, end: float) -> list[datetime]:
    """Every run a scheduler looking each second between *start* and *end* starts, as wall
    times in *zone*: the simulated clock of a worker that never stops."""
    next_at = schedules.next_after(cron, zone, start)
    started: list[datetime] = []
    while next_at <= end:
        runs, next_at = schedules.runs_due(cron, zone, next_at, 0, next_at + 1)
        started += [datetime.fromtimestamp(r, ZoneInfo(zone)) for r in runs]
    return started


def test_r13_when_the_clocks_go_back_a_fixed_hour_runs_once_and_a_frequent_one_keeps_time(
        ) -> None:
    """2026-10-25 in Paris: 02:30 happens twice (CEST, then CET). ``30 2 * * *`` runs once,
    at the first; ``*/30 * * * *`` runs through the repeated hour in real time, as cron."""
    paris = "Europe/Paris"
    start, end = at(2026, 10, 24, 12, 0, zone=paris), at(2026, 10, 26, 12, 0, zone=paris)
    daily = fired("30 2 * * *", paris, start, end)
    assert [(d.day, d.hour, d.minute, d.utcoffset()) for d in daily] == [
        (25, 2, 30, timedelta(hours=2)), (26, 2, 30, timedelta(hours=1))]
    night = [d for d in fired("*/30 * * * *", paris, at(2026, 10, 25, 1, 0, zone=paris),
                              at(2026, 10, 25, 4, 0, zone=paris))]
    assert len(night) == 8  # 01:30, 02:00, 02:30, 02:00', 02:30', 03:00, 03:30, 04:00
    assert len({r.timestamp() for r in night}) == 8
    assert len(fired("@daily", paris, start, end)) == 2


def test_r13_when_the_clocks_go_forward_a_run_in_the_missing_hour_starts_once_after_it(
        ) -> None:
    """2026-03-29 in Paris: 02:30 does not exist; the run starts at 03:00, once."""
    paris = "Europe/Paris"
    runs = fired("30 2 * * *", paris, at(2026, 3, 28, 12, 0, zone=paris),
                 at(2026, 3, 30, 12, 0, zone=paris))
    assert [(d.day, d.hour, d.minute) for d in runs] == [(29, 3, 0), (30, 2, 30)]


def test_r13_six_fields_have_the_seconds_first_as_in_quartz_spring_and_temporal() -> None:
    """``30 0 9 * * *`` is 09:00:30 every day (croniter itself reads a sixth field as
    seconds, last: tether turns it round, so an expression means what it means elsewhere)."""
    first = schedules.next_after("30 0 9 * * *", "UTC", at(2026, 12, 1, 8, 0))
    assert first == at(2026, 12, 1, 9, 0, 30)
    assert schedules.next_after("30 0 9 * * *", "UTC", first) == at(2026, 12, 2, 9, 0, 30)
    schedules.check("six", "*/10 * * * * *", "UTC", 0)


def test_run_ids_name_the_schedule_and_the_time_and_are_valid_task_ids() -> None:
    from tether.model import TASK_ID

    moment = datetime(2026, 12, 1, 2, 0, tzinfo=UTC).timestamp()
    assert schedules.run_id("nightly", moment) == "nightly-20261201T020000Z"
    assert TASK_ID.fullmatch(schedules.run_id("nightly.eu", moment, now=True))


@pytest.mark.parametrize(("name", "cron", "zone", "catch_up", "says"), [
    ("bad name", "* * * * *", "UTC", 0, "letters, digits"),
    ("-dash", "* * * * *", "UTC", 0, "letters, digits"),
    ("ok", "61 * * * *", "UTC", 0, "not a cron expression"),
    ("ok", "every day", "UTC", 0, "not a cron expression"),
    ("ok", "* * * * *", "Mars/Olympus", 0, "unknown time zone"),
    ("ok", "* * * * *", "../../etc/passwd", 0, "unknown time zone"),
    ("ok", "* * * * *", "UTC", -1, "catch_up"),
    ("ok", "* * * * *", "UTC", 101, "catch_up"),
    ("ok", "0 0 30 2 *", "UTC", 0, "never fires"),
    ("ok", "* * * * * 30", "UTC", 0, "not a cron expression"),
    ("ok", "0 0 9 * * * *", "UTC", 0, "not a cron expression"),
])
def test_definitions_that_cannot_run_are_refused_by_name(name: str, cron: str, zone: str,
                                                         catch_up: int, says: str) -> None:
    with pytest.raises(InvalidInput, match=says):
        schedules.check(name, cron, zone, catch_up)

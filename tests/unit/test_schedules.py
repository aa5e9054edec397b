"""Issue 19: the cron arithmetic of schedules: which runs are due, missed runs and catch-up,
time zones and daylight saving time, run ids, and definitions refused by name."""

from __future__ import annotations

from datetime import UTC, datetime
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
])
def test_definitions_that_cannot_run_are_refused_by_name(name: str, cron: str, zone: str,
                                                         catch_up: int, says: str) -> None:
    with pytest.raises(InvalidInput, match=says):
        schedules.check(name, cron, zone, catch_up)

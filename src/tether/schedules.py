"""Cron schedules that start tasks: checking a definition, and the cron arithmetic (with
croniter, in the schedule's own time zone, daylight saving time included).

When runs are due: a run whose time came less than :data:`GRACE` ago is on time and starts;
older ones were missed (no worker ran then), and only the most recent *catch_up* of those
start, late (0, the default, skips them all). Either way the next run is the first one after
now. Each run's task id is made from the schedule and its time, so two workers that find
the same run due start it once.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from tether.errors import InvalidInput, MissingExtra

GRACE = 60.0
"""Seconds late a run may start and still count as on time."""
MAX_CATCH_UP = 100
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")


def _croniter() -> Any:
    """croniter, imported when a schedule is used (a worker without schedules needs none)."""
    try:
        from croniter import croniter  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise MissingExtra("schedules need croniter", "schedules") from exc
    return croniter


def check_name(name: object) -> str:
    """*name* if it can name a schedule; InvalidInput naming the alphabet otherwise (a NUL or
    a line break never reaches the store or a terminal)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidInput(f"schedule name {str(name)[:90]!r}: use 1-80 letters, digits and"
                           " . _ - (starting with a letter or digit)")
    return name


def check(name: str, cron: str, timezone: str, catch_up: int) -> None:
    """Refuse, naming the problem, a definition that cannot be run."""
    check_name(name)
    if not isinstance(cron, str) or not _croniter().is_valid(cron):
        raise InvalidInput(f"schedule {name}: {str(cron)[:100]!r} is not a cron expression"
                           " (five fields: minute hour day month weekday, e.g. '0 9 * * 1-5')")
    zone(timezone)
    if not isinstance(catch_up, int) or not 0 <= catch_up <= MAX_CATCH_UP:
        raise InvalidInput(f"schedule {name}: catch_up is how many missed runs to start late,"
                           f" 0 to {MAX_CATCH_UP}")


def zone(timezone: str) -> ZoneInfo:
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
        raise InvalidInput(f"unknown time zone {str(timezone)[:60]!r} (an IANA name such as"
                           " 'Europe/Paris' or 'UTC')") from None


def next_after(cron: str, timezone: str, after: float) -> float:
    """The first run time strictly after *after*."""
    start = datetime.fromtimestamp(after, zone(timezone))
    return float(_croniter()(cron, start).get_next(float))


def runs_due(cron: str, timezone: str, next_at: float, catch_up: int, now: float
             ) -> tuple[list[float], float]:
    """The run times to start now, oldest first (on time ones, and the most recent
    *catch_up* missed ones), and the next run time after now."""
    found: list[float] = []
    missed = 0
    back = _croniter()(cron, datetime.fromtimestamp(now + 1, zone(timezone)))
    at = back.get_prev(float)
    while at > now:  # a run in the second after now is not due yet
        at = back.get_prev(float)
    while at >= next_at:
        late = now - at > GRACE
        if late and missed >= catch_up:
            break
        missed += late
        found.append(at)
        at = back.get_prev(float)
    return sorted(found), next_after(cron, timezone, now)


def run_id(name: str, at: float, now: bool = False) -> str:
    """The id of a run's task: the schedule and the run's time (UTC), so it is made once."""
    stamp = datetime.fromtimestamp(at, UTC)
    if now:
        return f"{name}-now-{stamp:%Y%m%dT%H%M%S%f}Z"
    return f"{name}-{stamp:%Y%m%dT%H%M%S}Z"

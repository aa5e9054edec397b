"""Cron schedules that start tasks: checking a definition, and the cron arithmetic (with
croniter, in the schedule's own time zone, daylight saving time included).

Daylight saving time, as cron does it: when the clocks go back, a schedule at fixed hours
(``30 2 * * *``) runs once, at the first of the two 02:30s; one that runs every hour or more
often (``*/30 * * * *``) keeps running in real time through the repeated hour. When the
clocks go forward, a run in the hour that does not exist starts when the hour ends (03:00).

When runs are due: a run whose time came less than :data:`GRACE` ago is on time and starts;
older ones were missed (no worker ran then), and only the most recent *catch_up* of those
start, late (0, the default, skips them all). Either way the next run is the first one after
now. Each run's task id is made from the schedule and its time, so two workers that find
the same run due start it once.
"""

from __future__ import annotations

import re
import time
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


FIELDS = ("five fields, minute hour day month weekday (e.g. '0 9 * * 1-5'), or six with seconds"
          " first (e.g. '30 0 9 * * 1-5')")
MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
          "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
          "@hourly": "0 * * * *"}


def check(name: str, cron: str, timezone: str, catch_up: int, now: float | None = None) -> None:
    """Refuse, naming the problem, a definition that cannot be run: not cron, or one that
    never fires (``0 0 30 2 *``)."""
    check_name(name)
    fields = len(cron.split()) if isinstance(cron, str) else 0
    if (fields not in (5, 6) and not (isinstance(cron, str) and cron.strip() in MACROS)) \
            or not _croniter().is_valid(_as_croniter(cron)):
        raise InvalidInput(f"schedule {name}: {str(cron)[:100]!r} is not a cron expression"
                           f" ({FIELDS})")
    zone(timezone)
    try:
        next_after(cron, timezone, time.time() if now is None else now)
    except Exception:  # croniter's "failed to find next date", or a date out of range
        raise InvalidInput(f"schedule {name}: {cron[:100]!r} never fires (no date matches it,"
                           " such as the 30th of February)") from None
    if not isinstance(catch_up, int) or not 0 <= catch_up <= MAX_CATCH_UP:
        raise InvalidInput(f"schedule {name}: catch_up is how many missed runs to start late,"
                           f" 0 to {MAX_CATCH_UP}")


def _as_croniter(cron: str) -> str:
    """*cron* as croniter reads it: a six-field expression has its seconds first, as in
    Quartz, Spring and Temporal; croniter wants them last."""
    fields = MACROS.get(cron.strip(), cron).split()
    return " ".join([*fields[1:], fields[0]]) if len(fields) == 6 else " ".join(fields)


def zone(timezone: str) -> ZoneInfo:
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
        raise InvalidInput(f"unknown time zone {str(timezone)[:60]!r} (an IANA name such as"
                           " 'Europe/Paris' or 'UTC')") from None


def next_after(cron: str, timezone: str, after: float) -> float:
    """The first run time strictly after *after* (a repeated wall time skipped, see the
    module docstring)."""
    place = zone(timezone)
    times = _croniter()(_as_croniter(cron), datetime.fromtimestamp(after, place))
    at = float(times.get_next(float))
    while _repeated(cron, place, at):
        at = float(times.get_next(float))
    return at


def _repeated(cron: str, place: ZoneInfo, at: float) -> bool:
    """Whether *at* is the second occurrence of a wall time (the hour repeated when clocks go
    back) of a schedule at fixed hours, which runs at the first occurrence only."""
    fields = _as_croniter(cron).split()
    hours = fields[1]
    return not hours.startswith("*") and datetime.fromtimestamp(at, place).fold == 1


def runs_due(cron: str, timezone: str, next_at: float, catch_up: int, now: float
             ) -> tuple[list[float], float]:
    """The run times to start now, oldest first (on time ones, and the most recent
    *catch_up* missed ones), and the next run time after now."""
    found: list[float] = []
    missed = 0
    place = zone(timezone)
    back = _croniter()(_as_croniter(cron), datetime.fromtimestamp(now + 1, place))
    at = back.get_prev(float)
    while at > now:  # a run in the second after now is not due yet
        at = back.get_prev(float)
    while at >= next_at:
        if _repeated(cron, place, at):
            at = back.get_prev(float)
            continue
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

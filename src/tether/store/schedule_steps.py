"""Cron schedules in the store: their definitions, which are due, and moving one on once a
worker started its runs. Written once as steps for every SQL backend; the cron arithmetic
is :mod:`tether.schedules`'."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import orjson

from tether.store import queries as q
from tether.store.base import ScheduleRecord
from tether.store.steps import Steps, change, every, one


def put(schedule: ScheduleRecord) -> Steps[None]:
    yield change(q.PUT_SCHEDULE, schedule.name, schedule.cron, schedule.timezone, schedule.agent,
                 orjson.dumps(schedule.input), schedule.catch_up, int(schedule.paused),
                 schedule.next_at, schedule.last_run_at, schedule.created_at)


def listed(name: str | None) -> Steps[list[ScheduleRecord]]:
    found = yield (every(q.GET_SCHEDULE, name) if name is not None else every(q.LIST_SCHEDULES))
    return [_record(row) for row in found]


def _named(agents: Collection[str] | None) -> tuple[int | None, list[str]]:
    """How many agents a look is limited to (None: all) and their names, in a stable order
    (one cached statement per count)."""
    return (None, []) if agents is None else (len(agents), sorted(agents))


def any_due(now: float, agents: Collection[str] | None) -> Steps[bool]:
    if agents is not None and not agents:
        return False
    count, named = _named(agents)
    found = yield one(q.any_due_schedule(count), now, *named, now)
    return found is not None


def claim(now: float, limit: int, agents: Collection[str] | None, hold: float,
          skip_locked: str) -> Steps[list[ScheduleRecord]]:
    if agents is not None and not agents:
        return []
    count, named = _named(agents)
    found = yield every(q.claim_schedules(count, skip_locked), now + hold, now, *named, now,
                        limit)
    return sorted((_record(row) for row in found), key=lambda s: (s.next_at or 0.0, s.name))


def advance(name: str, expected: float, next_at: float | None, ran_at: float) -> Steps[bool]:
    moved = yield change(q.ADVANCE_SCHEDULE, next_at, ran_at, name, expected)
    return bool(moved)


def delete(name: str) -> Steps[bool]:
    gone = yield change(q.DELETE_SCHEDULE, name)
    return bool(gone)


def _record(row: Any) -> ScheduleRecord:
    return ScheduleRecord(
        str(row["name"]), str(row["cron"]), str(row["timezone"]), str(row["agent"]),
        orjson.loads(bytes(row["input"])), int(row["catch_up"]), bool(row["paused"]),
        None if row["next_at"] is None else float(row["next_at"]),
        None if row["last_run_at"] is None else float(row["last_run_at"]),
        float(row["created_at"]))

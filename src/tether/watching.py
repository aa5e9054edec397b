"""Following a task as it runs: its committed changes, in order, as a stream.

The server's ``GET /api/tasks/{id}/stream`` (server-sent events), the console's live task
page and ``tether watch`` all read this one stream. It looks at the task's index row every
*poll* seconds (one cheap read) and loads the snapshot, the dialog and the recovery log only
when the row says something changed, so a hundred people watching cost the store little.
Only what is committed is sent: a reader never sees a step a crash will take back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Literal

from tether.errors import InvalidInput
from tether.harness import Harness, TaskInfo
from tether.model import TaskRecord, to_plain

ChangeKind = Literal["state", "row", "recovery", "reset", "end", "quiet"]


@dataclass(frozen=True)
class Change:
    """One thing that happened to the task: its state (status, version, step, lease), a new
    dialog row, a new recovery record, a reset (the dialog took another branch: a rollback)
    or the end of the stream (the task finished). ``quiet`` says only that the stream is
    alive though nothing happened for a while (proxies close connections that stay silent)."""

    kind: ChangeKind
    data: dict[str, Any]
    position: Position


@dataclass(frozen=True)
class Position:
    """How much of the task a reader has: dialog rows and recovery records, and on which
    branch of the dialog (each rollback starts one). Sent as each event's id, so a reader
    that reconnects (``Last-Event-ID``) goes on where it stopped, or is told to start
    again (``reset``) if the task was rolled back meanwhile."""

    rows: int = 0
    recoveries: int = 0
    branch: int | None = None
    """How many branches the dialog had (None: not known, a reader from the start)."""

    def __str__(self) -> str:
        tail = "" if self.branch is None else f".{self.branch}"
        return f"{self.rows}.{self.recoveries}{tail}"

    @classmethod
    def parse(cls, text: str | None) -> Position:
        """A position sent back by a reader; anything but two or three counts is refused."""
        if not text:
            return cls()
        match = _POSITION.fullmatch(text.strip())
        if match is None:
            raise InvalidInput("a stream position is two or three counts like '12.3.1', not"
                               f" {text[:40]!r}")
        return cls(int(match[1]), int(match[2]), int(match[3]) if match[3] else None)


_POSITION = re.compile(r"(\d{1,9})\.(\d{1,9})(?:\.(\d{1,9}))?")
POSITION_CHARS = 29
"""The longest position: three counts of nine digits and their two dots."""
KINDS: frozenset[str] = frozenset(ChangeKind.__args__)  # type: ignore[attr-defined]
"""Every kind of change a stream sends."""


@dataclass
class _Seen:
    """What the stream has sent so far."""

    position: Position
    record: TaskRecord | None = None
    info: TaskInfo | None = None
    state: dict[str, Any] = field(default_factory=dict)


async def follow(harness: Harness, task_id: str, *, after: Position | None = None,
                 poll: float = 0.5, quiet: float = 15.0, until_finished: bool = True,
                 stop: asyncio.Event | None = None) -> AsyncGenerator[Change]:
    """The task's changes from *after* on: first its state, then whatever follows.

    With *until_finished* the stream ends (an ``end`` change) once the task is completed,
    failed or cancelled; without, it goes on (a console page stays open while a person
    resumes or rolls back a finished task). It also ends, with no ``end``, once *stop* is
    set (a server shutting down). TaskNotFound at once for an unknown task."""
    seen = _Seen(after or Position())
    loop = asyncio.get_running_loop()
    last_sent = loop.time()
    while True:
        record = await harness.reads.task(task_id)
        if seen.record is None or _moved(seen.record, record):
            for change in await _changes(harness, record, seen):
                last_sent = loop.time()
                yield change
        seen.record = record
        if loop.time() - last_sent >= quiet:
            last_sent = loop.time()
            yield Change("quiet", {}, seen.position)
        if until_finished and record.status.is_terminal:
            yield Change("end", {"status": record.status.value, "reason": record.reason},
                         seen.position)
            return
        if await _stopped(stop, poll):
            return


async def _stopped(stop: asyncio.Event | None, poll: float) -> bool:
    """Wait *poll* seconds, or less if *stop* is set meanwhile; whether it is."""
    if stop is None:
        await asyncio.sleep(poll)
        return False
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(poll):
            await stop.wait()
    return stop.is_set()


def _moved(before: TaskRecord, now: TaskRecord) -> bool:
    return (before.head_version, before.status, before.reason, before.lease_owner,
            before.lease_until, before.updated_at) != (
        now.head_version, now.status, now.reason, now.lease_owner, now.lease_until,
        now.updated_at)


async def _changes(harness: Harness, record: TaskRecord, seen: _Seen) -> list[Change]:
    """What changed since *seen*. Rows and recovery records come only with a new version,
    so a lease renewal or a status written alone costs no read of the dialog."""
    kept = seen.info
    new_version = kept is None or record.head_version != kept.record.head_version
    info = await harness.get(record.task_id) if kept is None or new_version else \
        dataclasses.replace(kept, record=record)
    seen.info = info
    changes: list[Change] = []
    state = state_of(info)
    if state != seen.state:
        seen.state = state
        changes.append(Change("state", state, seen.position))
    if new_version:
        changes += await _new_rows(harness, info, seen)
    return changes


async def _new_rows(harness: Harness, info: TaskInfo, seen: _Seen) -> list[Change]:
    """The dialog rows and recovery records past the reader's position (a reset first, if
    the dialog took another branch)."""
    changes: list[Change] = []
    task_id = info.record.task_id
    rows = await harness.reads.history(task_id, info.snapshot.history_segments)
    rows = rows[: info.snapshot.history_len]
    branch = len(info.snapshot.history_segments)
    known = seen.position.branch
    if (known is not None and known != branch) or len(rows) < seen.position.rows:
        seen.position = Position(0, seen.position.recoveries, branch)
        changes.append(Change("reset", {"version": info.version}, seen.position))
    seen.position = Position(seen.position.rows, seen.position.recoveries, branch)
    for n, row in enumerate(rows[seen.position.rows:], start=seen.position.rows + 1):
        seen.position = Position(n, seen.position.recoveries, branch)
        changes.append(Change("row", {"n": n, "row": to_plain(row)}, seen.position))
    records = await harness.reads.recovery_log(task_id)
    for n, entry in enumerate(records[seen.position.recoveries:],
                              start=seen.position.recoveries + 1):
        seen.position = Position(seen.position.rows, n, branch)
        changes.append(Change("recovery", {"n": n, "record": to_plain(entry)}, seen.position))
    return changes


def state_of(info: TaskInfo) -> dict[str, Any]:
    """What a watcher shows at the top: status, reason, version, step, lease, usage."""
    record = info.record
    return {"task_id": record.task_id, "agent": record.agent, "status": record.status.value,
            "reason": record.reason, "version": info.version, "step": info.snapshot.step,
            "lease_owner": record.lease_owner, "lease_until": record.lease_until,
            "wake_at": record.wake_at, "updated_at": record.updated_at,
            "usage": dict(info.snapshot.usage)}


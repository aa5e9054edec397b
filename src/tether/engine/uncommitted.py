"""What a runner changed since its last commit, written by the next one (R8, R10).

A step buffers what it adds beside the snapshot head (dialog rows, events consumed, call
records, recovery records) and writes it all with the head in one checkpoint. A call's
resume point is written only if nothing arrived unread in the inbox meanwhile; when that
refuses it, what opening the call changed is taken back (:class:`CallStart`), as if the
call had never been opened: nothing of it was written, and the runner reads the inbox first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tether.engine.dialog_rows import DialogRows
from tether.model import (
    CallState,
    CallStatus,
    EventStatus,
    IdempotencyRecord,
    Snapshot,
    Status,
)
from tether.store.base import Checkpoint, HistoryRow


@dataclass
class Uncommitted:
    """The rows the next checkpoint writes beside the head, and what it should say."""

    rows: list[HistoryRow] = field(default_factory=list)
    events_done: list[tuple[int, EventStatus]] = field(default_factory=list)
    idempotency: list[IdempotencyRecord] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    """Steps carried out since the last commit (a checkpoint every N of them)."""
    progress: bool = False
    """The next commit moves the task forward (the store's crash counter starts again)."""

    def __bool__(self) -> bool:
        return bool(self.rows or self.events_done or self.idempotency or self.log or self.steps)

    def checkpoint(self, head: bytes, large: dict[str, bytes], status: Status,
                   wake_at: float | None, reason: str | None,
                   inbox_seen: frozenset[int] | None) -> Checkpoint:
        return Checkpoint(head=head, blobs=large, status=status, history=self.rows,
                          events_done=self.events_done, idempotency=self.idempotency,
                          recovery_log=self.log, wake_at=wake_at, reason=reason,
                          progress=self.progress, inbox_seen=inbox_seen)


@dataclass(frozen=True)
class CallStart:
    """What opening and starting a call changes, as it was before: taken back when its
    resume point was not written."""

    call: CallState | None
    fields: tuple[int, CallStatus, float | None] | None
    """The call's attempt, status and retry time, for a call opened earlier."""
    rows: int
    records: int
    log: int
    history: int
    history_len: int

    @classmethod
    def before(cls, snap: Snapshot, pending: Uncommitted, history: DialogRows) -> CallStart:
        call = snap.call
        return cls(call, None if call is None else (call.attempt, call.status, call.retry_at),
                   len(pending.rows), len(pending.idempotency), len(pending.log), len(history),
                   snap.history_len)

    def undo(self, snap: Snapshot, pending: Uncommitted, history: DialogRows) -> None:
        snap.call = self.call
        if self.call is not None and self.fields is not None:
            self.call.attempt, self.call.status, self.call.retry_at = self.fields
        del pending.rows[self.rows:], pending.idempotency[self.records:], pending.log[self.log:]
        history.truncate(self.history)
        snap.history_len = self.history_len

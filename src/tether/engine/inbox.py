"""The event inbox, sending side: validate, classify and durably store events (R3, R4, R19).

Sending an event only stores it; nothing about the task changes until its runner reads
the inbox at the next tick and :mod:`tether.engine.events` applies it. That split is what
keeps handlers from racing the loop (R5). The interruption protocol decides priority and
coalescing; the store enforces dedup (a unique ``source_event_id`` per task) and capacity.
"""

from __future__ import annotations

import time
from collections import Counter

from tether.errors import InboxFull, InvalidInput
from tether.model import EmitReceipt, Event, Priority, Status, check_task_id, to_plain
from tether.protocol import CONTROL_EVENTS, InterruptionProtocol
from tether.settings import Settings
from tether.store import InboxLimits, WorkerStore

MAX_NAME = 200
"""Longest event type or ``source_event_id`` accepted (they are stored and indexed). Both
must be printable (``str.isprintable``): PostgreSQL refuses a NUL in text, and a line break
or an escape sequence would reach logs and terminals."""

REOPENS = {
    "resume": frozenset({Status.FAILED}),
    "decide": frozenset({Status.FAILED}),
    "rollback": frozenset({Status.FAILED, Status.COMPLETED}),
}
"""Finished tasks that a person's lever may still reach: retry a failure, settle a failed task's
call in doubt, roll back a result."""


class Inbox:
    """The sending side: validate, classify and durably store events."""

    def __init__(self, store: WorkerStore, protocol: InterruptionProtocol, settings: Settings,
                 counters: Counter[str] | None = None) -> None:
        self.store = store
        self.protocol = protocol
        self.settings = settings
        self.counters: Counter[str] = counters if counters is not None else Counter()

    async def emit(self, event: Event) -> tuple[EmitReceipt, Priority]:
        """Store *event*; returns only once it is durable (or refused with an error)."""
        if not isinstance(event.type, str) or not event.type:
            raise InvalidInput("an event needs a non-empty string type")
        if len(event.type) > MAX_NAME or not event.type.isprintable():
            raise InvalidInput(f"event type {event.type[:40]!r}... must be printable and at most"
                               f" {MAX_NAME} characters")
        check_task_id(event.task_id)
        source_id = event.source_event_id
        if source_id is not None and (not isinstance(source_id, str) or len(source_id) > MAX_NAME
                                      or not source_id.isprintable()):
            shown = f" ({source_id[:40]!r})" if isinstance(source_id, str) else ""
            raise InvalidInput(f"source_event_id{shown} must be a string of at most {MAX_NAME}"
                               " printable characters (no NUL, no line break)")
        event.payload = to_plain(event.payload, self.settings.max_payload_bytes,
                                 f"payload of event {event.type!r}")
        rule = self.protocol.rule_for(event.type, event.priority)
        limits = InboxLimits(
            capacity=self.settings.inbox_capacity,
            refusable=rule.priority >= Priority.P2,
            coalesce=rule.coalesce,
            window=self.settings.coalesce_window,
            wakes_needs_human=event.type in CONTROL_EVENTS,
            reopens=REOPENS.get(event.type, frozenset()),
        )
        try:
            receipt = await self.store.add_event(event, int(rule.priority), limits, time.time())
        except InboxFull:
            self.counters["events_refused"] += 1
            raise
        self.counters[f"events_{receipt.outcome}"] += 1
        self.counters["events_coalesced"] += receipt.coalesced
        return receipt, rule.priority

"""Rows into tether's data classes, once for every SQL backend (R13).

Rows are read by column name (``sqlite3.Row``, psycopg's ``dict_row``), never by position,
so a column added to a SELECT cannot shift what a mapper reads. Values are normalised here
(``int``, ``bytes``, parsed JSON) because the drivers return them in slightly different
types (PostgreSQL ``bytea`` and ``BIGINT``, SQLite ``BLOB`` and ``INTEGER``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import orjson

from tether.model import Event, EventStatus, IdempotencyRecord, OutcomeStatus, Status, TaskRecord
from tether.store.base import StoredEvent


class Row(Protocol):
    """A result row read by column name: ``sqlite3.Row`` or a psycopg ``dict_row`` dict."""

    def __getitem__(self, column: str, /) -> Any: ...


def task_record(row: Row) -> TaskRecord:
    """A row of :data:`tether.store.queries.GET_TASK` (or of a task listing)."""
    return TaskRecord(
        task_id=row["task_id"], agent=row["agent"], status=Status(row["status"]),
        created_at=row["created_at"], updated_at=row["updated_at"],
        head_version=int(row["head_version"]), reason=row["reason"],
        lease_owner=row["lease_owner"], lease_until=row["lease_until"], wake_at=row["wake_at"])


def stored_event(row: Row) -> StoredEvent:
    """A row of an event listing (:data:`tether.store.queries.LIST_EVENTS`)."""
    priority = int(row["priority"])
    event = Event(type=row["type"], task_id=row["task_id"], payload=orjson.loads(row["payload"]),
                  priority=priority, source_event_id=row["source_event_id"], id=int(row["id"]),
                  created_at=row["created_at"])
    return StoredEvent(event, priority=priority, status=EventStatus(row["status"]),
                       coalesce=row["coalesce_class"])


def idempotency_record(row: Row) -> IdempotencyRecord:
    """A row of :data:`tether.store.queries.GET_IDEMPOTENCY` (or of a task's listing)."""
    result = row["result"]
    return IdempotencyRecord(
        key=row["key"], task_id=row["task_id"], tool=row["tool"], args_hash=row["args_hash"],
        status=OutcomeStatus(row["status"]), result=None if result is None else orjson.loads(result),
        error=row["error"], attempts=row["attempts"], updated_at=row["updated_at"])


def version(row: Row) -> tuple[int, float, int]:
    """A row of :data:`tether.store.queries.LIST_VERSIONS`: (version, created_at, size)."""
    return int(row["version"]), float(row["created_at"]), int(row["size"])


def blobs(rows: Iterable[Row]) -> dict[str, bytes]:
    """Rows of ``digest, data`` (each backend's own blob lookup) as a dictionary."""
    return {row["digest"]: bytes(row["data"]) for row in rows}

"""The handoff bundle: everything a person needs to understand a parked task, in one file (R26)."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import orjson

from tether.errors import CorruptSnapshot
from tether.model import Snapshot, TaskRecord
from tether.reading import TaskReader
from tether.store import ReadStore

BUNDLE_FORMAT = 1


async def export_bundle(store: ReadStore, task_id: str) -> dict[str, Any]:
    """Snapshot, dialog, failure reasons, events, idempotency records and recovery log.

    Everything is read through a :class:`TaskReader`: a bundle is what a person sees, and
    exporting one must not be able to change the task."""
    reads = TaskReader(store)
    record = await reads.task(task_id)
    version, data = await reads.head(task_id)
    try:
        data = await reads.whole(task_id, version, data)
        snap = Snapshot.loads(data, task_id, version)
    except CorruptSnapshot as error:
        return await _bundle_without_snapshot(reads, record, str(error))
    history = await reads.history(task_id, snap.history_segments)
    return {
        "format": BUNDLE_FORMAT,
        "exported_at": time.time(),
        "task": {**asdict(record), "status": record.status.value},
        "reason": record.reason,
        "failure_reasons": snap.recovery.reasons,
        "usage": snap.usage,
        "snapshot_version": version,
        "snapshot": orjson.loads(data),
        "history": history[: snap.history_len],
        "code_versions": code_versions(history[: snap.history_len]),
        "versions": [
            {"version": v, "created_at": at, "bytes": size}
            for v, at, size in await reads.versions(task_id)
        ],
        "events": [
            {**stored.event.to_dict(), "status": stored.status, "coalesce": stored.coalesce}
            for stored in await reads.events(task_id)
        ],
        "idempotency": [asdict(r) for r in await reads.calls(task_id)],
        "recovery_log": await reads.recovery_log(task_id),
    }


def code_versions(history: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Which agent and tool versions planned and ran the task's steps (E8), oldest first."""
    agents: dict[str, None] = {}
    tools: dict[str, None] = {}
    for row in history:
        if row.get("planned_by"):
            agents[str(row["planned_by"])] = None
        if row.get("tool_version") and isinstance(row.get("tool_call"), dict):
            tools[f"{row['tool_call'].get('name')}@{row['tool_version']}"] = None
    return {"agents": list(agents), "tools": list(tools)}


async def _bundle_without_snapshot(reads: TaskReader, record: TaskRecord,
                                   error: str) -> dict[str, Any]:
    """What can still be said about a task whose snapshots are all unreadable."""
    task_id = record.task_id
    return {
        "format": BUNDLE_FORMAT,
        "exported_at": time.time(),
        "task": {**asdict(record), "status": record.status.value},
        "reason": record.reason,
        "snapshot_error": error,
        "events": [stored.event.to_dict() for stored in await reads.events(task_id)],
        "idempotency": [asdict(r) for r in await reads.calls(task_id)],
        "recovery_log": await reads.recovery_log(task_id),
    }


def dumps_bundle(bundle: dict[str, Any]) -> bytes:
    return orjson.dumps(bundle, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)

"""A task as the console shows it: its timeline, its versions, and the diff of two versions.

The task page renders these once; the live stream (:mod:`tether.web.live`) shapes each new
row with the same functions, so a row that arrives live reads exactly as it would after a
reload.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from tether.agent import completion_summary
from tether.engine.timers import local_time
from tether.errors import TetherError
from tether.harness import Harness
from tether.model import Snapshot
from tether.watching import Change

MARKERS = {"resume": "crash", "fallback_version": "crash", "rollback": "rollback",
           "rollback_refused": "rollback", "amend": "person"}
"""How a recovery record is marked in the timeline (``human_*`` records are a person's)."""
_PERSON_ROWS = {("event", "decide"), ("event", "cancel"), ("user", "resume")}


def marker(strategy: str) -> str:
    if strategy.startswith("human_"):
        return "person"
    return MARKERS.get(strategy, "recovery")


def timeline(history: list[dict[str, Any]], recoveries: list[dict[str, Any]]
             ) -> list[dict[str, Any]]:
    """Dialog rows and recovery records in one list, by time, each with its time and the
    time since the entry before it; crashes, rollbacks and people's acts marked."""
    pending = sorted((r for r in recoveries if isinstance(r.get("at"), int | float)),
                     key=lambda r: float(r["at"]))
    undated = [r for r in recoveries if not isinstance(r.get("at"), int | float)]
    merged: list[tuple[str, dict[str, Any]]] = []
    for row in history:
        at = row.get("at")
        while pending and isinstance(at, int | float) and float(pending[0]["at"]) <= at:
            merged.append(("recovery", pending.pop(0)))
        merged.append(("row", row))
    merged.extend(("recovery", r) for r in pending + undated)
    entries: list[dict[str, Any]] = []
    previous: float | None = None
    step = 0
    for kind, item in merged:
        if kind == "row":
            step += 1
            entry = row_entry(item, step, previous)
        else:
            entry = recovery_entry(item, previous)
        entries.append(entry)
        previous = entry["at"] if entry["at"] is not None else previous
    return entries


def row_entry(row: Mapping[str, Any], n: int, previous: float | None) -> dict[str, Any]:
    """One dialog row of the timeline: its number, time, time since *previous*, what."""
    person = (row.get("role"), row.get("type")) in _PERSON_ROWS
    return {**_when(row, previous), "n": n, "what": describe(row), "detail": detail(row),
            "marker": "person" if person else ""}


def recovery_entry(record: Mapping[str, Any], previous: float | None) -> dict[str, Any]:
    """One recovery record of the timeline, marked crash, rollback, person or recovery."""
    strategy = str(record.get("resume_strategy") or "recovery")
    return {**_when(record, previous), "n": "", "what": strategy.replace("_", " "),
            "detail": str(record.get("detail") or ""), "marker": marker(strategy)}


def _when(item: Mapping[str, Any], previous: float | None) -> dict[str, Any]:
    at = item.get("at")
    stamp = float(at) if isinstance(at, int | float) else None
    return {"at": stamp, "time": clock(stamp), "full": local_time(stamp) if stamp else "",
            "delta": duration(stamp - previous) if stamp is not None and previous is not None
            else "", "traceback": item.get("traceback")}


class LiveShape:
    """Shapes the live stream for the task page: rows and recovery records become timeline
    entries numbered and timed after those the page already shows."""

    def __init__(self, rows: int, previous: float | None) -> None:
        self.rows = rows
        self.previous = previous

    def __call__(self, change: Change) -> dict[str, Any] | None:
        if change.kind == "reset":
            self.rows, self.previous = 0, None
            return change.data
        if change.kind == "row":
            self.rows += 1
            entry = row_entry(change.data["row"], self.rows, self.previous)
        elif change.kind == "recovery":
            entry = recovery_entry(change.data["record"], self.previous)
        else:
            return change.data
        self.previous = entry["at"] if entry["at"] is not None else self.previous
        return entry


def clock(at: float | None) -> str:
    if at is None:
        return ""
    return datetime.fromtimestamp(at).astimezone().strftime("%H:%M:%S.%f")[:-3]


def duration(seconds: float) -> str:
    """A step's duration as people read it: +0.25 s, +3.2 s, +4 min 10 s, +2 h 5 min."""
    seconds = max(seconds, 0.0)
    if seconds < 10:
        return f"+{seconds:.2f} s" if seconds < 1 else f"+{seconds:.1f} s"
    if seconds < 60:
        return f"+{seconds:.0f} s"
    if seconds < 3600:
        return f"+{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"+{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def describe(row: Mapping[str, Any]) -> str:
    if "tool_call" in row:
        return f"tool call {row['tool_call']['name']}"
    if row.get("role") == "tool":
        return f"{row.get('name')} {'failed' if 'error' in row else 'returned'}"
    if row.get("role") in ("user", "event"):
        return f"event {row.get('type')}"
    if row.get("role") == "assistant":
        return "reply (cut off)" if row.get("cut_off") else "reply"
    if row.get("role") == "model":
        return "model call"
    return str(row.get("event") or row.get("role"))


def detail(row: Mapping[str, Any]) -> str:
    if "tool_call" in row:
        call = row["tool_call"]
        return f"key {call['key']}  args {orjson.dumps(call['args']).decode()[:300]}"
    if row.get("role") == "model":
        return completion_summary(row)
    value = row.get("error") or row.get("content")
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return text[:500]


@dataclass(frozen=True)
class VersionLabel:
    """A kept version as a person picks it: its number, step, status and time."""

    version: int
    step: int
    status: str
    at: float

    @property
    def text(self) -> str:
        return f"v{self.version} · step {self.step} · {self.status} · {clock(self.at)[:8]}"


async def version_labels(harness: Harness, task_id: str) -> list[VersionLabel]:
    """Every kept version, labelled from its own snapshot (a version that cannot be read
    says so instead of hiding)."""
    labels = []
    for version, at, _ in await harness.reads.versions(task_id):
        try:
            _, head = await harness.reads.head(task_id, version)
            snap = Snapshot.loads(head, task_id, version)
            labels.append(VersionLabel(version, snap.step, snap.status.value, at))
        except TetherError:  # a damaged version is listed, not fatal to the page
            labels.append(VersionLabel(version, -1, "unreadable", at))
    return labels


async def pretty(harness: Harness, task_id: str, version: int) -> list[str]:
    _, head = await harness.reads.head(task_id, version)
    return orjson.dumps(orjson.loads(head), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
                        ).decode().splitlines()


def side_by_side(old: list[str], new: list[str]) -> list[dict[str, Any]]:
    """Two versions' lines paired for a two-column diff: each row has a kind (same, changed,
    removed, added) and the line on each side (None where that side has none). Runs of
    unchanged lines longer than a few are folded to their ends, with a count between."""
    rows: list[dict[str, Any]] = []
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            rows.extend(_folded(old[i1:i2], i1, j1))
            continue
        left, right = old[i1:i2], new[j1:j2]
        for k in range(max(len(left), len(right))):
            a = left[k] if k < len(left) else None
            b = right[k] if k < len(right) else None
            kind = "changed" if a is not None and b is not None else \
                "removed" if a is not None else "added"
            rows.append({"kind": kind, "a": a, "b": b,
                         "na": i1 + k + 1 if a is not None else "",
                         "nb": j1 + k + 1 if b is not None else ""})
    return rows


CONTEXT = 3
"""Unchanged lines kept on each side of a change."""


def _folded(lines: list[str], i: int, j: int) -> list[dict[str, Any]]:
    def same(k: int) -> dict[str, Any]:
        return {"kind": "same", "a": lines[k], "b": lines[k], "na": i + k + 1, "nb": j + k + 1}

    if len(lines) <= 2 * CONTEXT + 1:
        return [same(k) for k in range(len(lines))]
    hidden = len(lines) - 2 * CONTEXT
    return [*(same(k) for k in range(CONTEXT)),
            {"kind": "fold", "a": f"… {hidden} unchanged lines …", "b": "", "na": "", "nb": ""},
            *(same(k) for k in range(len(lines) - CONTEXT, len(lines)))]

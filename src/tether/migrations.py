"""Snapshot format migrations: an older head is upgraded on load, step by step.

Snapshots are data, not a replay of code (E8), so a head written by an older
tether must load in a newer one. Each entry upgrades a raw head (the decoded
JSON object) from one format to the next; ``upgrade`` applies them in order.
A head from a *newer* format is never guessed at: see ``SnapshotTooNew``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Raw = dict[str, Any]


def _v1_to_v2(raw: Raw) -> Raw:
    """Format 2 dropped ``call.fingerprints``: the recovery state keeps the fingerprints that
    matter (R22), and the per-call list only grew with every retry."""
    if isinstance(raw.get("call"), dict):
        raw["call"].pop("fingerprints", None)
    return raw


def _v2_to_v3(raw: Raw) -> Raw:
    """Format 3 added a task deadline and the degraded modes (E6, R3): none of them was set."""
    raw.setdefault("deadline_at", None)
    raw.setdefault("degraded", None)
    raw.setdefault("worker_degraded", None)
    return raw


def _v3_to_v4(raw: Raw) -> Raw:
    """Format 4 heads may refer to large values by digest (R20); a format-3 head has none, and
    a format-3 tether must refuse a format-4 head rather than read references as data."""
    return raw


def _v4_to_v5(raw: Raw) -> Raw:
    """Format 5 remembers the span of the task's latest run (OpenTelemetry links)."""
    raw.setdefault("trace", None)
    return raw


def _v5_to_v6(raw: Raw) -> Raw:
    """Format 6 bounds a runaway agent: a per-task step limit and where its budget began."""
    raw.setdefault("max_steps", None)
    raw.setdefault("budget_start", 0)
    return raw


def _v6_to_v7(raw: Raw) -> Raw:
    """Format 7 keeps each agenda entry as an object: the action, the code that planned it and
    the open call put aside with it (format 6 mixed the three into one flat dict)."""
    for frame in raw.get("stack") or ():
        if isinstance(frame, dict) and isinstance(frame.get("agenda"), list):
            frame["agenda"] = [_agenda_entry(entry) for entry in frame["agenda"]]
    return raw


def _v7_to_v8(raw: Raw) -> Raw:
    """Format 8 counts what a task spends: model usage and repeated side-effecting calls."""
    raw.setdefault("usage", {})
    raw.setdefault("side_effects", {})
    return raw


def _v8_to_v9(raw: Raw) -> Raw:
    """Format 9 keeps with each call what its tool declared (side effect, idempotent, a
    reconcile hook); a call opened before that has no record of it."""
    calls = [raw.get("call")]
    for frame in raw.get("stack") or ():
        for entry in (frame.get("agenda") or ()) if isinstance(frame, dict) else ():
            calls.append(entry.get("open_call") if isinstance(entry, dict) else None)
    for call in calls:
        if isinstance(call, dict):
            call.setdefault("declared", None)
    return raw


ACTION_KINDS = frozenset({"tool_call", "spawn", "wait", "reply", "finish", "fail"})


def _v9_to_v10(raw: Raw) -> Raw:
    """Format 10: the rest of an answer is the engine's, on the frame's agenda. The model
    agents of format 9 kept it in their scratch (``queued``: the actions as written for the
    agenda, in order, after the agenda's own), and planned from it; it moves to the agenda,
    so a newer message can set it aside."""
    for frame in raw.get("stack") or ():
        scratch = frame.get("scratch") if isinstance(frame, dict) else None
        if not isinstance(scratch, dict):
            continue
        queued = scratch.get("queued")
        if not (isinstance(queued, list) and all(
                isinstance(a, dict) and a.get("kind") in ACTION_KINDS for a in queued)):
            continue  # not an answer's rest: some agent's own use of the name stays
        agenda = frame.setdefault("agenda", [])
        planned_by = next((e.get("planned_by") for e in agenda if isinstance(e, dict)), None)
        agenda.extend({"action": action, "planned_by": planned_by, "open_call": None}
                      for action in queued)
        del scratch["queued"]
    return raw


def _agenda_entry(flat: Any) -> Any:
    if not isinstance(flat, dict):
        return flat  # damage: the shape check names it
    action = dict(flat)
    return {"planned_by": action.pop("planned_by", None),
            "open_call": action.pop("open_call", None), "action": action}


MIGRATIONS: dict[int, Callable[[Raw], Raw]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4,
                                               4: _v4_to_v5, 5: _v5_to_v6, 6: _v6_to_v7,
                                               7: _v7_to_v8, 8: _v8_to_v9, 9: _v9_to_v10}
"""Format N -> N+1."""


def upgrade(raw: Raw, target: int) -> Raw:
    """Bring *raw* from its own format up to *target*; unknown old formats raise ValueError."""
    fmt = raw.get("format")
    while isinstance(fmt, int) and fmt < target:
        if fmt not in MIGRATIONS:
            raise ValueError(f"no migration from snapshot format {fmt}")
        raw = MIGRATIONS[fmt](raw)
        fmt += 1
        raw["format"] = fmt
    return raw

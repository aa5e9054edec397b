"""A task's dialog rows: the few kinds there are, written through one API, read by one reader
(R8, R17, R20).

The dialog is what every model agent shows its model, and what people read in ``tether
show``, the console and the bundle. Rows are plain JSON (the store keeps them as written,
appended, never rewritten); the engine writes them only through the functions here, and each
framework adapter maps :func:`read`'s typed rows to its own message types. The kinds:

==============  ===========================================================================
``UserRow``     what a person said: a user message, a follow-up, an amendment, a resume's
                message, a replaced input
``EventRow``    any other event the task was told of (a webhook, a timer, a cancel, ...)
``Completion``  one model completion: its usage, and the messages it added (frameworks)
``CallRow``     a tool call the agent made (``not_run``: set aside, never made)
``ResultRow``   a call's result, error, skip or "not run" answer
``ReplyRow``    the agent's words; ``cut_off`` when a P0 cut them
``Decision``    a person's word on a call in doubt
``SystemRow``   the engine's own note: a frame spawned or ended, a degraded mode
==============  ===========================================================================

Rows written before this module (every one ever stored) read the same: their shape is the
one these functions write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CUT_OFF = " [cut off: interrupted before the answer was finished]"
"""How every model agent marks an answer a P0 cut, in what it sends the model."""
PERSON_TYPES = frozenset({"user_message", "follow_up", "amend", "user_interrupt"})
"""Event types whose payload is a person's words (a ``user`` row)."""


# ---------------------------------------------------------------------------- writing


def user(kind: str, content: Any, event_id: int | None = None, **extra: Any) -> dict[str, Any]:
    """What a person said (*kind*: the event type, ``resume`` or ``input``)."""
    row: dict[str, Any] = {"role": "user", "type": kind}
    if event_id is not None:
        row["event_id"] = event_id
    return {**row, "content": content, **extra}


def event(kind: str, content: Any, event_id: int | None) -> dict[str, Any]:
    """An event the task was told of; a person's words go to :func:`user`."""
    role = "user" if kind in PERSON_TYPES else "event"
    return {"role": role, "type": kind, "event_id": event_id, "content": content}


def completion(record: Mapping[str, Any]) -> dict[str, Any]:
    """One model completion as an agent recorded it (``TaskView.record_completion``)."""
    return {"role": "model", **record}


def call(name: str, args: Any, key: str, **extra: Any) -> dict[str, Any]:
    """A tool call, under its idempotency key (``not_run=True``: set aside, never made)."""
    return {"role": "assistant", "tool_call": {"name": name, "args": args, "key": key}, **extra}


def result(name: str, key: str, content: Any, **extra: Any) -> dict[str, Any]:
    """A call's answer: its result (*content*), or ``error=``, ``skipped=``, ``not_run=``."""
    return {"role": "tool", "name": name, "key": key, "content": content, **extra}


def error(name: str, key: str, message: str, **extra: Any) -> dict[str, Any]:
    """A call that failed: what it raised, as the model reads it."""
    return {"role": "tool", "name": name, "key": key, "error": message, **extra}


def reply(text: Any, *, cut_off: bool = False, **extra: Any) -> dict[str, Any]:
    """The agent's words; *cut_off* when a P0 cut the answer they are the start of."""
    return {"role": "assistant", "content": text, **({"cut_off": True} if cut_off else {}),
            **extra}


def decision(event_id: int | None, content: Mapping[str, Any]) -> dict[str, Any]:
    """A person's word on a call in doubt (outcome, by, tool, key, attempt, result)."""
    return {"role": "event", "type": "decide", "event_id": event_id, "content": dict(content)}


def system(kind: str, **fields: Any) -> dict[str, Any]:
    """The engine's own note (``spawn``, ``finish``, ``fail``, a degraded mode)."""
    return {"role": "system", "event": kind, **fields}


# ---------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class UserRow:
    kind: str
    content: Any


@dataclass(frozen=True)
class EventRow:
    kind: str
    content: Any
    event_id: int | None


@dataclass(frozen=True)
class Completion:
    record: Mapping[str, Any]

    @property
    def messages(self) -> list[Any]:
        """The framework messages it added (empty for ChatAgent's)."""
        return list(self.record.get("messages") or [])


@dataclass(frozen=True)
class CallRow:
    name: str
    args: Any
    key: str
    not_run: bool = False


@dataclass(frozen=True)
class ResultRow:
    name: str
    key: str
    content: Any = None
    error: str | None = None
    skipped: bool = False
    not_run: bool = False


@dataclass(frozen=True)
class ReplyRow:
    text: Any
    cut_off: bool = False


@dataclass(frozen=True)
class Decision:
    content: Mapping[str, Any]


@dataclass(frozen=True)
class SystemRow:
    kind: str
    fields: Mapping[str, Any] = field(default_factory=dict)


DialogRow = (UserRow | EventRow | Completion | CallRow | ResultRow | ReplyRow | Decision
             | SystemRow)


def read(row: Mapping[str, Any]) -> DialogRow:
    """The typed row *row* is (any row ever stored: the shapes are the writers' above). A row
    of no known shape reads as the engine's note of its role, so no reader breaks on it."""
    role = row.get("role")
    if "tool_call" in row:
        made = row["tool_call"]
        return CallRow(str(made.get("name")), made.get("args") or {}, str(made.get("key")),
                       bool(row.get("not_run")))
    if role == "tool":
        return ResultRow(str(row.get("name")), str(row.get("key")), row.get("content"),
                         None if "error" not in row else str(row["error"]),
                         bool(row.get("skipped")), bool(row.get("not_run")))
    if role == "model":
        return Completion(row)
    if role == "assistant":
        return ReplyRow(row.get("content"), bool(row.get("cut_off")))
    if role == "user":
        return UserRow(str(row.get("type") or "user_message"), row.get("content"))
    if role == "event" and row.get("type") == "decide":
        return Decision(row.get("content") or {})
    if role == "event":
        return EventRow(str(row.get("type")), row.get("content"), row.get("event_id"))
    return SystemRow(str(row.get("event") or role), {k: v for k, v in row.items()
                                                     if k not in ("role", "event")})


def spoken(row: UserRow | EventRow, text: str) -> str:
    """What a person's words or an event say to a model, *text* being its content as text:
    a user message as it is, anything else labelled with its type (``[amend] ...``)."""
    return text if row.kind == "user_message" else f"[{row.kind}] {text}"

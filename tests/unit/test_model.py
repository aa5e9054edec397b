"""The data model: life cycle, plain data, snapshots and actions (R8, R9, R11)."""

from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import Any

import orjson
import pydantic
import pytest

from tether.errors import CorruptSnapshot, IllegalTransition, InvalidInput
from tether.model import (
    SNAPSHOT_FORMAT,
    AgendaEntry,
    CallState,
    CallStatus,
    Event,
    Fail,
    Finish,
    Frame,
    RecoveryState,
    Reply,
    Resource,
    Snapshot,
    Spawn,
    Status,
    ToolCall,
    Wait,
    action_from_dict,
    action_to_dict,
    check_transition,
    to_plain,
)

# --------------------------------------------------------------------------- life cycle


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (Status.PENDING, Status.RUNNING),
        (Status.PENDING, Status.CANCELLED),
        (Status.RUNNING, Status.PAUSED),
        (Status.RUNNING, Status.WAITING),
        (Status.RUNNING, Status.NEEDS_HUMAN),
        (Status.RUNNING, Status.COMPLETED),
        (Status.RUNNING, Status.FAILED),
        (Status.PAUSED, Status.RUNNING),
        (Status.WAITING, Status.RUNNING),
        (Status.NEEDS_HUMAN, Status.RUNNING),
        (Status.NEEDS_HUMAN, Status.CANCELLED),
        (Status.FAILED, Status.RUNNING),
        (Status.RUNNING, Status.RUNNING),
        (Status.COMPLETED, Status.COMPLETED),
    ],
)
def test_legal_transitions(current: Status, target: Status) -> None:
    """R11, R26: the life cycle allows these moves (and staying put)."""
    check_transition("t1", current, target)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (Status.CANCELLED, Status.RUNNING),
        (Status.COMPLETED, Status.RUNNING),
        (Status.COMPLETED, Status.FAILED),
        (Status.PENDING, Status.COMPLETED),
        (Status.PENDING, Status.WAITING),
        (Status.WAITING, Status.COMPLETED),
        (Status.FAILED, Status.COMPLETED),
        (Status.CANCELLED, Status.PENDING),
    ],
)
def test_illegal_transitions_name_task_and_states(current: Status, target: Status) -> None:
    """R11: a cancelled or completed task never runs again; illegal moves are refused by name."""
    with pytest.raises(IllegalTransition) as info:
        check_transition("task-42", current, target)
    message = str(info.value)
    assert "task-42" in message and current.value in message and target.value in message


def test_terminal_statuses() -> None:
    """R11: completed, failed and cancelled are terminal; the rest are not."""
    assert {s for s in Status if s.is_terminal} == {Status.COMPLETED, Status.FAILED, Status.CANCELLED}


# --------------------------------------------------------------------------- plain data


@dataclasses.dataclass
class _Usage:
    tokens: int
    model: str


@dataclasses.dataclass
class _Response:
    text: str
    usage: _Usage
    tags: tuple[str, ...] = ("a",)


class _Measured(pydantic.BaseModel):
    reading: Any
    unit: str | None = None


class _PydanticLike:
    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        assert mode == "json"
        return {"id": "resp-1", "choices": [{"text": "hi"}]}


def test_to_plain_converts_dataclasses() -> None:
    """R8: SDK-like dataclass responses become plain JSON data before entering a snapshot."""
    plain = to_plain({"resp": _Response("hi", _Usage(12, "m1")), 1: "int key"})
    assert plain == {"resp": {"text": "hi", "usage": {"tokens": 12, "model": "m1"}, "tags": ["a"]},
                     "1": "int key"}


def test_to_plain_uses_model_dump() -> None:
    """R8: pydantic-style objects are converted through model_dump(mode="json")."""
    assert to_plain(_PydanticLike()) == {"id": "resp-1", "choices": [{"text": "hi"}]}


@dataclasses.dataclass
class _Reading:
    value: float
    note: str | None = None


@dataclasses.dataclass
class _Cached:
    """Attributes orjson does not write: a private one, and one set only later."""

    value: float
    note: str | None = None
    _raw: float = float("nan")
    cached: float = dataclasses.field(init=False)


class _Ceiling(enum.Enum):
    NONE = float("inf")


class _AlwaysEqual(dict[str, Any]):
    """A dict whose ``__eq__`` says yes to anything: equality proves nothing about it."""

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        return True


@pytest.mark.parametrize("value", [
    {"a": float("nan"), "b": None},
    [None, float("inf")],
    float("-inf"),
    _Reading(float("nan")),
    {"reading": _Reading(1.0, note=None), "also": [_Reading(float("inf"))]},
    _AlwaysEqual(a=float("nan"), b=None),
    {"ceiling": _Ceiling.NONE, "note": None},
    _Measured(reading=float("inf")),  # pydantic's JSON mode writes an Any field's as null
    _Reading(1.0, note={float("nan"): "key"}),  # type: ignore[arg-type]
])
def test_to_plain_refuses_nan_and_infinities_wherever_they_sit(value: Any) -> None:
    """R8: orjson would write them as null, a silent change of the data: refused, in plain
    data, in dataclasses, and in a subclass whose equality cannot be trusted."""
    with pytest.raises(InvalidInput, match="NaN or an infinity"):
        to_plain(value)


@pytest.mark.parametrize("value", [
    {"a": None, "b": [1, 2.5, "x", None]},
    {"reading": _Reading(1.5), "when": datetime.date(2026, 12, 7)},
    _AlwaysEqual(a=None),
    {1: None},
    _Cached(1.0),
])
def test_to_plain_keeps_nulls_that_were_nulls(value: Any) -> None:
    """R8: a null that was None is no NaN: kept, whatever the value is built of."""
    assert orjson.loads(orjson.dumps(to_plain(value))) == to_plain(value)
    assert None in _leaves(to_plain(value))


def test_to_plain_writes_of_a_dataclass_what_orjson_writes() -> None:
    """R8: what orjson leaves out of a dataclass (an attribute never set, a private one) is
    neither looked at nor refused."""
    assert to_plain({"reading": _Cached(1.0)}) == {"reading": {"value": 1.0, "note": None}}


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


@pytest.mark.parametrize("value", [object(), {"handle": object()}, [1, {2, 3}], {"f": lambda: 1}])
def test_to_plain_refuses_non_serialisable(value: Any) -> None:
    """R8: a value that would not load again after a restart is refused with InvalidInput."""
    with pytest.raises(InvalidInput, match="not JSON-serialisable"):
        to_plain(value)


# --------------------------------------------------------------------------- snapshots


def _full_snapshot() -> Snapshot:
    root = Frame(agent="planner", input={"goal": "refund"}, frame_id="f-root", steps=2,
                 scratch={"seen": [1, 2]},
                 agenda=[AgendaEntry(action_to_dict(Reply("ok")), planned_by="planner@1")])
    child = Frame(agent="refunder", input={"order": "o-1"}, frame_id="f-child",
                  wait={"event_type": "approval", "due": 123.0})
    return Snapshot(
        task_id="t1",
        agent="planner",
        input={"goal": "refund"},
        status=Status.WAITING,
        created_at=1000.0,
        step=5,
        stack=[root, child],
        call=CallState(key="t1:f-child:0", tool="refund", args={"amount": 10}, args_hash="abc",
                       status=CallStatus.STARTED, attempt=1),
        resources=[Resource(kind="file", ref="/tmp/x", cleanup="on_success")],
        signals={"progress": 0.5},
        history_len=7,
        history_segments=[[0, 4], [1, -1]],
        recovery=RecoveryState(attempts=1, fingerprints=["fp"], started_at=999.0, reasons=["boom"]),
        key_salt="~redo1",
    )


def test_snapshot_round_trips() -> None:
    """R8, R9: the whole head, stack included, survives dumps/loads unchanged."""
    snap = _full_snapshot()
    loaded = Snapshot.loads(snap.dumps(), "t1", 3)
    assert loaded == snap
    assert loaded.status is Status.WAITING
    assert isinstance(loaded.stack[1], Frame) and loaded.frame.agent == "refunder"
    assert isinstance(loaded.call, CallState) and loaded.call.status == "started"
    assert isinstance(loaded.resources[0], Resource)
    assert isinstance(loaded.recovery, RecoveryState)
    assert loaded.format == SNAPSHOT_FORMAT


def test_minimal_snapshot_round_trips() -> None:
    """R8: a fresh task's head (no call, only its root frame) round-trips too."""
    snap = Snapshot(task_id="t2", agent="echo", input=None, created_at=1.0,
                    stack=[Frame(agent="echo")])
    assert Snapshot.loads(snap.dumps(), "t2", 1) == snap


def test_a_head_with_an_empty_stack_is_damage() -> None:
    """R8: every stored head has its root frame; one without is reported as damage."""
    snap = Snapshot(task_id="t2", agent="echo", input=None, created_at=1.0)
    with pytest.raises(CorruptSnapshot, match="stack is empty"):
        Snapshot.loads(snap.dumps(), "t2", 1)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00\xffnot json",
        b"[1, 2, 3]",
        b"{}",
        b'{"format": "one"}',
        orjson.dumps({"format": SNAPSHOT_FORMAT, "task_id": "t1"}),
        _full_snapshot().dumps()[:-20],
        _full_snapshot().dumps().replace(b'"waiting"', b'"sleeping"'),
    ],
)
def test_corrupt_snapshot_names_task_and_version(data: bytes) -> None:
    """R13: a damaged head raises CorruptSnapshot naming the task and version, nothing else."""
    with pytest.raises(CorruptSnapshot) as info:
        Snapshot.loads(data, "task-7", 42)
    message = str(info.value)
    assert "task-7" in message and "42" in message


@pytest.mark.parametrize(
    ("where", "field", "value"),
    [
        ("call", "retry_at", "soon"),  # float | None
        ("call", "error", 5),  # str | None
        ("recovery", "fingerprints", ["fp", 1]),  # list[str]: one bad item is enough
        ("head", "history_segments", [[0, "4"]]),  # list[list[int]]
        ("head", "max_steps", 2.5),  # int | None
        ("head", "trace", ["span"]),  # dict | None
    ],
)
def test_a_field_of_the_wrong_type_is_damage_none_where_allowed_is_not(
        where: str, field: str, value: Any) -> None:
    """R8, R13: every field of a stored head is checked against its declared type, an
    optional one too (None fits it; a value of another type is damage, named by field)."""
    raw = orjson.loads(_full_snapshot().dumps())
    part = raw if where == "head" else raw[where]
    if field in ("retry_at", "error", "max_steps", "trace"):
        part[field] = None
        assert Snapshot.loads(orjson.dumps(raw), "t1", 3) is not None
    part[field] = value
    with pytest.raises(CorruptSnapshot, match=field):
        Snapshot.loads(orjson.dumps(raw), "t1", 3)


def test_a_format_6_agenda_is_upgraded_to_entries_with_their_open_call() -> None:
    """R8, E8: a head written before agenda entries were objects (format 6: the action, who
    planned it and an open call put aside, all in one flat dict) loads as AgendaEntry objects,
    the open call as a CallState with its key and attempts."""
    raw = orjson.loads(_full_snapshot().dumps())
    raw["format"] = 6
    call = {"key": "k-1", "tool": "refund", "args": {"amount": 10}, "args_hash": "abc",
            "status": "failed", "attempt": 2, "retry_at": None, "error": "boom"}
    raw["stack"][0]["agenda"] = [
        {"kind": "tool_call", "name": "refund", "args": {"amount": 10},
         "planned_by": "planner@1", "open_call": call},
        {"kind": "reply", "text": "ok"}]
    loaded = Snapshot.loads(orjson.dumps(raw), "t1", 3)
    first, second = loaded.stack[0].agenda
    assert first == AgendaEntry({"kind": "tool_call", "name": "refund", "args": {"amount": 10}},
                                "planner@1", CallState(**{**call, "status": CallStatus.FAILED}))
    assert first.to_action() == ToolCall("refund", {"amount": 10})
    assert second == AgendaEntry({"kind": "reply", "text": "ok"})
    assert loaded.format == SNAPSHOT_FORMAT


def test_a_format_7_head_loads_with_no_usage_and_no_repeats_counted() -> None:
    """R8, E8: heads written before tasks counted model usage and repeated side effects."""
    raw = orjson.loads(_full_snapshot().dumps())
    raw["format"] = 7
    del raw["usage"], raw["side_effects"]
    loaded = Snapshot.loads(orjson.dumps(raw), "t1", 3)
    assert (loaded.usage, loaded.side_effects, loaded.format) == ({}, {}, SNAPSHOT_FORMAT)


def test_an_agenda_entry_of_an_unknown_kind_is_damage() -> None:
    """R13: an agenda entry naming no known action makes the head unreadable, by name."""
    raw = orjson.loads(_full_snapshot().dumps())
    raw["stack"][0]["agenda"][0]["action"]["kind"] = "teleport"
    with pytest.raises(CorruptSnapshot, match="teleport"):
        Snapshot.loads(orjson.dumps(raw), "t1", 3)


# --------------------------------------------------------------------------- actions


@pytest.mark.parametrize(
    "action",
    [
        ToolCall("refund", {"amount": 10}),
        Spawn("researcher", {"q": "x"}),
        Wait("approval", timeout=30.0),
        Reply("done"),
        Finish({"ok": True}),
        Fail("no stock"),
    ],
)
def test_actions_round_trip(action: Any) -> None:
    """R8, R17: actions are stored as plain data with their kind and come back equal."""
    data = action_to_dict(action)
    assert orjson.loads(orjson.dumps(data)) == data
    back = action_from_dict(data)
    assert type(back) is type(action)
    assert action_to_dict(back) == data


def test_action_to_dict_kind_names() -> None:
    """R17: the stored kind names the action."""
    assert action_to_dict(ToolCall("t", {"a": 1})) == {"kind": "tool_call", "name": "t", "args": {"a": 1}}
    assert action_to_dict(Reply("hi")) == {"kind": "reply", "text": "hi"}


@pytest.mark.parametrize("not_an_action", ["finish", {"kind": "reply", "text": "x"}, None, 42,
                                           Event(type="x", task_id="t")])
def test_action_to_dict_rejects_non_actions(not_an_action: Any) -> None:
    """R17: an agent returning something that is not an action gets a clear InvalidInput."""
    with pytest.raises(InvalidInput, match="not an action"):
        action_to_dict(not_an_action)


def test_action_with_unserialisable_args_is_refused() -> None:
    """R8: an action's arguments must be plain data."""
    with pytest.raises(InvalidInput):
        action_to_dict(ToolCall("t", {"client": object()}))


def test_event_to_dict() -> None:
    """R3: an event's plain form carries type, task, payload, priority and source id."""
    event = Event(type="approval", task_id="t1", payload={"ok": True}, priority=1,
                  source_event_id="s1", id=5, created_at=10.0)
    assert event.to_dict() == {"id": 5, "type": "approval", "task_id": "t1", "payload": {"ok": True},
                               "priority": 1, "source_event_id": "s1", "created_at": 10.0}


def test_snapshot_from_newer_code_is_refused_not_treated_as_corrupt() -> None:
    """E8: a head with a newer format raises SnapshotTooNew (not CorruptSnapshot), so an old
    worker never falls back to an older version and loses a newer worker's work. Unknown fields
    in a head of this very format are damage, not newer code (the format is bumped whenever the
    layout changes)."""
    import orjson as _orjson

    from tether.errors import SnapshotTooNew
    from tether.model import SNAPSHOT_FORMAT, Frame, Snapshot

    snap = Snapshot(task_id="t", agent="a", input=None, stack=[Frame(agent="a")])
    newer = _orjson.loads(snap.dumps())
    newer["format"] = SNAPSHOT_FORMAT + 1
    with pytest.raises(SnapshotTooNew, match="upgrade the worker"):
        Snapshot.loads(_orjson.dumps(newer), "t", 3)
    extra = _orjson.loads(snap.dumps())
    extra["stack"][0]["budget"] = 5
    with pytest.raises(CorruptSnapshot, match="budget"):
        Snapshot.loads(_orjson.dumps(extra), "t", 3)

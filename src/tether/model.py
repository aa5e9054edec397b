"""The data model: statuses, actions, events and the snapshot of a task.

Everything here is plain data that round-trips through JSON (R8). Objects
that do not serialise (SDK responses and the like) must be converted by
:func:`to_plain` before they enter a snapshot. The snapshot *head* is small
on purpose: the dialog lives in append-only history rows, so a checkpoint
writes only what changed (R13, R14).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
import time
import types
import typing
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from tether.errors import CorruptSnapshot, IllegalTransition, InvalidInput, SnapshotTooNew
from tether.migrations import upgrade

SNAPSHOT_FORMAT = 10
"""Bumped whenever the head's layout changes; stored in every snapshot. Older heads are
upgraded on load by :mod:`tether.migrations`."""


class Status(enum.StrEnum):
    """Where a task is in its life (R11)."""

    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    WAITING = "waiting"
    NEEDS_HUMAN = "needs_human"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})

_TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.PENDING: frozenset({Status.RUNNING, Status.CANCELLED, Status.NEEDS_HUMAN}),
    Status.RUNNING: frozenset(
        {
            Status.PAUSED,
            Status.WAITING,
            Status.NEEDS_HUMAN,
            Status.COMPLETED,
            Status.FAILED,
            Status.CANCELLED,
        }
    ),
    Status.PAUSED: frozenset({Status.RUNNING, Status.CANCELLED, Status.NEEDS_HUMAN,
                              Status.FAILED}),
    Status.WAITING: frozenset({Status.RUNNING, Status.CANCELLED, Status.NEEDS_HUMAN,
                               Status.FAILED}),
    Status.NEEDS_HUMAN: frozenset({Status.RUNNING, Status.CANCELLED, Status.FAILED}),
    Status.COMPLETED: frozenset(),
    Status.FAILED: frozenset({Status.RUNNING}),
    Status.CANCELLED: frozenset(),
}


def check_transition(task_id: str, current: Status, target: Status) -> None:
    """Refuse a move the life cycle does not allow (a cancelled task never runs again)."""
    if current != target and target not in _TRANSITIONS[current]:
        raise IllegalTransition(
            f"task {task_id}: cannot go from {current.value} to {target.value}"
        )


class Priority(enum.IntEnum):
    """Event priorities (R4): lower is more urgent."""

    P0 = 0
    P1 = 1
    P2 = 2
    P3 = 3
    P4 = 4


class CallStatus(enum.StrEnum):
    """Where the call at a resume point is: planned (safe to run), started (sent; after a
    crash its outcome is unknown), failed (its last attempt is known to have failed)."""

    PLANNED = "planned"
    STARTED = "started"
    FAILED = "failed"


class OutcomeStatus(enum.StrEnum):
    """What the idempotency table knows of a keyed call's outcome (R10)."""

    STARTED = "started"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class EventStatus(enum.StrEnum):
    """What became of a stored event: pending until the task's loop applies it (R5)."""

    PENDING = "pending"
    APPLIED = "applied"
    IGNORED = "ignored"
    COALESCED = "coalesced"
    FAILED = "failed"


def to_plain(value: Any, limit: int | None = None, what: str = "value") -> Any:
    """Convert *value* to plain JSON data, or fail naming what would not convert.

    Dataclasses and pydantic-style objects (``model_dump``) are converted;
    anything else that orjson cannot encode is refused, because a snapshot
    holding a live SDK object would not load again after a restart. With
    *limit* (a value from outside: an input, a payload, a result), data larger than
    that many bytes of JSON, or nested deeper than :data:`MAX_DEPTH`, is refused too.

    orjson writes NaN and infinities as ``null``: a value whose JSON holds a ``null`` is
    looked at for them, unless it is built of Python's own types only (no dataclass,
    subclass or datetime, whose ``__eq__`` could say anything) and equals what its JSON
    decodes to: compared at C speed, a NaN would have come back as None. That spares most
    values the full walk.
    """
    if hasattr(value, "model_dump") and callable(value.model_dump):
        if hasattr(type(value), "model_fields") and _walk_non_finite(value.model_dump()):
            raise InvalidInput(_non_finite(what))  # pydantic's JSON mode writes some as null
        value = value.model_dump(mode="json")
    try:
        encoded, builtin = _encoded(value)
    except TypeError as exc:
        if _depth(value) > MAX_DEPTH:  # orjson's own bound, 254 levels
            raise InvalidInput(_too_deep(what)) from None
        raise InvalidInput(f"{what} is not JSON-serialisable ({exc}): {value!r:.200}") from exc
    if limit is not None and len(encoded) > limit:  # before decoding what is too large
        raise InvalidInput(f"{what} is {len(encoded):,} bytes of JSON, over the limit of"
                           f" {limit:,} (Settings.max_payload_bytes); store large data elsewhere"
                           " and pass a reference")
    plain = orjson.loads(encoded)
    if b"null" in encoded and (not builtin or plain != value) and _has_non_finite(value):
        raise InvalidInput(_non_finite(what))
    if limit is not None and encoded.count(b"{") + encoded.count(b"[") > MAX_DEPTH \
            and _depth(value) > MAX_DEPTH:
        raise InvalidInput(_too_deep(what))
    return plain


_BUILTIN_ONLY = (orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS
                 | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS)
"""orjson's options under which anything but Python's own types goes to ``default``."""


class _NotBuiltin(Exception):
    """Raised by orjson's ``default``: the value holds more than Python's own types."""


def _not_builtin(_: Any) -> Any:
    raise _NotBuiltin


def builtin_only(value: Any) -> bool:
    """Whether *value* is built of Python's own types only: no dataclass, pydantic model,
    subclass, datetime or other object that JSON would carry only converted."""
    try:
        return _builtin_json(value) is not None
    except orjson.JSONEncodeError:
        return False


def _builtin_json(value: Any) -> bytes | None:
    """*value*'s JSON if it is built of Python's own types only, else None."""
    try:
        return orjson.dumps(value, default=_not_builtin, option=_BUILTIN_ONLY)
    except orjson.JSONEncodeError as exc:
        if isinstance(exc.__cause__, _NotBuiltin):
            return None
        raise


def _encoded(value: Any) -> tuple[bytes, bool]:
    """*value*'s JSON, and whether it is built of Python's own types only (one encoding for
    those; one more for the rest, as orjson encodes them natively)."""
    encoded = _builtin_json(value)
    if encoded is not None:
        return encoded, True
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS), False


def _non_finite(what: str) -> str:
    return (f"{what} holds NaN or an infinity, which JSON cannot carry; send a number, null or"
            " a string")


def _too_deep(what: str) -> str:
    return (f"{what} is nested more than {MAX_DEPTH} levels deep, which tether cannot store;"
            " flatten it")


MAX_DEPTH = 100
"""How deeply nested a value from outside may be (a task input, an event payload, a tool
result, a person's answer). The store writes JSON at most 254 levels deep (orjson's bound);
a value sits about ten levels down in a snapshot head, and escaping what looks like
internal markup may wrap it once more per level, so 100 keeps everything accepted
writable. Checked only when the JSON has that many brackets at all (a C-speed count)."""


def _depth(value: Any) -> int:
    """How many levels of objects and arrays *value* nests (iteratively: no recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


def _has_non_finite(value: Any) -> bool:
    """Whether *value* (which orjson encoded) holds NaN or an infinity. The standard library's
    C encoder finds one in a pass (its only ValueError once orjson took the value: no cycle
    gets that far); data it cannot encode (what orjson encodes natively: datetimes, UUIDs,
    dataclasses) is walked in Python."""
    try:
        json.dumps(value, allow_nan=False, check_circular=False)
    except ValueError:
        return True
    except TypeError:
        return _walk_non_finite(value)
    return False


def _walk_non_finite(value: Any) -> bool:
    """The walk for values the standard library cannot encode: what orjson writes of them."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, enum.Enum):
        return _walk_non_finite(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(map(_walk_non_finite, _dataclass_written(value)))
    if isinstance(value, dict):
        return any(_walk_non_finite(key) or _walk_non_finite(item) for key, item in value.items())
    if isinstance(value, list | tuple):
        return any(map(_walk_non_finite, value))
    return False


def _dataclass_written(value: Any) -> list[Any]:
    """The attributes orjson writes of a dataclass instance: those of its ``__dict__`` (or,
    with slots, its fields that are set) whose names do not begin with an underscore."""
    attributes = getattr(value, "__dict__", None)
    if attributes is not None:
        return [item for name, item in attributes.items() if not name.startswith("_")]
    return [getattr(value, name) for name in value.__dataclass_fields__
            if not name.startswith("_") and hasattr(value, name)]


def storable_text(text: str | None) -> str | None:
    """*text* as a text column can hold it: PostgreSQL refuses a NUL in text, and a tool's
    error message or an agent's reason may carry one (it is written as ``\\0``)."""
    if text is None or "\x00" not in text:
        return text
    return text.replace("\x00", "\\0")


def new_id() -> str:
    return uuid.uuid4().hex[:16]


TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
"""What a task id may be: 1-128 characters of letters, digits and ``. _ : -``, starting
with a letter or digit. Ids become file names (bundles) and reach terminals and URLs."""


LARGEST_COUNT = 1 << 62
"""The largest version number or step count accepted (the stores keep 64-bit integers)."""


def check_count(value: Any, what: str) -> int:
    """*value* if it is a whole number from 1 to LARGEST_COUNT, else :class:`InvalidInput`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= LARGEST_COUNT:
        raise InvalidInput(f"{what} must be a positive integer, not {value!r:.40}")
    return value


def check_task_id(task_id: Any) -> str:
    """*task_id* if it is a valid task id, else :class:`InvalidInput` saying what one is."""
    if isinstance(task_id, str) and TASK_ID.fullmatch(task_id):
        return task_id
    shown = repr(task_id)[:40] if isinstance(task_id, str) else type(task_id).__name__
    raise InvalidInput(f"task id {shown} is not valid: use 1-128 letters, digits, '.', '_', ':'"
                       " or '-', starting with a letter or digit")


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class ToolCall:
    """Call a registered tool with keyword arguments."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Spawn:
    """Push a subtask frame run by *agent*; its result is handed back to this frame (R9)."""

    agent: str
    input: Any = None


@dataclass(frozen=True)
class Wait:
    """Wait for an event of *event_type* (an approval, say), at most *timeout* seconds."""

    event_type: str
    timeout: float | None = None


@dataclass(frozen=True)
class Reply:
    """Append an assistant message to the dialog."""

    text: str


@dataclass(frozen=True)
class Finish:
    """Pop this frame with a result; the root frame finishing completes the task."""

    result: Any = None


@dataclass(frozen=True)
class Fail:
    """Pop this frame as failed; the parent sees ``child_error``, the root fails the task."""

    reason: str


@dataclass(frozen=True)
class Continue:
    """This plan did a step of the agent's own (a graph's super-step), kept in its scratch:
    commit it and plan again. A resume point between an agent's steps that call no tool, so a
    worker killed in step *n* starts again at step *n*, not at the first. *note*, if given, is
    kept in the dialog (a ``system`` row) for people reading the task."""

    note: str = ""


@dataclass(frozen=True)
class Replan:
    """Only from ``on_event``: drop this frame's recorded actions that have not started (and
    its wait), and plan again. For an amended instruction that makes the planned call wrong."""


@dataclass(frozen=True)
class CancelSubtask:
    """Only from ``on_event``, answered by a frame with subtasks running above it: end them.

    Their waits end and their calls that have not started are dropped; the frame that
    answered sees ``child_error`` ("cancelled: *reason*") and plans again. A call cannot be
    stopped half-way: a P0 event cuts an interruptible one before this is applied, any other
    call finishes first. A side-effecting call whose outcome is unknown is never dropped: the
    cancel is refused (and recorded) until a person or its reconcile hook settles it."""

    reason: str = ""


Action = ToolCall | Spawn | Wait | Reply | Finish | Fail | Continue | Replan | CancelSubtask
ACTION_KINDS: dict[str, type[Any]] = {
    "tool_call": ToolCall,
    "spawn": Spawn,
    "wait": Wait,
    "reply": Reply,
    "finish": Finish,
    "fail": Fail,
    "continue": Continue,
    "replan": Replan,
    "cancel_subtask": CancelSubtask,
}
_KIND_OF = {cls: kind for kind, cls in ACTION_KINDS.items()}


def action_to_dict(action: Action) -> dict[str, Any]:
    if type(action) not in _KIND_OF:
        raise InvalidInput(
            f"an agent returned {action!r:.120}, which is not an action "
            "(ToolCall, Spawn, Wait, Reply, Finish, Fail or Continue)"
        )
    body = {f.name: getattr(action, f.name) for f in dataclasses.fields(action)}
    return {"kind": _KIND_OF[type(action)], **to_plain(body)}


def action_from_dict(data: Mapping[str, Any]) -> Action:
    fields = dict(data)
    fields.pop("open_call", None)
    fields.pop("planned_by", None)
    cls = ACTION_KINDS[fields.pop("kind")]
    action: Action = cls(**fields)
    return action


# --------------------------------------------------------------------------- events


@dataclass
class Event:
    """One input to a task (R3). Handlers deliver events; only the task's loop applies them."""

    type: str
    task_id: str
    payload: Any = None
    priority: Priority | int | None = None
    source_event_id: str | None = None
    id: int | None = None
    created_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "task_id": self.task_id,
            "payload": self.payload,
            "priority": None if self.priority is None else int(self.priority),
            "source_event_id": self.source_event_id,
            "created_at": self.created_at,
        }


@dataclass(frozen=True)
class EmitReceipt:
    """The answer to a sender: whether the event was taken, and its id."""

    accepted: bool
    event_id: int
    outcome: Literal["stored", "duplicate"]
    """Stored now, or already stored under the same ``source_event_id`` (nothing new)."""
    coalesced: int = 0
    """How many older pending events of the same coalescing class this one replaced."""


# --------------------------------------------------------------------------- snapshot


@dataclass
class CallState:
    """The tool call at the top of the stack, from its resume point to its result (R10)."""

    key: str
    tool: str
    args: dict[str, Any]
    args_hash: str
    status: CallStatus = CallStatus.PLANNED
    attempt: int = 0
    retry_at: float | None = None
    error: str | None = None
    declared: Declaration | None = None
    """What the call's tool declared when the call was opened; None for a call opened before
    tether recorded it (then only a process that has the tool can judge it)."""


@dataclass(frozen=True)
class Declaration:
    """What a tool declared about itself, kept with each call at its resume point.

    Whether a call in doubt may simply run again (idempotent), can be checked outside
    (a reconcile hook), or needs a person is a property of the code that made the call.
    Recorded with the call, it lets any process (one without the app's code, or with
    another app's tool of the same name) answer a person truthfully, and it keeps a
    process whose tool of that name declares otherwise from judging the call.
    """

    side_effect: bool
    idempotent: bool
    reconciles: bool
    """The tool had a reconcile hook."""

    def settles_itself(self) -> bool:
        """A call in doubt of this tool is settled without a person: run again (idempotent)
        or checked by its hook."""
        return self.idempotent or self.reconciles


@dataclass
class AgendaEntry:
    """One recorded action on a frame's to-do list.

    Kept with the code that planned it (E8) and, for a call an interjection put aside, the
    call's open state (its key and attempts), so it resumes as the same call."""

    action: dict[str, Any]
    """The action as :func:`action_to_dict` writes it (its ``kind`` first)."""
    planned_by: str | None = None
    open_call: CallState | None = None

    @property
    def kind(self) -> str:
        return str(self.action["kind"])

    def to_action(self) -> Action:
        return action_from_dict(self.action)


@dataclass
class Frame:
    """One level of the task stack (R9): an agent working on its own input."""

    agent: str
    input: Any = None
    frame_id: str = field(default_factory=new_id)
    scratch: dict[str, Any] = field(default_factory=dict)
    agenda: list[AgendaEntry] = field(default_factory=list)
    steps: int = 0
    child_result: Any = None
    child_error: str | None = None
    last_event: dict[str, Any] | None = None
    last_tool_result: Any = None
    last_tool_error: dict[str, Any] | None = None
    wait: dict[str, Any] | None = None


class Cleanup(enum.StrEnum):
    """When a task's resource is cleaned up."""

    ON_FINISH = "on_finish"
    ON_SUCCESS = "on_success"
    KEEP = "keep"


@dataclass
class Resource:
    """Something outside the snapshot the task depends on, with its cleanup policy (R8)."""

    kind: str
    ref: str
    cleanup: Cleanup = Cleanup.ON_FINISH
    missing: bool = False


@dataclass
class RecoveryState:
    """Bounded recovery bookkeeping for the current resume point (R12, R22)."""

    attempts: int = 0
    fingerprints: list[str] = field(default_factory=list)
    started_at: float | None = None
    reasons: list[str] = field(default_factory=list)
    retry_at: float | None = None
    """When a failed plan (a model call) may be tried again; a due time, so it survives restarts."""
    given_up: dict[str, int] = field(default_factory=dict)
    """Calls (fingerprint + arguments) that failed for good, over the task's life: the same
    call failing the same way twice stops the task even when the agent keeps re-planning it."""


@dataclass
class Snapshot:
    """The head of a task: everything needed to resume it, except the dialog rows (R8)."""

    task_id: str
    agent: str
    input: Any
    status: Status = Status.PENDING
    created_at: float = field(default_factory=time.time)
    step: int = 0
    stack: list[Frame] = field(default_factory=list)
    call: CallState | None = None
    resources: list[Resource] = field(default_factory=list)
    signals: dict[str, Any] = field(default_factory=dict)
    history_len: int = 0
    history_segments: list[list[int]] = field(default_factory=lambda: [[0, -1]])
    recovery: RecoveryState = field(default_factory=RecoveryState)
    key_salt: str = ""
    result: Any = None
    error: str | None = None
    deadline_at: float | None = None
    """When the whole task must be done; a stored due time that fires ``task_timeout`` (E6)."""
    degraded: dict[str, Any] | None = None
    """The ``degrade`` event in force for this task, until a ``recover`` event (R3)."""
    worker_degraded: dict[str, Any] | None = None
    """The worker-wide degradation last recorded in this task's dialog."""
    trace: dict[str, str] | None = None
    """The OpenTelemetry span of the task's latest run, so the next run (in any process)
    links to it."""
    max_steps: int | None = None
    """This task's own step limit (None: ``Settings.max_steps``)."""
    budget_start: int = 0
    """The step at which the current budget of steps began; a person's resume starts anew."""
    usage: dict[str, int] = field(default_factory=dict)
    """What the task's model calls cost: completions, prompt and completion tokens, and the
    completion count at which a person's resume began the current budget."""
    side_effects: dict[str, int] = field(default_factory=dict)
    """How often each side-effecting call (tool and arguments) was made, so a model that asks
    for the same refund again and again is stopped (the newest few hundred are kept)."""
    format: int = SNAPSHOT_FORMAT

    @property
    def frame(self) -> Frame:
        return self.stack[-1]

    def open_calls(self) -> list[CallState]:
        """Every call open in the task: the current one and any put aside in an agenda."""
        found = [entry.open_call for frame in self.stack for entry in frame.agenda
                 if entry.open_call is not None]
        return [self.call, *found] if self.call is not None else found

    def dumps(self) -> bytes:
        return orjson.dumps(self, option=orjson.OPT_NON_STR_KEYS)

    @classmethod
    def loads(cls, data: bytes, task_id: str, version: int) -> Snapshot:
        """Decode a stored head; any damage becomes :class:`CorruptSnapshot` naming it."""
        try:
            raw = orjson.loads(data)
            _check_not_newer(raw, task_id, version)
            return _snapshot_from_dict(raw)
        except SnapshotTooNew:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CorruptSnapshot(
                f"task {task_id} version {version}: snapshot is unreadable ({exc})"
            ) from exc


def _check_not_newer(raw: Any, task_id: str, version: int) -> None:
    """Refuse a head written by newer code instead of mistaking it for damage (E8).

    Treating it as corrupt would fall back to an older version and lose work
    during a rolling deploy; refusing leaves it for an up-to-date worker. Only a
    newer *format* says that: the format is bumped whenever the layout changes, so
    a head of this format (or an older one) with fields nobody knows is damage.
    """
    if not isinstance(raw, dict):
        raise ValueError("snapshot head is not a JSON object")
    fmt = raw.get("format")
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > SNAPSHOT_FORMAT:
        raise SnapshotTooNew(f"task {task_id} version {version}: snapshot format {fmt} is newer"
                             f" than this tether understands ({SNAPSHOT_FORMAT}); upgrade the worker")
    if not isinstance(fmt, int) or fmt < 1:
        raise ValueError(f"unknown snapshot format {fmt!r}")
    upgrade(raw, SNAPSHOT_FORMAT)
    if raw.get("task_id") != task_id:
        raise ValueError(f"the head names task {str(raw.get('task_id'))[:40]!r}")
    _check_shape(Snapshot, raw, "head")
    if not raw["stack"]:
        raise ValueError("the task stack is empty")
    for frame in raw["stack"]:
        for entry in frame["agenda"]:
            kind = entry["action"].get("kind")
            if kind not in ACTION_KINDS:
                raise ValueError(f"an agenda entry has no known kind: {kind!r:.40}")


def _check_shape(cls: type[Any], raw: Any, where: str) -> None:
    """A stored object has exactly the fields of *cls*, each of the declared type."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where} is not an object")
    unknown = raw.keys() - _FIELDS[cls]
    if unknown:
        raise ValueError(f"{where} has fields no tether of this format writes:"
                         f" {', '.join(sorted(unknown))[:200]}")
    for name, fits in _CHECKS[cls]:
        if name in raw and not fits(raw[name]):
            hint = _HINTS[cls][name]
            raise ValueError(f"{where}.{name} is {type(raw[name]).__name__}, which does not fit"
                             f" {getattr(hint, '__name__', hint)}")


Check = typing.Callable[[Any], bool]


def _checker(hint: Any) -> Check:
    """A test of whether a decoded JSON value fits a field's type hint, built once per field
    (nested dataclasses are checked field by field too). Every claimed head is checked, so
    ``X | None`` is tested without a loop over its options, and lists through ``map``."""
    origin = typing.get_origin(hint)
    if hint is Any or origin is dict:
        return (lambda _: True) if hint is Any else (lambda v: isinstance(v, dict))
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(hint)
        if len(args) == 2 and type(None) in args:
            inner = _checker(next(arg for arg in args if arg is not type(None)))
            return lambda v: v is None or inner(v)
        options = [_checker(arg) for arg in args]
        return lambda v: any(fits(v) for fits in options)
    if origin is list:
        item = _checker(typing.get_args(hint)[0])
        return lambda v: isinstance(v, list) and all(map(item, v))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return lambda v: isinstance(v, dict) and _shaped(hint, v)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = {member.value for member in hint}
        return lambda v: isinstance(v, str) and v in values
    if hint is float:
        return lambda v: type(v) in (int, float)
    if hint is int:
        return lambda v: type(v) is int
    return lambda v: isinstance(v, hint)


def _shaped(cls: type[Any], raw: dict[str, Any]) -> bool:
    _check_shape(cls, raw, cls.__name__)
    return True


def _snapshot_from_dict(raw: dict[str, Any]) -> Snapshot:
    raw["status"] = Status(raw["status"])
    raw["stack"] = [_frame_from_dict(frame) for frame in raw["stack"]]
    raw["call"] = _call_from_dict(raw["call"])
    raw["resources"] = [Resource(**{**res, "cleanup": Cleanup(res["cleanup"])})
                        for res in raw["resources"]]
    raw["recovery"] = RecoveryState(**raw["recovery"])
    return Snapshot(**raw)


def _frame_from_dict(raw: dict[str, Any]) -> Frame:
    raw["agenda"] = [AgendaEntry(entry["action"], entry["planned_by"],
                                 _call_from_dict(entry["open_call"])) for entry in raw["agenda"]]
    return Frame(**raw)


def _call_from_dict(raw: dict[str, Any] | None) -> CallState | None:
    if not raw:
        return None
    raw["status"] = CallStatus(raw["status"])
    if raw.get("declared") is not None:
        raw["declared"] = Declaration(**raw["declared"])
    return CallState(**raw)


_SHAPED = (Snapshot, Frame, AgendaEntry, CallState, Declaration, RecoveryState, Resource)
_FIELDS: dict[type[Any], set[str]] = {
    cls: {f.name for f in dataclasses.fields(cls)} for cls in _SHAPED}
_HINTS: dict[type[Any], dict[str, Any]] = {cls: typing.get_type_hints(cls) for cls in _SHAPED}
_CHECKS: dict[type[Any], list[tuple[str, Check]]] = {  # an Any field fits whatever it holds
    cls: [(name, _checker(hint)) for name, hint in _HINTS[cls].items() if hint is not Any]
    for cls in _SHAPED}


@dataclass(frozen=True)
class TaskRecord:
    """A row of the task index: what listings show without loading a snapshot."""

    task_id: str
    agent: str
    status: Status
    created_at: float
    updated_at: float
    head_version: int
    reason: str | None = None
    lease_owner: str | None = None
    lease_until: float | None = None
    wake_at: float | None = None
    """When the task is due for a look though no event arrives: a wait's timeout, a deadline,
    a scheduled start, the end of a back-off (E6)."""

    def holder(self) -> str | None:
        """The worker holding the task under a lease that has not run out, if any."""
        if self.lease_owner is None or self.lease_until is None \
                or self.lease_until <= time.time():
            return None
        return self.lease_owner

    def runner(self) -> str | None:
        """The worker running the task's call now, if any: it holds the lease and the task is
        running. A parked task (needs_human, paused) can be leased for a moment too, by the
        worker leaving it or one claiming it to apply a lever; its call is not running then,
        and an outcome left unknown is still in doubt."""
        return self.holder() if self.status is Status.RUNNING else None


@dataclass(frozen=True)
class IdempotencyRecord:
    """What is known of one tool call's outcome, and which call it was (R10, E3)."""

    key: str
    task_id: str
    tool: str
    args_hash: str
    status: OutcomeStatus
    result: Any = None
    error: str | None = None
    attempts: int = 0
    updated_at: float = 0.0

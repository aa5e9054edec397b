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
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from tether.errors import CorruptSnapshot, IllegalTransition, InvalidInput, SnapshotTooNew
from tether.migrations import upgrade

SNAPSHOT_FORMAT = 5
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
    Status.PENDING: frozenset({Status.RUNNING, Status.CANCELLED}),
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


def to_plain(value: Any, limit: int | None = None, what: str = "value") -> Any:
    """Convert *value* to plain JSON data, or fail naming what would not convert.

    Dataclasses and pydantic-style objects (``model_dump``) are converted;
    anything else that orjson cannot encode is refused, because a snapshot
    holding a live SDK object would not load again after a restart. With
    *limit*, data larger than that many bytes of JSON is refused too.
    """
    if hasattr(value, "model_dump") and callable(value.model_dump):
        value = value.model_dump(mode="json")
    try:
        encoded = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError as exc:
        raise InvalidInput(f"{what} is not JSON-serialisable ({exc}): {value!r:.200}") from exc
    if limit is not None and len(encoded) > limit:
        raise InvalidInput(f"{what} is {len(encoded):,} bytes of JSON, over the limit of"
                           f" {limit:,} (Settings.max_payload_bytes); store large data elsewhere"
                           " and pass a reference")
    return orjson.loads(encoded)


def new_id() -> str:
    return uuid.uuid4().hex[:16]


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
class Replan:
    """Only from ``on_event``: drop this frame's recorded actions that have not started (and
    its wait), and plan again. For an amended instruction that makes the planned call wrong."""


Action = ToolCall | Spawn | Wait | Reply | Finish | Fail | Replan
ACTION_KINDS: dict[str, type[Any]] = {
    "tool_call": ToolCall,
    "spawn": Spawn,
    "wait": Wait,
    "reply": Reply,
    "finish": Finish,
    "fail": Fail,
    "replan": Replan,
}
_KIND_OF = {cls: kind for kind, cls in ACTION_KINDS.items()}


def action_to_dict(action: Action) -> dict[str, Any]:
    if type(action) not in _KIND_OF:
        raise InvalidInput(
            f"an agent returned {action!r:.120}, which is not an action "
            "(ToolCall, Spawn, Wait, Reply, Finish or Fail)"
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
    outcome: str  # "stored" or "duplicate"
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
    status: str = "planned"  # planned | started | failed
    attempt: int = 0
    retry_at: float | None = None
    error: str | None = None


@dataclass
class Frame:
    """One level of the task stack (R9): an agent working on its own input."""

    agent: str
    input: Any = None
    frame_id: str = field(default_factory=new_id)
    scratch: dict[str, Any] = field(default_factory=dict)
    agenda: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    child_result: Any = None
    child_error: str | None = None
    last_event: dict[str, Any] | None = None
    last_tool_result: Any = None
    last_tool_error: dict[str, Any] | None = None
    wait: dict[str, Any] | None = None


@dataclass
class Resource:
    """Something outside the snapshot the task depends on, with its cleanup policy (R8)."""

    kind: str
    ref: str
    cleanup: str = "on_finish"  # on_finish | on_success | keep
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
    format: int = SNAPSHOT_FORMAT

    @property
    def frame(self) -> Frame:
        return self.stack[-1]

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
    during a rolling deploy; refusing leaves it for an up-to-date worker.
    """
    if not isinstance(raw, dict):
        raise ValueError("snapshot head is not a JSON object")
    fmt = raw.get("format")
    if isinstance(fmt, int) and fmt > SNAPSHOT_FORMAT:
        raise SnapshotTooNew(f"task {task_id} version {version}: snapshot format {fmt} is newer"
                             f" than this tether understands ({SNAPSHOT_FORMAT}); upgrade the worker")
    if not isinstance(fmt, int) or fmt < 1:
        raise ValueError(f"unknown snapshot format {fmt!r}")
    upgrade(raw, SNAPSHOT_FORMAT)
    unknown = set(raw) - _FIELDS[Snapshot]
    for frame in raw.get("stack") or []:
        unknown |= set(frame) - _FIELDS[Frame] if isinstance(frame, dict) else set()
    for name, cls in (("call", CallState), ("recovery", RecoveryState)):
        if isinstance(raw.get(name), dict):
            unknown |= set(raw[name]) - _FIELDS[cls]
    if unknown:
        raise SnapshotTooNew(f"task {task_id} version {version}: snapshot has fields this tether"
                             f" does not know ({', '.join(sorted(unknown))}); upgrade the worker")


def _snapshot_from_dict(raw: dict[str, Any]) -> Snapshot:
    raw["status"] = Status(raw["status"])
    raw["stack"] = [Frame(**frame) for frame in raw["stack"]]
    raw["call"] = CallState(**raw["call"]) if raw["call"] else None
    raw["resources"] = [Resource(**res) for res in raw["resources"]]
    raw["recovery"] = RecoveryState(**raw["recovery"])
    return Snapshot(**raw)


_FIELDS: dict[type[Any], set[str]] = {
    cls: {f.name for f in dataclasses.fields(cls)}
    for cls in (Snapshot, Frame, CallState, RecoveryState)
}


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


@dataclass(frozen=True)
class IdempotencyRecord:
    """What is known of one tool call's outcome, and which call it was (R10, E3)."""

    key: str
    task_id: str
    tool: str
    args_hash: str
    status: str  # started | succeeded | failed
    result: Any = None
    error: str | None = None
    attempts: int = 0
    updated_at: float = 0.0

"""Agents propose; the harness disposes (R17).

An agent is any object with an async ``plan`` that looks at a read-only
:class:`TaskView` and returns one action. It never touches the store, the
inbox or the task's status: those belong to the runner. The one thing it may
change is the current frame's ``scratch`` dict, which is saved with the step.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, overload

from tether.model import Action, Event, Frame, Snapshot

if TYPE_CHECKING:
    from tether.tools import Tool


@dataclass(frozen=True)
class Fallback:
    """What an agent does while degraded. The default changes nothing but ``task.degraded``."""

    options: Mapping[str, Any] = field(default_factory=dict)
    tools: frozenset[str] | None = None
    """Tools still allowed while degraded; None allows every tool."""
    pause: bool = False
    """Pause (and ask a person) for as long as the degradation lasts."""


class HistoryView(Sequence[Mapping[str, Any]]):
    """The full dialog, read-only (entries are mapping proxies), without copying it every step."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self._entries = entries

    @overload
    def __getitem__(self, index: int) -> Mapping[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Mapping[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> Mapping[str, Any] | Sequence[Mapping[str, Any]]:
        if isinstance(index, slice):
            return [MappingProxyType(e) for e in self._entries[index]]
        return MappingProxyType(self._entries[index])

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        return (MappingProxyType(e) for e in self._entries)

    def position(self) -> DialogPosition:
        """Where the dialog stands now, for :meth:`since`."""
        return DialogPosition(len(self._entries), self._entries[-1] if self._entries else None)

    def since(self, position: DialogPosition) -> Sequence[Mapping[str, Any]] | None:
        """The rows added after *position*, or None if the dialog is not the one it was taken
        from (a load, a rollback or a fork: the rows before it are other objects now). A
        framework adapter keeps its history in memory and decodes only these (R17)."""
        n, last = position
        if n > len(self._entries) or (n and self._entries[n - 1] is not last):
            return None
        return self[n:]


class DialogPosition(NamedTuple):
    """A dialog's length and its last row (the object itself: rows are appended, never
    rewritten, so the same object at the same place means the same rows before it)."""

    length: int
    last: object


class TaskView:
    """What an agent sees of its task. Only ``scratch`` may be changed."""

    def __init__(self, snapshot: Snapshot, history: list[dict[str, Any]], scratch: dict[str, Any],
                 frame: Frame | None = None):
        self._snapshot = snapshot
        self._frame: Frame = frame or snapshot.frame
        self.scratch = scratch
        self.history = HistoryView(history)
        self.completions: list[dict[str, Any]] = []
        """Completions recorded during this plan, for the runner to write."""

    @property
    def task_id(self) -> str:
        return self._snapshot.task_id

    @property
    def input(self) -> Any:
        """This frame's input: the task input at the root, the Spawn input in a subtask (a copy)."""
        return copy.deepcopy(self._frame.input)

    @property
    def step(self) -> int:
        return self._snapshot.step

    @property
    def depth(self) -> int:
        """0 at the root frame, 1 in its subtask, and so on (R9)."""
        return len(self._snapshot.stack) - 1

    @property
    def stack(self) -> tuple[str, ...]:
        """Agent names from the root frame to this one."""
        return tuple(frame.agent for frame in self._snapshot.stack)

    @property
    def child_result(self) -> Any:
        """What the last finished subtask of this frame returned (a copy)."""
        return copy.deepcopy(self._frame.child_result)

    @property
    def child_error(self) -> str | None:
        return self._frame.child_error

    @property
    def last_tool_result(self) -> Any:
        """The result of this frame's last tool call (a copy)."""
        return copy.deepcopy(self._frame.last_tool_result)

    @property
    def last_tool_error(self) -> Mapping[str, Any] | None:
        """The failure of this frame's last tool call, if the agent chose to handle it."""
        return self._frame.last_tool_error

    @property
    def last_event(self) -> Mapping[str, Any] | None:
        """The event that ended the last ``Wait`` (``{"timeout": True}`` if none came)."""
        return self._frame.last_event

    @property
    def degraded(self) -> Mapping[str, Any] | None:
        """The degradation in force (the task's own ``degrade`` event, else the worker's), or
        None; while set, the agent runs its :class:`~tether.agent.Fallback` (R3)."""
        snap = self._snapshot
        mode = snap.degraded or snap.worker_degraded
        return MappingProxyType(mode) if mode is not None else None

    @property
    def usage(self) -> Mapping[str, int]:
        """What the task's model calls have cost so far (completions, prompt_tokens,
        completion_tokens), including completions recorded during this plan."""
        usage = dict(self._snapshot.usage)
        for record in self.completions:
            for name, value in completion_usage(record).items():
                usage[name] = usage.get(name, 0) + value
        return MappingProxyType(usage)

    def record_completion(self, model: str, *, usage: Mapping[str, int] | None = None,
                          finish_reason: str | None = None, seconds: float = 0.0,
                          rejected: Sequence[Mapping[str, Any]] = (),
                          text: str | None = None,
                          messages: Sequence[Mapping[str, Any]] = ()) -> None:
        """Record one model completion this plan paid for, even if the plan then fails: the
        runner adds it to the dialog (a ``model`` row) and to the task's usage, which
        ``show``, the bundle and ``/metrics`` report, and which bounds a looping model.
        *rejected* lists tool calls the answer asked for that could not be made (each with
        ``name``, ``arguments`` and ``error``), so the next prompt can say what was wrong;
        *text* is what the answer said beside them when nothing else of it is kept;
        *messages* are the provider-format messages the completion added, as plain data (a
        framework's history, rebuilt from these rows on resume)."""
        record: dict[str, Any] = {"model": model, "finish_reason": finish_reason,
                                  "seconds": round(seconds, 3),
                                  "usage": {k: int(v) for k, v in (usage or {}).items()}}
        if rejected:
            record["rejected"] = [dict(call) for call in rejected]
        if text:
            record["text"] = text
        if messages:
            record["messages"] = [dict(message) for message in messages]
        self.completions.append(record)

    @property
    def signals(self) -> Mapping[str, Any]:
        """The newest payload of each P3/P4 event type (progress and the like)."""
        return MappingProxyType(self._snapshot.signals)


def completion_usage(record: Mapping[str, Any]) -> dict[str, int]:
    """What one completion record adds to a task's usage."""
    tokens = record.get("usage") or {}
    return {"completions": 1, "prompt_tokens": int(tokens.get("prompt_tokens", 0)),
            "completion_tokens": int(tokens.get("completion_tokens", 0))}


def completion_summary(record: Mapping[str, Any]) -> str:
    """A ``model`` dialog row in one line, for people: how it ended and what it cost."""
    tokens = record.get("usage") or {}
    rejected = f", {len(record['rejected'])} calls rejected" if record.get("rejected") else ""
    return (f"{record.get('model')}: {record.get('finish_reason') or 'no finish reason'},"
            f" {tokens.get('prompt_tokens', 0)}+{tokens.get('completion_tokens', 0)} tokens,"
            f" {record.get('seconds', 0)}s{rejected}")


class CutOff(Exception):
    """Raised by ``plan()`` when a P0 cancelled it mid-answer, carrying what was said so far;
    the runner keeps that text in the dialog, marked ``cut_off`` (E1)."""

    def __init__(self, partial: str) -> None:
        super().__init__(partial)
        self.partial = partial


class Agent:
    """Base class for agents. Override :meth:`plan`; the other hooks are optional."""

    commit_plans: bool = False
    """Commit each planned action at once, before acting on it: for an agent whose plan
    costs money (a model completion), so a crash never pays for the same plan twice."""

    limits: tuple[str, ...] = ()
    """Named limits (``Harness.limit``) each plan is admitted under: for an agent whose plan
    calls a model provider that limits how often and how much."""
    task_limits: tuple[str, ...] = ()
    """Named limits a task of this agent holds while a worker runs it (not while it waits
    or is parked): "2 tasks per tenant at once", with a limit keyed by the tenant."""

    input_required: bool = False
    """A task of this agent needs an input (a prompt, a batch): ``submit`` without one is
    refused at once, rather than failing later in the agent's first plan."""
    name: str = ""
    version: str = "1"
    """This agent's code version, recorded with every step it plans (E8): bump it on deploys
    that change what ``plan`` does, and the dialog shows which code planned which step."""
    fallback: Fallback = Fallback()
    """What this agent does while degraded (R3): options, allowed tools, or pause."""

    def own_tools(self) -> Sequence[Tool]:
        """Tools this agent brings with it (a framework agent's own tools, wrapped as tether
        tools): ``Harness.add_agent`` registers them once the agent has its name."""
        return ()

    async def plan(self, task: TaskView) -> Action | Sequence[Action]:
        """Return the next action for this frame, or the actions of one answer (a model's
        several tool calls). The engine holds an answer's actions in the snapshot and runs
        them in order without asking again; a newer message that arrives before one starts
        sets the rest aside (each call is answered "not run") and the agent plans again."""
        raise NotImplementedError(f"agent {type(self).__name__} must implement plan()")

    async def prepare(self, task: TaskView, action: Action) -> Action:
        """An action of an answer, just before it runs: return it as it should run now (an
        action of the same kind). Override to put what happened since the answer into it (a
        person's approval); the engine records the returned action before running it."""
        return action

    async def on_event(self, task: TaskView, event: Event) -> Action | None:
        """React to an event (a user interrupt, a failed tool call); None takes the default.

        The default for a P0 interrupt is to pause; for a tool that gave up, to
        start a bounded recovery. An action returned here runs before the
        frame's own planned work, which is kept (the to-do list survives).
        """
        return None

    async def check_wait(self, task: TaskView, wait: Mapping[str, Any]) -> Any | None:
        """Asked when a waiting task is loaded again: has the outside world moved on? (R16)

        Return the payload of the awaited event if it already happened (say, the
        approval system shows an approval that was never delivered), else None.
        """
        return None

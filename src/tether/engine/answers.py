"""An answer is the engine's: the actions of one plan, held on the agenda until each runs.

A model answers with several calls at once (``lookup`` then ``refund``). The engine keeps
the ones not yet run on the frame's agenda, in the snapshot, not in the agent's scratch, so
what a user says meanwhile reaches the model before the rest of the answer runs: when a
newer message arrives (an event type the interruption protocol marks ``supersedes``: a user
message, an amendment; or a ``Replan``; or a person's resume with a message), every action
recorded but not started is set aside. Each call set aside is answered with one tool result,
"not run: a newer message arrived before it", so every provider's protocol holds (a call
the model made is always answered), and the agent plans again with the message.

A call already open (running, in doubt, waiting out a retry, or put aside by an
interjection) keeps its key and its place: it has started, and only its own recovery may
settle it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tether import dialog
from tether.engine.task import RunningTask
from tether.errors import InvalidInput
from tether.model import (
    Action,
    AgendaEntry,
    CancelSubtask,
    Frame,
    Replan,
    Reply,
    Status,
    ToolCall,
)

NOT_RUN = "not run: a newer message arrived before it"
"""The tool result a call set aside gets; the model reads it and plans again."""


def set_aside(task: RunningTask, because: int | None, frames: list[Frame] | None = None,
              why: str = NOT_RUN) -> list[str]:
    """Set aside the actions of *frames* (every frame of the stack) that were recorded but not
    started; returns their kinds, for the recovery log. *because* (the event's id) names the
    answers the not-run calls get, so two set-asides never share one."""
    snap = task.snap
    dropped: list[str] = []
    for frame in frames if frames is not None else snap.stack:
        first = 1 if frame is snap.frame and snap.call is not None else 0  # the open call
        kept = frame.agenda[:first]
        for entry in frame.agenda[first:]:
            if entry.open_call is not None:
                kept.append(entry)
                continue
            _answer(task, entry, f"not-run:{because}:{len(dropped)}", why)
            dropped.append(entry.kind)
        frame.agenda[:] = kept
        if dropped and frame is snap.frame and frame.wait is not None and not kept:
            frame.wait = None  # a wait the answer armed (an approval) is moot with its calls
            if snap.status is Status.WAITING:
                task.set_status(Status.RUNNING)
    return dropped


def _answer(task: RunningTask, entry: AgendaEntry, key: str, why: str) -> None:
    """What the dialog keeps of an action set aside: a call and its "not run" result; the
    text of a reply the model wrote; nothing for a wait or an end."""
    action = entry.to_action()
    by = {"planned_by": entry.planned_by} if entry.planned_by else {}
    if isinstance(action, ToolCall):
        task.append_history(dialog.call(action.name, action.args, key, not_run=True, **by))
        task.append_history(dialog.result(action.name, key, None, error=why, not_run=True))
    elif isinstance(action, Reply):
        task.append_history({**dialog.reply(action.text), **by})


MAX_ACTIONS = 100
"""The most actions one answer may hold (a model asking for more is looping)."""


def planned_actions(agent: str, answer: Action | Sequence[Action]) -> list[Action]:
    """What a plan returned, as the list of actions of one answer; InvalidInput naming the
    agent for anything else (an empty answer, an event handler's action, not an action)."""
    actions = [answer] if isinstance(answer, Action) else list(answer) \
        if isinstance(answer, list | tuple) else None
    if actions is None or not actions:
        raise InvalidInput(f"agent {agent!r}: plan() must return an action or a non-empty list"
                           f" of actions, not {_shown(answer)}")
    if len(actions) > MAX_ACTIONS:
        raise InvalidInput(f"agent {agent!r}: plan() returned {len(actions)} actions in one"
                           f" answer; at most {MAX_ACTIONS} are taken")
    for action in actions:
        if not isinstance(action, Action) or isinstance(action, Replan | CancelSubtask):
            raise InvalidInput(f"agent {agent!r}: plan() returned {_shown(action)}, which is"
                               " not an action it may plan" + (
                                   " (only on_event may return it)"
                                   if isinstance(action, Replan | CancelSubtask) else ""))
    return actions


def _shown(value: object) -> str:
    return type(value).__name__ if not isinstance(value, list | tuple) or value else "[]"

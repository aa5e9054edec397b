"""The interruption protocol: which events interrupt, which wait, which never disturb (R4, R24).

One table maps every event type to a priority and a coalescing class. The
runner reads only this table to decide how an event is treated, so changing
how the system reacts to, say, a degrade signal is a one-line change here or
in the ``protocol=`` argument of :class:`tether.Harness`, never a hunt through
handlers.

Treatment by priority:

====  ==========================================================================
P0    preempt: cancels an in-flight plan (model call) or interruptible tool at
      once; a side-effecting tool is let finish and its result recorded first
      (E1). Unhandled by the agent, the task pauses.
P1    applied as soon as the current tool call returns.
P2    drives retry or compensation of the failing call.
P3    recorded in the task's signals; never disturbs the flow.
P4    same as P3, lowest priority; first to be refused under backpressure.
====  ==========================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tether.errors import ConfigurationError, UnknownEventType
from tether.model import Priority


@dataclass(frozen=True)
class Rule:
    """How one event type is treated."""

    priority: Priority
    coalesce: str | None = None
    """Events of one task sharing a class inside the window collapse to the newest (R6, E2)."""
    supersedes: bool = False
    """A newer message: the calls of an answer not started yet when it arrives are not run
    (each is answered "not run") and the agent plans again with it
    (:mod:`tether.engine.answers`)."""


CONTROL_EVENTS = frozenset({"cancel", "resume", "rollback", "decide"})
"""Events the harness itself acts on; agents see them only through their effects."""

RESERVED_EVENTS = CONTROL_EVENTS | {"task_timeout", "timer"}
"""Levers and the harness's own timers. Only the operator levers (the Harness methods, the
CLI, the console, the API's dedicated routes) and the task's own loop may store them:
``Harness.emit``, webhooks, the Redis Streams intake and the API's generic events route
refuse them, so a caller that may send a message cannot cancel, resume, roll back or time
out a task."""

DEFAULT_RULES: Mapping[str, Rule] = {
    "user_interrupt": Rule(Priority.P0),
    "cancel": Rule(Priority.P0),
    "resume": Rule(Priority.P0),  # carries a person's message: never coalesced (E2)
    "rollback": Rule(Priority.P0),
    "decide": Rule(Priority.P0),  # a person's word on a call in doubt: never coalesced
    "user_message": Rule(Priority.P1, supersedes=True),
    "follow_up": Rule(Priority.P1, supersedes=True),
    "amend": Rule(Priority.P1, supersedes=True),
    "approval": Rule(Priority.P1),
    "tool_result": Rule(Priority.P1),  # the result of a call a tool deferred (run elsewhere)
    "webhook": Rule(Priority.P1),
    "upstream_ready": Rule(Priority.P1),
    "subtask_done": Rule(Priority.P1),
    "timer": Rule(Priority.P1, coalesce="timer"),
    "task_timeout": Rule(Priority.P0),
    "tool_timeout": Rule(Priority.P2, coalesce="call_recovery"),
    "tool_error": Rule(Priority.P2, coalesce="call_recovery"),
    "retry": Rule(Priority.P2, coalesce="call_recovery"),
    # E2: a degrade signal arriving with a timeout and a retry for the same call is one
    # recovery instruction; applying a degrade also brings a pending retry forward.
    "degrade": Rule(Priority.P2, coalesce="call_recovery"),
    "recover": Rule(Priority.P2, coalesce="recover"),
    "model_error": Rule(Priority.P2, coalesce="model_recovery"),
    "progress": Rule(Priority.P3, coalesce="progress"),
    "state_change": Rule(Priority.P3, coalesce="state_change"),
    "heartbeat": Rule(Priority.P4, coalesce="heartbeat"),
}


class InterruptionProtocol:
    """The one place that says how each event type is treated."""

    def __init__(self, overrides: Mapping[str, Rule | Priority | int] | None = None) -> None:
        self._rules: dict[str, Rule] = dict(DEFAULT_RULES)
        for event_type, rule in (overrides or {}).items():
            self._rules[event_type] = _as_rule(event_type, rule, self._rules.get(event_type))

    def rule_for(self, event_type: str, priority: Priority | int | None = None) -> Rule:
        """The rule for an event, with an explicit priority overriding the table's."""
        known = self._rules.get(event_type)
        if priority is not None:
            explicit = _as_priority(event_type, priority)
            return Rule(explicit, known.coalesce if known else None,
                        known.supersedes if known else False)
        if known is None:
            raise UnknownEventType(
                f"event type {event_type!r} is not in the interruption protocol; "
                f"pass priority= or add it to the protocol (known: {', '.join(sorted(self._rules))})"
            )
        return known

    def supersedes(self, event_type: str) -> bool:
        """Whether an event of this type sets aside the rest of the answer being carried out."""
        known = self._rules.get(event_type)
        return known is not None and known.supersedes

    def table(self) -> dict[str, Rule]:
        """A copy of the whole table, for docs and the CLI."""
        return dict(self._rules)


def _as_priority(event_type: str, value: Priority | int) -> Priority:
    try:
        return Priority(int(value))
    except ValueError:
        raise ConfigurationError(
            f"event type {event_type!r}: priority must be 0-4 (P0-P4), got {value!r}"
        ) from None


def _as_rule(event_type: str, rule: Rule | Priority | int, default: Rule | None) -> Rule:
    """A full Rule replaces the default; a bare priority keeps the default's coalescing class
    and whether it supersedes an answer."""
    if isinstance(rule, Rule):
        return Rule(_as_priority(event_type, rule.priority), rule.coalesce, rule.supersedes)
    return Rule(_as_priority(event_type, rule), default.coalesce if default else None,
                default.supersedes if default else False)

"""What a person may say about a call whose outcome is unknown (R10, R26).

A side-effecting call that was sent and never answered (a crash, a lost reply) and
that no reconcile hook can settle is never run again on a plain resume. A person
decides: it happened (with its result), it did not (run it now, same key), or skip
it. This module says when that decision is needed and what the refusal tells them;
``levers.human_decide`` applies it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from tether.model import CallState, CallStatus, Snapshot
from tether.tools import Tool


class Decision(enum.StrEnum):
    """What a person may say about a call whose outcome is unknown."""

    HAPPENED = "happened"
    """Its result is recorded as the call's; it is not run again."""
    NOT_HAPPENED = "not_happened"
    """It runs now, with the same idempotency key."""
    SKIP = "skip"
    """It is dropped; the agent sees it was skipped."""


DECISIONS = tuple(decision.value for decision in Decision)
"""The decisions' names, in the order they are offered (for choices and messages)."""


def call_awaiting_decision(snap: Snapshot, tools: Mapping[str, Tool]) -> CallState | None:
    """The call in doubt that only a person can settle, if any.

    In doubt means started with no known outcome. A tool that is idempotent or has a
    reconcile hook settles itself; any other (or one no longer registered here) must not
    run again until a person says what happened.
    """
    call = snap.call
    if call is None or call.status != CallStatus.STARTED:
        return None
    tool = tools.get(call.tool)
    if tool is not None and (tool.idempotent or tool.reconcile_fn is not None):
        return None
    return call


def in_doubt_message(task_id: str, call: CallState) -> str:
    """Why a plain resume is refused, and the three things a person can say instead."""
    return (f"task {task_id}: the outcome of {call.tool}({args_text(call)}) key={call.key} is"
            " unknown, so a plain resume could repeat it. Say what happened instead:"
            " 'happened' (give its result; it is not run again), 'not_happened' (it runs now"
            " with the same idempotency key) or 'skip' (it is dropped). Python:"
            f" harness.decide({task_id!r}, 'happened', result=...); CLI: tether decide"
            f" {task_id} happened --result JSON; API: POST /api/tasks/{task_id}/decide;"
            " or the console's task page.")


def args_text(call: CallState) -> str:
    """A call's arguments as one short line, for messages."""
    return ", ".join(f"{k}={v!r}" for k, v in call.args.items())[:200]

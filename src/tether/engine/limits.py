"""What a task spends, and the bounds that stop a runaway agent before it spends more (R10, R12).

A model that loops is the costly failure of agents in production: one run paid 115 refunds,
each under its own idempotency key because the model asked for it each time, and a small
model asked for ``refund(A1, 5)`` again in its very next answer. Besides the step limit
(``recovery.over_step_limit``) two bounds hold, each a setting: the model completions a
task pays for (``max_completions``; a person's resume grants the same budget again), and
how often one side-effecting call, the same tool with the same arguments, may succeed in a
task (``max_identical_side_effects``, 1 by default): the next identical call is held for a
person before it runs, naming the earlier call. A tool registered ``repeatable=True`` is
never held for it. A person may run the held call (a plain resume), have the agent plan
again (a resume with a message) or answer it with the earlier call's result without running
it (:func:`answer_with_earlier`).

The completions an agent records while planning (``TaskView.record_completion``) are
written here, by the runner: a ``model`` row in the dialog and the task's usage totals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tether import dialog
from tether.agent import TaskView, completion_usage
from tether.engine.task import RunningTask, hand_to_person
from tether.errors import IllegalTransition
from tether.model import CallState, CallStatus, OutcomeStatus, Snapshot, Status
from tether.strategies import Strategy
from tether.tools import CALL_IDS, args_hash, what_it_does

HELD_ANSWERS = ("Resume the task to run it again, resume it with the earlier result"
                " (--earlier-result) to answer it without running it, or resume it with a"
                " message to have the agent plan again without it")
"""What a person may do about a held repeat, as its reason says."""

SIDE_EFFECTS_KEPT = 256
"""Distinct side-effecting calls remembered per task; the oldest are forgotten beyond it, so
the head stays small in a long task (a loop repeats recent calls)."""


def record_completions(task: RunningTask, view: TaskView) -> None:
    """Write the completions a plan paid for: dialog rows and usage totals."""
    usage = task.snap.usage
    for record in view.completions:
        for name, value in completion_usage(record).items():
            usage[name] = usage.get(name, 0) + value
            task.counters[f"model_{name}"] += value  # this process's, for /metrics
        task.append_history(dialog.completion(record))
    view.completions.clear()


def tokens_of(view: TaskView) -> int:
    """The tokens the completions a plan recorded used (prompt and completion)."""
    return sum(usage["prompt_tokens"] + usage["completion_tokens"]
               for usage in map(completion_usage, view.completions))


def over_completion_limit(task: RunningTask) -> bool:
    """Whether the task has paid for its budget of completions; if so it goes to a person."""
    usage = task.snap.usage
    used = usage.get("completions", 0) - usage.get("budget_start", 0)
    limit = task.settings.max_completions
    if used < limit:
        return False
    hand_to_person(task, f"the task paid for {used} model completions, its limit"
                         f" (max_completions={limit}); look at what it is doing, then resume it"
                         f" for {limit} more", strategy=Strategy.COMPLETION_LIMIT)
    return True


# ---------------------------------------------------------------------- the same side effect twice


def identity(tool: str, args: Mapping[str, Any]) -> str:
    """What a call does, as the repeat bound compares calls: the tool and its arguments,
    without the model's call id that a framework integration adds (PydanticAI's
    ``tool_call_id``, the Agents SDK's and LangChain's ``call_id``, see
    :data:`~tether.tools.CALL_IDS` and :data:`FRAMEWORK_CALL`), and
    with the Agents SDK's JSON text of the arguments read as JSON (the same arguments written
    with other spacing or key order are the same call). A tool of the app's own whose
    argument happens to be called ``call_id`` (a phone call's id) keeps it: there it is what
    the call does."""
    return f"{tool}:{args_hash(tool, _what(args))[:16]}"


FRAMEWORK_CALL = frozenset({"tool_call_id", "call_id", "interrupt_id", "args", "arguments", "approval",
                            "tool"})
"""The arguments of a framework's tool as tether's integrations call it: the model's call id
(PydanticAI's ``tool_call_id``, the Agents SDK's and LangChain's ``call_id``, the LangGraph
``interrupt()`` a graph's call waits in, ``interrupt_id``), the model's
arguments (``args``, or the Agents SDK's JSON text ``arguments``) and what tether adds."""


def _what(args: Mapping[str, Any]) -> dict[str, Any]:
    keys = set(args)
    if not (keys & CALL_IDS and keys & {"args", "arguments"} and keys <= FRAMEWORK_CALL):
        return dict(args)
    what = what_it_does(dict(args))
    text = what.get("arguments")
    if isinstance(text, str):
        with contextlib.suppress(orjson.JSONDecodeError):  # kept as text: still compared
            what["arguments"] = orjson.loads(text)
    return what


def summary(args: Mapping[str, Any]) -> str:
    """A call's arguments as one short line, as the model meant them (a framework's call id
    left out, its wrapped arguments shown as they are)."""
    what: Mapping[str, Any] = _what(args)
    for wrapper in ("args", "arguments"):  # PydanticAI's and the Agents SDK's calls
        inner = what.get(wrapper)
        if set(what) == {wrapper} and isinstance(inner, Mapping):
            what = inner
    return ", ".join(f"{k}={v!r}" for k, v in what.items())[:200]


def _counted(task: RunningTask, call: CallState) -> bool:
    tool = task.tools.get(call.tool)
    return tool is not None and tool.side_effect and not tool.repeatable


def count_success(task: RunningTask, call: CallState) -> None:
    """A call's result is recorded (it ran, its hook or a person said it happened, or its
    record answered it): one more success of what it does, if its tool is a side effect that
    is not repeatable. A failed attempt is never counted (retried under its key, it is the
    same call), nor is a call that never started."""
    if not _counted(task, call):
        return
    seen = task.snap.side_effects
    key = identity(call.tool, call.args)
    seen[key] = seen.pop(key, 0) + 1  # re-inserted: the newest calls are kept
    while len(seen) > SIDE_EFFECTS_KEPT:
        del seen[next(iter(seen))]


async def repeated_side_effect(task: RunningTask, call: CallState) -> bool:
    """Whether a newly planned side-effecting call must wait for a person before it runs
    (R10, R12): the same tool with the same arguments already succeeded in this task, as
    often as ``max_identical_side_effects`` allows. Then the task is handed to a person
    naming the call, its arguments and the earlier call's key, and the call stays open
    (planned, not run): a plain resume runs it, a resume with a message drops it."""
    if not _counted(task, call):
        return False
    limit = task.settings.max_identical_side_effects
    done = task.snap.side_effects.get(identity(call.tool, call.args), 0)
    if done < limit:
        return False
    earlier = earlier_success(await task.history.rows(), call)
    which = f"call {earlier.key}" if earlier is not None else "an earlier call"
    hand_to_person(task, f"the agent asked for {call.tool} with the same arguments a"
                         f" {_ordinal(done + 1)} time ({summary(call.args)}); {which} already"
                         f" succeeded in this task (max_identical_side_effects={limit}), so"
                         f" this one is held for a person and did not run (key={call.key})."
                         f" {HELD_ANSWERS}", strategy=Strategy.REPEATED_SIDE_EFFECT)
    return True


@dataclass(frozen=True)
class Earlier:
    """The latest earlier call identical to an open one that succeeded: its key and result."""

    key: str
    result: Any


def earlier_success(history: Sequence[Mapping[str, Any]], call: CallState) -> Earlier | None:
    """The newest call in the dialog, before *call*, that did what *call* does (same tool,
    same arguments, call ids aside) and succeeded; None if none did on this branch."""
    want = identity(call.tool, call.args)
    results: dict[str, Any] = {}
    for stored in reversed(history):
        row = dialog.read(stored)
        if isinstance(row, dialog.ResultRow):
            if row.error is None and not row.skipped and not row.not_run:
                results.setdefault(row.key, row.content)
        elif isinstance(row, dialog.CallRow) and row.key != call.key and row.key in results \
                and row.name == call.tool and isinstance(row.args, Mapping) \
                and identity(call.tool, row.args) == want:
            return Earlier(row.key, results[row.key])
    return None


def held_repeat(snap: Snapshot, history: Sequence[Mapping[str, Any]]) -> Earlier | None:
    """The earlier identical call whose result could answer the task's held repeat, or None
    if the task is not parked on a call that has not run with such an earlier success: what
    a lever process checks before offering (and sending) "answer with the earlier result"."""
    call = snap.call
    if snap.status is not Status.NEEDS_HUMAN or call is None \
            or call.status not in (CallStatus.PLANNED, CallStatus.FAILED):
        return None
    return earlier_success(history, call)


async def answer_with_earlier(task: RunningTask, by: str, event_id: int | None = None) -> Earlier:
    """A person's answer to a held repeat: the agent gets the result of the earlier identical
    call, and the held call does not run (R10, R26).

    The open call is answered as if it had returned that result: its own key records it (so
    a rollback over it answers from the record, E4), the dialog shows the call with
    ``answered_from`` naming the earlier key and who said so, and the recovery log says what
    was done. A framework's own answer to the earlier call (PydanticAI's parts, an Agents SDK
    ``function_call_output``) names that call's id; the value it carries answers the new one.
    It does not count as another success (nothing ran). Checked before anything changes:
    :class:`IllegalTransition` when the task has no open call that has not run, or no
    earlier identical call succeeded in its dialog, or its result cannot answer this call.
    """
    snap = task.snap
    call = snap.call
    if call is None or call.status not in (CallStatus.PLANNED, CallStatus.FAILED):
        state = "no open call" if call is None else \
            f"call {call.tool} key={call.key} is {call.status.value}"
        raise IllegalTransition(f"task {snap.task_id}: there is no held call to answer with an"
                                f" earlier result ({state})")
    earlier = earlier_success(await task.history.rows(), call)
    if earlier is None:
        raise IllegalTransition(f"task {snap.task_id}: no earlier call of {call.tool} with the"
                                f" same arguments ({summary(call.args)}) succeeded in this task,"
                                " so there is no result to answer it with; resume it to run it")
    record = await task.reads.get_idempotency(earlier.key)
    value = record.result if record is not None and record.status == OutcomeStatus.SUCCEEDED \
        else earlier.result
    answer = _plain_answer(value)
    if answer is None:
        raise IllegalTransition(f"task {snap.task_id}: the result of {earlier.key} is its"
                                f" framework's answer to that call, holding no single value"
                                f" that can answer {call.key}; resume the task to run it, or"
                                " with a message")
    earlier = Earlier(earlier.key, answer[0])
    seen = snap.side_effects
    before = seen.get(identity(call.tool, call.args))
    task.append_history(dialog.call(call.tool, call.args, call.key, answered_from=earlier.key,
                                    by=by))
    task.log_recovery(Strategy.REUSE_RESULT, event_id,
                      f"{by} answered {call.tool} key={call.key} with the result of the earlier"
                      f" identical call {earlier.key}; it did not run")
    task.mark_progress()
    task.finish_call(call, earlier.result)
    if before is not None:  # nothing ran: the count stays what it was
        seen[identity(call.tool, call.args)] = before
    return earlier


def _plain_answer(value: Any) -> tuple[Any] | None:
    """The value a recorded result holds, free of the earlier call's id: a PydanticAI tool
    return's content, an Agents SDK output's text, else the value itself (in a 1-tuple);
    None when it is a framework's answer with no single value."""
    if isinstance(value, list) and value and all(
            isinstance(part, Mapping) and "part_kind" in part for part in value):
        returns = [part for part in value if part.get("part_kind") == "tool-return"]
        return (returns[0].get("content"),) if len(returns) == 1 == len(value) else None
    if isinstance(value, Mapping) and value.get("type") == "function_call_output":
        return (value.get("output"),)
    return (value,)


def grant_again(snap: Snapshot) -> None:
    """A person's resume: the same budget of completions again. Calls that succeeded stay
    counted (a resume for another reason does not make a refund already paid payable
    again); a held repeat the resume lets run is not asked about again."""
    snap.usage["budget_start"] = snap.usage.get("completions", 0)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"

"""A tool call from its key to its result (R10, R22, R26).

Everything that decides about one call lives here: opening it at its resume point against
the idempotency table (a call already made is answered from its record, a different call
under a used key gets its own, E3), what a failed attempt means (retry with backoff, the
agent's compensation, a person), a call whose outcome is unknown (re-run if idempotent,
the tool's reconcile hook, else a person), and what a person may say about such a call
(:class:`Decision`). The runner runs the call and commits; these functions decide, on the
:class:`~tether.engine.task.RunningTask`.
"""

from __future__ import annotations

import enum
import hashlib
import json
import time
from collections.abc import Mapping
from typing import Any

from tether import dialog
from tether.engine import budget, limits
from tether.engine.task import RunningTask, TaskReads, hand_to_person
from tether.errors import InvalidInput, StaleDecision
from tether.model import (
    CallState,
    CallStatus,
    CancelSubtask,
    Declaration,
    Event,
    IdempotencyRecord,
    OutcomeStatus,
    Replan,
    Snapshot,
    Status,
    TaskRecord,
    ToolCall,
    to_plain,
)
from tether.strategies import Strategy
from tether.tools import (
    Tool,
    ToolContext,
    args_hash,
    describe_error,
    failure_fingerprint,
    idempotency_key,
    traceback_text,
)

# ---------------------------------------------------------------------- decisions


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


def declaration_of(tool: Tool) -> Declaration:
    """What *tool* declares about itself, as a call records it at its resume point."""
    return Declaration(side_effect=tool.side_effect, idempotent=tool.idempotent,
                       reconciles=tool.reconcile_fn is not None)


def code_differs(call: CallState, tools: Mapping[str, Tool]) -> str | None:
    """Why this process's code must not judge *call*, or None if it may.

    The call's own record of what its tool declared is the truth about it; a tool of the
    same name here that declares otherwise (another app's, or one changed since) would
    judge it by the wrong rules (run another app's reconcile hook, re-run a call that was
    not idempotent), so it does not.
    """
    tool = tools.get(call.tool)
    if tool is None:
        return f"tool {call.tool!r} is not registered in this process"
    here = declaration_of(tool)
    if call.declared is not None and call.declared != here:
        return (f"tool {call.tool!r} here declares {_declared_text(here)}, but the call was"
                f" made by a tool that declared {_declared_text(call.declared)}")
    return None


def _declared_text(declared: Declaration) -> str:
    kind = "idempotent" if declared.idempotent else \
        "side-effecting" if declared.side_effect else "plain"
    return f"{kind}, {'with' if declared.reconciles else 'without'} a reconcile hook"


def call_awaiting_decision(snap: Snapshot, tools: Mapping[str, Tool]) -> CallState | None:
    """The call in doubt that only a person can settle, if any.

    In doubt means started with no known outcome. A tool that is idempotent or has a
    reconcile hook settles itself; any other (or one no longer registered here) must not
    run again until a person says what happened. What the call recorded of its tool
    decides, so a process without the app's code answers as the app would.
    """
    call = snap.call
    if call is None or call.status != CallStatus.STARTED:
        return None
    if call.declared is not None:
        return None if call.declared.settles_itself() else call
    tool = tools.get(call.tool)
    if tool is not None and (tool.idempotent or tool.reconcile_fn is not None):
        return None
    return call


async def awaiting_decision(reads: TaskReads, snap: Snapshot,
                            tools: Mapping[str, Tool]) -> CallState | None:
    """:func:`call_awaiting_decision`, asking the idempotency table too: a call whose record
    says it succeeded or failed is not in doubt (it is answered from the record)."""
    call = call_awaiting_decision(snap, tools)
    if call is None:
        return None
    return None if settled_by_record(call, await reads.get_idempotency(call.key)) else call


def settled_by_record(call: CallState, record: IdempotencyRecord | None) -> bool:
    """Whether the idempotency table knows how *call* ended (it succeeded or failed), so it is
    answered from the record and not in doubt."""
    return record is not None and record.args_hash == call.args_hash \
        and record.status in (OutcomeStatus.SUCCEEDED, OutcomeStatus.FAILED)


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


# ---------------------------------------------------------------------- opening a call


async def open_call(task: RunningTask, action: ToolCall) -> CallState | None:
    """Create the call's state at its resume point, answering from the idempotency table
    when it already ran (R10) and giving a different call under a used key its own (E3)."""
    frame = task.snap.frame
    args = to_plain(dict(action.args))
    digest = args_hash(action.name, args)
    key = idempotency_key(task.snap.task_id, frame.frame_id, frame.steps, task.snap.key_salt)
    record = await task.reads.get_idempotency(key)
    if record and (record.tool, record.args_hash) != (action.name, digest):
        task.log_recovery(Strategy.IDEMPOTENCY_MISMATCH, detail=(
            f"key {key} was used by {record.tool} with other arguments; this is a different"
            " call, so it gets its own key and is not answered from the record"))
        key = f"{key}:{digest[:12]}"
        record = await task.reads.get_idempotency(key)
    tool = task.tools.get(action.name)
    call = CallState(key=key, tool=action.name, args=args, args_hash=digest,
                     declared=declaration_of(tool) if tool is not None else None)
    task.snap.call = call
    if record and record.status == OutcomeStatus.SUCCEEDED:
        task.log_recovery(Strategy.REUSE_RESULT,
                          detail=f"{action.name} already succeeded under {key}")
        task.append_history(dialog.call(call.tool, call.args, call.key))
        task.finish_call(call, record.result, from_record=True)
        return None
    if record and record.status == OutcomeStatus.STARTED:
        call.status = CallStatus.STARTED
        call.attempt = record.attempts
        await resolve_in_doubt(task)
        return None
    return call


async def resolve_in_doubt(task: RunningTask) -> None:
    """Decide what to do with a call whose outcome a crash left unknown (R10)."""
    call = task.snap.call
    assert call is not None
    record = await task.reads.get_idempotency(call.key)
    same_call = record is not None and record.args_hash == call.args_hash
    if reuse_result(task, call, record, f"{call.tool} finished before the crash"):
        return
    if record and same_call and record.status == OutcomeStatus.FAILED:
        call.status = CallStatus.PLANNED  # its last attempt is known to have failed: safe to run
        task.log_recovery(Strategy.RERUN_FAILED, detail=f"{call.tool} key={call.key} had failed")
        return
    tool = task.tools.get(call.tool)
    if tool is None:
        hand_to_person(task, f"tool {call.tool!r} (call {call.key}) is no longer"
                             " registered, so its in-flight outcome cannot be checked")
        return
    differs = code_differs(call, task.tools)
    if differs is not None:
        hand_to_person(task, f"outcome unknown: call {call.tool}({args_text(call)})"
                             f" key={call.key} is not judged here: {differs}; it was not"
                             " repeated (say what happened with decide)")
        return
    if tool.idempotent:
        call.status = CallStatus.PLANNED
        task.log_recovery(Strategy.RERUN_IDEMPOTENT, detail=f"{call.tool} re-runs with key {call.key}")
        return
    if tool.reconcile_fn is None:
        hand_to_person(task, f"outcome unknown: side-effecting call {call.tool}"
                             f"({args_text(call)}) key={call.key} may or may not have happened"
                             " (a worker died while it ran, or its answer was lost) and the"
                             " tool has no reconcile hook; it was not repeated")
        return
    await _reconcile(task, tool, call)


def reuse_result(task: RunningTask, call: CallState, record: IdempotencyRecord | None,
                  detail: str) -> bool:
    """Answer *call* from the idempotency table if the same call already succeeded."""
    if record is None or record.args_hash != call.args_hash \
            or record.status != OutcomeStatus.SUCCEEDED:
        return False
    task.log_recovery(Strategy.REUSE_RESULT, detail=detail)
    task.finish_call(call, record.result, from_record=True)
    return True


async def _reconcile(task: RunningTask, tool: Tool, call: CallState) -> None:
    assert tool.reconcile_fn is not None
    ctx = ToolContext(task.snap.task_id, tool.name, call.key, call.attempt, task.claim.fence)
    try:
        found = await tool.reconcile_fn(ctx, **call.args)
    except Exception as error:  # the hook itself failing must not crash the worker
        hand_to_person(task, f"reconcile hook of {call.tool} failed for key {call.key}:"
                             f" {describe_error(error)}; the call was not repeated")
        return
    if found is None:
        call.status = CallStatus.PLANNED
        task.log_recovery(Strategy.RECONCILE_NOT_DONE, detail=f"{call.tool} key={call.key} never"
                            " happened; it runs now with the same key")
        return
    try:
        result = to_plain(found, task.settings.max_result_bytes, f"what the reconcile hook of"
                          f" {call.tool} returned")
    except InvalidInput as error:
        hand_to_person(task, f"{error}; the call {call.tool} key={call.key} had happened by its"
                             " hook's word and was not repeated: return plain data from the"
                             " hook, then say what it returned with decide")
        return
    task.log_recovery(Strategy.RECONCILE, detail=f"{call.tool} key={call.key} had happened; its"
                        " result was recovered, not repeated")
    task.finish_call(call, result)


# ---------------------------------------------------------------------- a result


def finish_call(task: RunningTask, call: CallState, result: Any, from_record: bool = False,
                defer: bool = False) -> None:
    """Record a call's result and move on; with *defer*, ride along with the next commit.

    Deferring is only offered for a quick idempotent call: if the process
    dies first, the call runs again with the same key, which costs less than
    the fsync saved (see ``Settings.defer_results_under``).
    """
    frame = task.snap.frame
    if not from_record:
        task.record_idempotency(call, OutcomeStatus.SUCCEEDED, result=result)
    limits.count_success(task, call)  # the same side effect asked for again waits for a person
    task.append_history(dialog.result(call.tool, call.key, result))
    frame.last_tool_result = result
    frame.last_tool_error = None
    frame.agenda.pop(0)
    frame.steps += 1
    task.snap.step += 1
    task.snap.call = None
    budget.progress_made(task)
    if not defer:
        task.request_commit()


# ---------------------------------------------------------------------- failed attempts


async def tool_failed(task: RunningTask, tool: Tool, call: CallState, error: Exception) -> None:
    """A call attempt failed: retry per policy, else let the agent compensate, else recover."""
    fingerprint = failure_fingerprint(tool.name, error)
    call.error = describe_error(error)
    call.status = CallStatus.FAILED
    task.record_idempotency(call, OutcomeStatus.FAILED, error=call.error)
    if tool.retry.should_retry(error, call.attempt):
        call.retry_at = time.time() + tool.retry.delay(call.attempt)
        task.request_commit()
        return
    await _give_up(task, call, fingerprint, traceback_text(error))


async def outcome_unknown(task: RunningTask, tool: Tool, call: CallState, error: Exception) -> None:
    """A side-effecting call timed out or lost its answer: never retried blindly (R10).

    The same path as a crash mid-call: ask the reconcile hook, else a person.
    """
    call.error = describe_error(error)
    task.log_recovery(Strategy.OUTCOME_UNKNOWN, detail=f"{call.tool} key={call.key}: {call.error}")
    await resolve_in_doubt(task)
    if task.snap.call is call and call.status == CallStatus.PLANNED:
        await tool_failed(task, tool, call, error)  # it never happened: an ordinary failure


async def unusable_result(task: RunningTask, tool: Tool, call: CallState, raw: Any,
                          error: Exception) -> None:
    """The tool ran but returned something tether cannot keep (not JSON, or too large):
    record that it ran, then stop.

    Retrying would repeat a side effect that already happened, so the call is recorded as
    succeeded with a short description of the value, and a person is asked to fix the tool.
    """
    marker = {"unusable_result": repr(raw)[:500], "why": str(error)[:500]}
    task.record_idempotency(call, OutcomeStatus.SUCCEEDED, result=marker)
    task.finish_call(call, marker, from_record=True, defer=True)
    hand_to_person(task, f"{error}; the call is recorded as done and was not"
                         f" repeated; make tool {tool.name} return plain data of a bounded size"
                         " (store large data elsewhere and return a reference), then resume")


async def _give_up(task: RunningTask, call: CallState, fingerprint: str, trace: str) -> None:
    snap = task.snap
    frame = snap.frame
    failure = {"tool": call.tool, "key": call.key, "error": call.error,
               "fingerprint": fingerprint, "attempts": call.attempt}
    task.append_history(dialog.error(call.tool, call.key, call.error or "failed", traceback=trace))
    repeat = f"{fingerprint}:{call.args_hash}"
    snap.recovery.given_up[repeat] = snap.recovery.given_up.get(repeat, 0) + 1
    if snap.recovery.given_up[repeat] > 1:
        hand_to_person(task, f"{call.tool} with the same arguments failed the same way"
                             f" again ({call.error}); fingerprint {fingerprint}", traceback=trace)
        return
    event = Event("tool_error", snap.task_id, failure, priority=2)
    scratch = dict(frame.scratch)
    agent = task.agent_for(frame)
    action = await agent.on_event(await task.view(scratch), event)
    if isinstance(action, CancelSubtask):  # the failed call's own frame has no subtask
        task.log_recovery(Strategy.CANCEL_SUBTASK_REFUSED, detail=f"agent {agent.name!r}"
                          f" answered {call.tool}'s failure with CancelSubtask, but no"
                          " subtask runs above it; the default recovery goes on")
        action = None
    if action is not None:
        frame.scratch = scratch
        move_past_call(task, failure)
        if isinstance(action, Replan):
            frame.agenda.clear()  # plan again, now knowing the call failed
        else:
            task.put_first(action, agent=agent)
        task.log_recovery(Strategy.SKIP, detail=f"{call.tool} failed for good ({call.error}); the"
                            f" agent chose {type(action).__name__}", traceback=trace)
        task.request_commit()
        return
    _recover_call(task, call, fingerprint, trace)


def _recover_call(task: RunningTask, call: CallState, fingerprint: str, trace: str) -> None:
    delay = budget.next_recovery(task, fingerprint, f"{call.tool}: {call.error}", trace)
    if delay is None:
        return
    call.status = CallStatus.FAILED
    call.attempt = 0
    call.retry_at = time.time() + delay
    task.log_recovery(Strategy.RETRY_BACKOFF, traceback=trace,
                      detail=f"{call.tool} gave up ({call.error}); retrying"
                        f" in {delay:.2f}s, recovery {task.snap.recovery.attempts} of"
                        f" {task.settings.max_recovery_attempts}")
    task.request_commit()


def move_past_call(task: RunningTask, error: dict[str, Any]) -> None:
    """Leave the frame's current call behind without a result: the agent sees *error*."""
    snap = task.snap
    frame = snap.frame
    frame.last_tool_error = error
    frame.agenda.pop(0)
    frame.steps += 1
    snap.step += 1
    snap.call = None


# ---------------------------------------------------------------------- a person's word


def observation(snap: Snapshot) -> dict[str, Any]:
    """What a person's decision is made about: the call in doubt (key and attempt), the
    dialog branch it is on and the task version they saw. A decision carries it, and is
    applied only while the task is still in that state (:func:`decision_applies`)."""
    call = snap.call
    assert call is not None
    return {"key": call.key, "attempt": call.attempt,
            "branch": snap.history_segments[-1][0], "status": snap.status.value}


def etag(record: TaskRecord, version: int, snap: Snapshot) -> str:
    """A short token of what a person is shown of a task: which task (its creation time: one
    deleted and made again under the same id is another), its version, its status, the
    worker running it (if one does), and its open call's key, attempt, status and dialog
    branch. A lever pulled on that view passes it back; it is compared with the store's
    state then, so a decision about a call seen running is not applied to the same call
    after its worker died (same version, no lease), nor to a state moved on since."""
    call = snap.call
    seen = [record.created_at, version, record.status.value, record.runner(),
            snap.history_segments[-1][0] if snap.history_segments else 0,
            None if call is None else [call.key, call.attempt, call.status.value]]
    return hashlib.sha256(json.dumps(seen).encode()).hexdigest()[:16]


def decision_applies(snap: Snapshot, payload: Mapping[str, Any]) -> str | None:
    """Why a decision no longer applies to the task as it is now, or None if it does.

    A decision is about one observation: the call under its key, at its attempt, on the
    dialog branch the person saw. Once the call has run again, been settled, or the task
    was rolled back, the person's answer is about a state that is gone; applying it could
    run again a call that happened since (not_happened) or record a result that is not
    this attempt's (happened)."""
    call, key = snap.call, payload.get("key")
    if snap.status in (Status.COMPLETED, Status.CANCELLED):
        return f"the task is {snap.status.value}"
    if call is None or call.key != key:
        return (f"it was made about call key={key}, which is no longer the task's open call"
                + (f" (now key={call.key})" if call is not None else ""))
    if call.status != CallStatus.STARTED:
        return f"call {call.tool} key={call.key} is no longer in doubt (it is {call.status.value})"
    if payload.get("attempt") != call.attempt:
        return (f"it was made about attempt {payload.get('attempt')} of {call.tool} key={key};"
                f" the call has been attempted again since (attempt {call.attempt} is the one"
                " in doubt now): look at it again and decide anew")
    if payload.get("branch") != snap.history_segments[-1][0]:
        return "the task was rolled back since the decision was made: look at it again"
    return None


async def human_decide(task: RunningTask, event: Event) -> None:
    """A person settles a call in doubt: it happened, it did not, or skip it (R10, R26).

    Applied only to the state it was made about (:func:`decision_applies`); a stale one is
    refused (recorded, never applied). The in-doubt rule holds in every status: a failed
    task whose call is in doubt is settled here, not by a plain resume."""
    snap = task.snap
    payload = event.payload if isinstance(event.payload, dict) else {}
    outcome, by = payload.get("outcome"), str(payload.get("by") or "unknown")
    if outcome not in DECISIONS:
        raise InvalidInput(f"decide needs an outcome of {', '.join(DECISIONS)}, not {outcome!r}")
    stale = decision_applies(snap, payload)
    if stale is not None:
        raise StaleDecision(f"task {snap.task_id}: the decision {outcome!r} by {by} was not"
                            f" applied: {stale}")
    call = snap.call
    assert call is not None
    task.append_history(dialog.decision(event.id, {
        "outcome": outcome, "by": by, "tool": call.tool, "key": call.key,
        "attempt": call.attempt, "result": payload.get("result")}))
    snap.recovery = type(snap.recovery)()
    snap.error = None
    task.mark_progress()
    if snap.status is not Status.RUNNING:
        task.set_status(Status.RUNNING)
    task.log_recovery(Strategy.HUMAN_DECISION, event.id, f"{by} said {call.tool} key={call.key}"
                        f" (attempt {call.attempt}) {_DECIDED[outcome]}")
    if outcome == Decision.HAPPENED:
        task.finish_call(call, to_plain(payload.get("result")))
    elif outcome == Decision.NOT_HAPPENED:
        call.status = CallStatus.PLANNED
    else:
        _skip_call(task, call, by)


_DECIDED = {Decision.HAPPENED: "had happened; its result is recorded and it is not run again",
            Decision.NOT_HAPPENED: "never happened; it runs now with the same key",
            Decision.SKIP: "is to be skipped; it is dropped without running"}


def _skip_call(task: RunningTask, call: CallState, by: str) -> None:
    """Drop a call in doubt: the agent sees it was skipped and plans on from there."""
    task.append_history(dialog.result(call.tool, call.key, None, skipped=True))
    task.snap.frame.last_tool_result = None
    move_past_call(task, {"tool": call.tool, "key": call.key, "skipped": True, "by": by})

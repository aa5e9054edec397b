"""Recovery: what the runner does after a crash, a failing tool, or a person stepping in.

Strategies (R15): a process restart restores the newest snapshot and goes
back to the last resume point; a call in flight at the crash is re-run if
idempotent, reconciled if it has a hook, and otherwise handed to a person
(never repeated blindly, R10); a tool that gives up is offered to the agent
first (skip or compensate), then retried with backoff a bounded number of
times, stopping early when the same failure fingerprint comes back (R22).
Every decision writes one structured record (R23).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tether.engine import timers
from tether.engine.decisions import args_text
from tether.engine.task import RunningTask, TaskReads, end_wait, hand_to_person
from tether.errors import NeedsPerson, TetherError
from tether.failpoints import failpoint
from tether.model import (
    CallState,
    CallStatus,
    CancelSubtask,
    Event,
    IdempotencyRecord,
    OutcomeStatus,
    Replan,
    Snapshot,
    Status,
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

log = logging.getLogger("tether.recovery")



def log_record(task: RunningTask, strategy: Strategy, event_id: int | None, detail: str,
               traceback: str | None = None) -> dict[str, Any]:
    """The structured record of one recovery action, with the fields R23 names (and the
    failure's traceback, when there was one)."""
    extra = {"traceback": traceback} if traceback else {}
    return {**extra,
        "task_id": task.snap.task_id,
        "checkpoint_version": task.version,
        "event_id": event_id,
        "resume_strategy": str(strategy),  # a plain string in records and logs
        "recovery_attempt": task.snap.recovery.attempts,
        "step": task.snap.step,
        "detail": detail,
        "at": time.time(),
    }


def emit_log_records(records: list[dict[str, Any]], version: int) -> None:
    for record in records:
        log.info("recovery %s on task %s: %s", record["resume_strategy"], record["task_id"],
                 record["detail"], extra={"tether": {**record, "written_version": version}})


# ---------------------------------------------------------------------- restart


async def restore(task: RunningTask) -> None:
    """Bring a freshly claimed task back to a state the loop can continue from."""
    snap = task.snap
    if snap.status.is_terminal:
        return
    crashed = task.claim.crashed
    # A parked task's in-doubt call was already resolved (to a person); only a running task's
    # call is looked at again, so a lever on a parked task does not re-ask reconcile hooks.
    in_doubt = snap.status is Status.RUNNING and snap.call is not None \
        and snap.call.status == CallStatus.STARTED
    if crashed or in_doubt:
        failpoint("during_recovery")
        if crashed:
            # The store counted this crash at claim time, so a worker that dies while
            # recovering (before any commit) still uses up the budget.
            task.snap.recovery.attempts = max(task.snap.recovery.attempts,
                                                task.claim.crashes - 1)
            if not _count_attempt(task, "the worker running it died (lease expired)"):
                return
            task.log_recovery(Strategy.RESUME, detail=f"restored version {task.version} at step"
                                f" {snap.step} after the worker died")
            check_resources(task)
        if in_doubt:
            await resolve_in_doubt(task)
    await timers.fire_due(task)  # what fell due while no worker held the task (E6)
    if snap.status is Status.WAITING and not timers.overdue(snap):
        await ask_check_wait(task)  # it may have happened outside, unseen (R16)


def _count_attempt(task: RunningTask, why: str) -> bool:
    """Count one recovery; False (and the task handed over) once the budget is spent (R12)."""
    rec = task.snap.recovery
    rec.attempts += 1
    rec.started_at = rec.started_at or time.time()
    rec.reasons.append(why)
    if rec.attempts > task.settings.max_recovery_attempts:
        hand_to_person(task, f"gave up after {rec.attempts - 1} recoveries at step"
                             f" {task.snap.step}; last: {why}", strategy=Strategy.NEEDS_HUMAN)
        return False
    if time.time() - rec.started_at > task.settings.recovery_timeout:
        task.snap.error = (f"recovery took longer than recovery_timeout="
                             f"{task.settings.recovery_timeout}s; last: {why}")
        task.set_status(Status.FAILED)
        task.log_recovery(Strategy.FAIL_TIMEOUT, detail=task.snap.error)
        return False
    return True


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
    call = CallState(key=key, tool=action.name, args=args, args_hash=digest)
    task.snap.call = call
    if record and record.status == OutcomeStatus.SUCCEEDED:
        task.log_recovery(Strategy.REUSE_RESULT,
                          detail=f"{action.name} already succeeded under {key}")
        task.append_history({"role": "assistant", "tool_call": {
            "name": call.tool, "args": call.args, "key": call.key}})
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
    task.log_recovery(Strategy.RECONCILE, detail=f"{call.tool} key={call.key} had happened; its"
                        " result was recovered, not repeated")
    task.finish_call(call, to_plain(found))


async def ask_check_wait(task: RunningTask) -> None:
    """Ask the agent whether what the frame waits for has already happened (R16).

    Asked when a Wait begins (an approval may have come in while the task was still busy:
    it is in the dialog, and the agent decides whether it counts) and whenever a waiting
    task is loaded again (it may have happened outside without an event).
    """
    frame = task.snap.frame
    wait = frame.wait
    if not wait:
        return
    agent = task.agent_for(frame)
    try:
        found = await agent.check_wait(task.view(), wait)
        found = None if found is None else to_plain(found)
    except Exception as error:  # agent code may raise anything
        hand_to_person(task, f"check_wait of agent {agent.name!r} failed:"
                             f" {type(error).__name__}: {error}")
        return
    if found is not None:
        end_wait(task, {"type": wait["event_type"], "payload": found, "source": "check_wait"})
        task.log_recovery(Strategy.WAIT_VALIDATED, detail=f"{wait['event_type']} had already"
                            " happened; the wait ends without a new event")


def check_resources(task: RunningTask) -> None:
    """Mark resources that vanished while the task was down, so the agent can see it (R16)."""
    for resource in task.snap.resources:
        try:
            exists = task.resource_kinds.get(resource.kind).exists(resource.ref)
        except TetherError as error:
            exists, detail = False, str(error)
        else:
            detail = f"{resource.kind} {resource.ref} is gone"
        if not exists and not resource.missing:
            resource.missing = True
            task.log_recovery(Strategy.RESOURCE_MISSING, detail=detail)


# ---------------------------------------------------------------------- tool failures


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


def over_step_limit(task: RunningTask) -> bool:
    """Whether the task has used its budget of steps; if so it goes to a person (a runaway
    agent must not plan forever). A person's resume grants the same budget again."""
    snap = task.snap
    limit = snap.max_steps or task.settings.max_steps
    if snap.step - snap.budget_start < limit:
        return False
    hand_to_person(task, f"the task took {snap.step - snap.budget_start} steps, its limit"
                         f" (max_steps={limit}); look at what it is doing, then resume it for"
                         f" {limit} more", strategy=Strategy.STEP_LIMIT)
    return True


async def _give_up(task: RunningTask, call: CallState, fingerprint: str, trace: str) -> None:
    snap = task.snap
    frame = snap.frame
    failure = {"tool": call.tool, "key": call.key, "error": call.error,
               "fingerprint": fingerprint, "attempts": call.attempt}
    task.append_history({"role": "tool", "name": call.tool, "key": call.key,
                           "error": call.error, "traceback": trace})
    repeat = f"{fingerprint}:{call.args_hash}"
    snap.recovery.given_up[repeat] = snap.recovery.given_up.get(repeat, 0) + 1
    if snap.recovery.given_up[repeat] > 1:
        hand_to_person(task, f"{call.tool} with the same arguments failed the same way"
                             f" again ({call.error}); fingerprint {fingerprint}", traceback=trace)
        return
    event = Event("tool_error", snap.task_id, failure, priority=2)
    scratch = dict(frame.scratch)
    agent = task.agent_for(frame)
    action = await agent.on_event(task.view(scratch), event)
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
    delay = _next_recovery(task, fingerprint, f"{call.tool}: {call.error}", trace)
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


def plan_failed(task: RunningTask, error: Exception) -> None:
    """The agent's plan (often a model call) raised: retry with backoff, stop on a repeat (R22)."""
    agent = task.snap.frame.agent
    text = describe_error(error)
    if isinstance(error, NeedsPerson):
        hand_to_person(task, f"agent {agent!r}: {error}")
        return
    fingerprint = failure_fingerprint(f"plan:{agent}", error)
    trace = traceback_text(error)
    delay = _next_recovery(task, fingerprint, f"planning by agent {agent!r}: {text}", trace)
    if delay is None:
        return
    task.snap.recovery.retry_at = time.time() + delay
    task.log_recovery(Strategy.RETRY_PLAN, traceback=trace,
                      detail=f"agent {agent} failed to plan ({text}); retrying in {delay:.2f}s")
    task.request_commit()


def _next_recovery(task: RunningTask, fingerprint: str, failure: str,
                   trace: str | None = None) -> float | None:
    """The backoff before the next recovery, or None once the task was handed over (R12, R22)."""
    rec = task.snap.recovery
    if fingerprint in rec.fingerprints:
        hand_to_person(task, f"{failure} failed again the same way; fingerprint"
                             f" {fingerprint} seen before, so it is not retried", traceback=trace)
        return None
    if not _count_attempt(task, failure):
        task.request_commit()
        return None
    rec.fingerprints.append(fingerprint)
    return task.settings.recovery_backoff * float(2 ** (rec.attempts - 1))


def progress_made(task: RunningTask) -> None:
    """A step succeeded: the recovery budget is per resume point, so it starts afresh."""
    task.mark_progress()
    task.counters["steps"] += 1
    rec = task.snap.recovery
    if rec.attempts or rec.fingerprints:
        rec.attempts = 0
        rec.fingerprints = []
        rec.started_at = None


def move_past_call(task: RunningTask, error: dict[str, Any]) -> None:
    """Leave the frame's current call behind without a result: the agent sees *error*."""
    snap = task.snap
    frame = snap.frame
    frame.last_tool_error = error
    frame.agenda.pop(0)
    frame.steps += 1
    snap.step += 1
    snap.call = None


async def branch_history(reads: TaskReads, snap: Snapshot) -> int:
    """Start a new dialog branch after *snap*'s last row; rows written later stay stored."""
    epoch = await reads.next_epoch(snap.task_id)
    segments = [list(segment) for segment in snap.history_segments]
    segments[-1][1] = snap.history_len
    snap.history_segments = [*segments, [epoch, -1]]
    return epoch


def retry_now(task: RunningTask, event: Event) -> None:
    """A P2 signal (retry, degrade...) brings a pending retry forward."""
    snap = task.snap
    if snap.call is not None and snap.call.retry_at:
        snap.call.retry_at = time.time()
    elif snap.recovery.retry_at:
        snap.recovery.retry_at = time.time()
    else:
        return
    task.log_recovery(Strategy.RETRY_NOW, event.id, f"{event.type}: retrying now")

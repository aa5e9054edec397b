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
from typing import TYPE_CHECKING, Any

from tether import blobs
from tether.engine import timers
from tether.engine.decisions import DECISIONS, args_text, call_awaiting_decision, in_doubt_message
from tether.errors import IllegalTransition, InDoubtCall, InvalidInput, TetherError, VersionNotFound
from tether.failpoints import failpoint
from tether.model import (
    CallState,
    Event,
    Replan,
    Snapshot,
    Status,
    check_count,
    to_plain,
)
from tether.tools import Tool, ToolContext, describe_error, failure_fingerprint

if TYPE_CHECKING:
    from tether.engine.runner import Runner
    from tether.store import Store

log = logging.getLogger("tether.recovery")



def log_record(runner: Runner, strategy: str, event_id: int | None, detail: str) -> dict[str, Any]:
    """The structured record of one recovery action, with the fields R23 names."""
    return {
        "task_id": runner.snap.task_id,
        "checkpoint_version": runner.version,
        "event_id": event_id,
        "resume_strategy": strategy,
        "recovery_attempt": runner.snap.recovery.attempts,
        "step": runner.snap.step,
        "detail": detail,
        "at": time.time(),
    }


def emit_log_records(records: list[dict[str, Any]], version: int) -> None:
    for record in records:
        log.info("recovery %s on task %s: %s", record["resume_strategy"], record["task_id"],
                 record["detail"], extra={"tether": {**record, "written_version": version}})


# ---------------------------------------------------------------------- restart


async def restore(runner: Runner) -> None:
    """Bring a freshly claimed task back to a state the loop can continue from."""
    snap = runner.snap
    if snap.status.is_terminal:
        return
    if snap.status is Status.PENDING:
        runner.set_status(Status.RUNNING)
        await runner.store.set_status(runner.claim, Status.RUNNING, None)  # visible at once (R2)
    crashed = runner.claim.crashed
    # A parked task's in-doubt call was already resolved (to a person); only a running task's
    # call is looked at again, so a lever on a parked task does not re-ask reconcile hooks.
    in_doubt = snap.status is Status.RUNNING and snap.call is not None \
        and snap.call.status == "started"
    if crashed or in_doubt:
        failpoint("during_recovery")
        if crashed:
            # The store counted this crash at claim time, so a worker that dies while
            # recovering (before any commit) still uses up the budget.
            runner.snap.recovery.attempts = max(runner.snap.recovery.attempts,
                                                runner.claim.crashes - 1)
            if not await _count_attempt(runner, "the worker running it died (lease expired)"):
                return
            runner.log_recovery("resume", detail=f"restored version {runner.version} at step"
                                f" {snap.step} after the worker died")
            check_resources(runner)
        if in_doubt:
            await resolve_in_doubt(runner)
    await timers.fire_due(runner)  # what fell due while no worker held the task (E6)
    if snap.status is Status.WAITING and not timers.overdue(snap):
        await ask_check_wait(runner)  # it may have happened outside, unseen (R16)


async def _count_attempt(runner: Runner, why: str) -> bool:
    """Count one recovery; False (and the task handed over) once the budget is spent (R12)."""
    rec = runner.snap.recovery
    rec.attempts += 1
    rec.started_at = rec.started_at or time.time()
    rec.reasons.append(why)
    if rec.attempts > runner.settings.max_recovery_attempts:
        await hand_to_person(runner, f"gave up after {rec.attempts - 1} recoveries at step"
                             f" {runner.snap.step}; last: {why}", strategy="needs_human")
        return False
    if time.time() - rec.started_at > runner.settings.recovery_timeout:
        runner.snap.error = (f"recovery took longer than recovery_timeout="
                             f"{runner.settings.recovery_timeout}s; last: {why}")
        runner.set_status(Status.FAILED)
        runner.log_recovery("fail_timeout", detail=runner.snap.error)
        return False
    return True


async def resolve_in_doubt(runner: Runner) -> None:
    """Decide what to do with a call whose outcome a crash left unknown (R10)."""
    call = runner.snap.call
    assert call is not None
    record = await runner.store.get_idempotency(call.key)
    same_call = record is not None and record.args_hash == call.args_hash
    if record and same_call and record.status == "succeeded":
        runner.log_recovery("reuse_result", detail=f"{call.tool} finished before the crash")
        await runner.finish_call(call, record.result, from_record=True)
        return
    if record and same_call and record.status == "failed":
        call.status = "planned"  # its last attempt is known to have failed: safe to run
        runner.log_recovery("rerun_failed", detail=f"{call.tool} key={call.key} had failed")
        return
    tool = runner.harness.tools.get(call.tool)
    if tool is None:
        await hand_to_person(runner, f"tool {call.tool!r} (call {call.key}) is no longer"
                             " registered, so its in-flight outcome cannot be checked (E8)")
        return
    if tool.idempotent:
        call.status = "planned"
        runner.log_recovery("rerun_idempotent", detail=f"{call.tool} re-runs with key {call.key}")
        return
    if tool.reconcile_fn is None:
        await hand_to_person(runner, f"outcome unknown: side-effecting call {call.tool}"
                             f"({args_text(call)}) key={call.key} was in flight when the worker"
                             " died and the tool has no reconcile hook; it was not repeated")
        return
    await _reconcile(runner, tool, call)


async def _reconcile(runner: Runner, tool: Tool, call: CallState) -> None:
    assert tool.reconcile_fn is not None
    ctx = ToolContext(runner.snap.task_id, tool.name, call.key, call.attempt, runner.claim.fence)
    try:
        found = await tool.reconcile_fn(ctx, **call.args)
    except Exception as error:  # the hook itself failing must not crash the worker
        await hand_to_person(runner, f"reconcile hook of {call.tool} failed for key {call.key}:"
                             f" {describe_error(error)}; the call was not repeated")
        return
    if found is None:
        call.status = "planned"
        runner.log_recovery("reconcile_not_done", detail=f"{call.tool} key={call.key} never"
                            " happened; it runs now with the same key")
        return
    runner.log_recovery("reconcile", detail=f"{call.tool} key={call.key} had happened; its"
                        " result was recovered, not repeated")
    await runner.finish_call(call, to_plain(found))


async def ask_check_wait(runner: Runner) -> None:
    """Ask the agent whether what the frame waits for has already happened (R16).

    Asked when a Wait begins (an approval may have come in while the task was still busy:
    it is in the dialog, and the agent decides whether it counts) and whenever a waiting
    task is loaded again (it may have happened outside without an event).
    """
    from tether.engine.events import end_wait

    frame = runner.snap.frame
    wait = frame.wait
    if not wait:
        return
    agent = runner.agent_for(frame)
    try:
        found = await agent.check_wait(runner.view(), wait)
        found = None if found is None else to_plain(found)
    except Exception as error:  # agent code may raise anything
        await hand_to_person(runner, f"check_wait of agent {agent.name!r} failed:"
                             f" {type(error).__name__}: {error}")
        return
    if found is not None:
        end_wait(runner, {"type": wait["event_type"], "payload": found, "source": "check_wait"})
        runner.log_recovery("wait_validated", detail=f"{wait['event_type']} had already"
                            " happened; the wait ends without a new event")


def check_resources(runner: Runner) -> None:
    """Mark resources that vanished while the task was down, so the agent can see it (R16)."""
    for resource in runner.snap.resources:
        try:
            exists = runner.harness.resource_kinds.get(resource.kind).exists(resource.ref)
        except TetherError as error:
            exists, detail = False, str(error)
        else:
            detail = f"{resource.kind} {resource.ref} is gone"
        if not exists and not resource.missing:
            resource.missing = True
            runner.log_recovery("resource_missing", detail=detail)


def clean_up_resources(runner: Runner) -> None:
    """Apply each resource's cleanup policy when the task ends."""
    succeeded = runner.snap.status is Status.COMPLETED
    for resource in runner.snap.resources:
        if resource.cleanup == "keep" or (resource.cleanup == "on_success" and not succeeded):
            continue
        try:
            runner.harness.resource_kinds.get(resource.kind).cleanup(resource.ref)
        except (OSError, TetherError) as error:
            runner.log_recovery("cleanup_failed", detail=f"{resource.kind} {resource.ref}: {error}")


# ---------------------------------------------------------------------- tool failures


async def tool_failed(runner: Runner, tool: Tool, call: CallState, error: Exception) -> None:
    """A call attempt failed: retry per policy, else let the agent compensate, else recover."""
    fingerprint = failure_fingerprint(tool.name, error)
    call.error = describe_error(error)
    call.status = "failed"
    runner.record_idempotency(call, "failed", error=call.error)
    if tool.retry.should_retry(error, call.attempt):
        call.retry_at = time.time() + tool.retry.delay(call.attempt)
        await runner.commit()
        return
    await _give_up(runner, call, fingerprint)


async def outcome_unknown(runner: Runner, tool: Tool, call: CallState, error: Exception) -> None:
    """A side-effecting call timed out or lost its answer: never retried blindly (R10).

    The same path as a crash mid-call: ask the reconcile hook, else a person.
    """
    call.error = describe_error(error)
    runner.log_recovery("outcome_unknown", detail=f"{call.tool} key={call.key}: {call.error}")
    await resolve_in_doubt(runner)
    if runner.snap.call is call and call.status == "planned":
        await tool_failed(runner, tool, call, error)  # it never happened: an ordinary failure


async def unusable_result(runner: Runner, tool: Tool, call: CallState, raw: Any,
                          error: Exception) -> None:
    """The tool ran but returned something tether cannot keep (not JSON, or too large):
    record that it ran, then stop.

    Retrying would repeat a side effect that already happened, so the call is recorded as
    succeeded with a short description of the value, and a person is asked to fix the tool.
    """
    marker = {"unusable_result": repr(raw)[:500], "why": str(error)[:500]}
    runner.record_idempotency(call, "succeeded", result=marker)
    await runner.finish_call(call, marker, from_record=True, defer=True)
    await hand_to_person(runner, f"{error}; the call is recorded as done and was not"
                         f" repeated; make tool {tool.name} return plain data of a bounded size"
                         " (store large data elsewhere and return a reference), then resume")


async def over_step_limit(runner: Runner) -> bool:
    """Whether the task has used its budget of steps; if so it goes to a person (a runaway
    agent must not plan forever). A person's resume grants the same budget again."""
    snap = runner.snap
    limit = snap.max_steps or runner.settings.max_steps
    if snap.step - snap.budget_start < limit:
        return False
    await hand_to_person(runner, f"the task took {snap.step - snap.budget_start} steps, its limit"
                         f" (max_steps={limit}); look at what it is doing, then resume it for"
                         f" {limit} more", strategy="step_limit")
    return True


async def _give_up(runner: Runner, call: CallState, fingerprint: str) -> None:
    snap = runner.snap
    frame = snap.frame
    failure = {"tool": call.tool, "key": call.key, "error": call.error,
               "fingerprint": fingerprint, "attempts": call.attempt}
    runner.append_history({"role": "tool", "name": call.tool, "key": call.key,
                           "error": call.error})
    repeat = f"{fingerprint}:{call.args_hash}"
    snap.recovery.given_up[repeat] = snap.recovery.given_up.get(repeat, 0) + 1
    if snap.recovery.given_up[repeat] > 1:
        await hand_to_person(runner, f"{call.tool} with the same arguments failed the same way"
                             f" again ({call.error}); fingerprint {fingerprint} (R22)")
        return
    event = Event("tool_error", snap.task_id, failure, priority=2)
    scratch = dict(frame.scratch)
    agent = runner.agent_for(frame)
    action = await agent.on_event(runner.view(scratch), event)
    if action is not None:
        frame.scratch = scratch
        _move_past_call(runner, failure)
        if isinstance(action, Replan):
            frame.agenda.clear()  # plan again, now knowing the call failed
        else:
            runner.put_first(action, agent=agent)
        runner.log_recovery("skip", detail=f"{call.tool} failed for good ({call.error}); the"
                            f" agent chose {type(action).__name__}")
        await runner.commit()
        return
    await _recover_call(runner, call, fingerprint)


async def _recover_call(runner: Runner, call: CallState, fingerprint: str) -> None:
    delay = await _next_recovery(runner, fingerprint, f"{call.tool}: {call.error}")
    if delay is None:
        return
    call.status = "failed"
    call.attempt = 0
    call.retry_at = time.time() + delay
    runner.log_recovery("retry_backoff", detail=f"{call.tool} gave up ({call.error}); retrying"
                        f" in {delay:.2f}s, recovery {runner.snap.recovery.attempts} of"
                        f" {runner.settings.max_recovery_attempts}")
    await runner.commit()


async def plan_failed(runner: Runner, error: Exception) -> None:
    """The agent's plan (often a model call) raised: retry with backoff, stop on a repeat (R22)."""
    agent = runner.snap.frame.agent
    text = describe_error(error)
    fingerprint = failure_fingerprint(f"plan:{agent}", error)
    delay = await _next_recovery(runner, fingerprint, f"planning by agent {agent!r}: {text}")
    if delay is None:
        return
    runner.snap.recovery.retry_at = time.time() + delay
    runner.log_recovery("retry_plan", detail=f"agent {agent} failed to plan ({text});"
                        f" retrying in {delay:.2f}s")
    await runner.commit()


async def _next_recovery(runner: Runner, fingerprint: str, failure: str) -> float | None:
    """The backoff before the next recovery, or None once the task was handed over (R12, R22)."""
    rec = runner.snap.recovery
    if fingerprint in rec.fingerprints:
        await hand_to_person(runner, f"{failure} failed again the same way; fingerprint"
                             f" {fingerprint} seen before, so it is not retried (R22)")
        return None
    if not await _count_attempt(runner, failure):
        await runner.commit()
        return None
    rec.fingerprints.append(fingerprint)
    return runner.settings.recovery_backoff * float(2 ** (rec.attempts - 1))


def progress_made(runner: Runner) -> None:
    """A step succeeded: the recovery budget is per resume point, so it starts afresh."""
    runner.mark_progress()
    runner.harness.counters["steps"] += 1
    rec = runner.snap.recovery
    if rec.attempts or rec.fingerprints:
        rec.attempts = 0
        rec.fingerprints = []
        rec.started_at = None


# ---------------------------------------------------------------------- people


async def hand_to_person(runner: Runner, reason: str, strategy: str = "needs_human") -> None:
    """Park the task for a person (R26); the worker exports the bundle and notifies."""
    runner.snap.error = reason
    runner.snap.recovery.reasons.append(reason)
    runner.set_status(Status.NEEDS_HUMAN)
    runner.log_recovery(strategy, detail=reason)
    await runner.commit()


async def human_decide(runner: Runner, event: Event) -> None:
    """A person settles a call in doubt: it happened, it did not, or skip it (R10, R26)."""
    snap = runner.snap
    payload = event.payload if isinstance(event.payload, dict) else {}
    outcome, by = payload.get("outcome"), str(payload.get("by") or "unknown")
    call = snap.call
    if outcome not in DECISIONS:
        raise InvalidInput(f"decide needs an outcome of {', '.join(DECISIONS)}, not {outcome!r}")
    if call is None or call.status != "started" or snap.status.is_terminal \
            or payload.get("key") != call.key:
        raise IllegalTransition(f"task {snap.task_id} has no call in doubt under key"
                                f" {payload.get('key')!r}; nothing was decided")
    runner.append_history({"role": "event", "type": "decide", "event_id": event.id, "content": {
        "outcome": outcome, "by": by, "tool": call.tool, "key": call.key,
        "result": payload.get("result")}})
    snap.recovery = type(snap.recovery)()
    snap.error = None
    runner.mark_progress()
    if snap.status is not Status.RUNNING:
        runner.set_status(Status.RUNNING)
    runner.log_recovery("human_decision", event.id, f"{by} said {call.tool} key={call.key}"
                        f" {_DECIDED[outcome]}")
    if outcome == "happened":
        await runner.finish_call(call, to_plain(payload.get("result")))
    elif outcome == "not_happened":
        call.status = "planned"
    else:
        _skip_call(runner, call, by)


_DECIDED = {"happened": "had happened; its result is recorded and it is not run again",
            "not_happened": "never happened; it runs now with the same key",
            "skip": "is to be skipped; it is dropped without running"}


def _skip_call(runner: Runner, call: CallState, by: str) -> None:
    """Drop a call in doubt: the agent sees it was skipped and plans on from there."""
    runner.append_history({"role": "tool", "name": call.tool, "key": call.key, "content": None,
                           "skipped": True})
    runner.snap.frame.last_tool_result = None
    _move_past_call(runner, {"tool": call.tool, "key": call.key, "skipped": True, "by": by})


def _move_past_call(runner: Runner, error: dict[str, Any]) -> None:
    """Leave the frame's current call behind without a result: the agent sees *error*."""
    snap = runner.snap
    frame = snap.frame
    frame.last_tool_error = error
    frame.agenda.pop(0)
    frame.steps += 1
    snap.step += 1
    snap.call = None


async def human_resume(runner: Runner, event: Event) -> None:
    """A person resumes a paused, waiting or parked task, optionally amending it."""
    snap = runner.snap
    assert event.id is not None
    payload = event.payload if isinstance(event.payload, dict) else {}
    undecided = call_awaiting_decision(snap, runner.harness.tools)
    if undecided is not None and not snap.status.is_terminal:
        raise InDoubtCall(in_doubt_message(snap.task_id, undecided))
    amended = bool(payload.get("message") or payload.get("frame_patch"))
    if snap.status not in (Status.PAUSED, Status.NEEDS_HUMAN, Status.FAILED, Status.WAITING):
        if amended and snap.status is Status.RUNNING:
            _amend(runner, payload)
            runner.log_recovery("amend", event.id, "task already running; the person's message"
                                " and patch were applied without a recovery")
        else:
            runner.log_recovery("resume_ignored", event.id,
                                f"task already {snap.status.value}; duplicate resume signal (R21)")
        return
    _amend(runner, payload)
    snap.recovery = type(snap.recovery)()
    snap.error = None
    snap.budget_start = snap.step
    runner.mark_progress()
    _settle_call_for_resume(runner, amended)
    if snap.frame.wait and snap.status is Status.WAITING:
        snap.frame.wait = None  # a person ends the wait; a paused task keeps its armed wait
        snap.frame.last_event = {"type": "resume", "payload": payload}
    runner.set_status(Status.RUNNING)
    runner.log_recovery("human_resume", event.id, f"resumed by {payload.get('by') or 'unknown'}"
                        + (f": {payload['message']}" if payload.get("message") else ""))
    if snap.call is not None and snap.call.status == "started":
        await resolve_in_doubt(runner)  # reconcile (or re-run an idempotent call), never blind


async def branch_history(store: Store, snap: Snapshot) -> int:
    """Start a new dialog branch after *snap*'s last row; rows written later stay stored."""
    epoch = await store.next_epoch(snap.task_id)
    segments = [list(segment) for segment in snap.history_segments]
    segments[-1][1] = snap.history_len
    snap.history_segments = [*segments, [epoch, -1]]
    return epoch


def _amend(runner: Runner, payload: dict[str, Any]) -> None:
    """Add a person's message to the dialog and merge their patch into the current frame."""
    if payload.get("message"):
        runner.append_history({"role": "user", "type": "resume", "content": payload["message"]})
    if payload.get("frame_patch"):
        runner.snap.frame.scratch.update(payload["frame_patch"])


def _settle_call_for_resume(runner: Runner, amended: bool) -> None:
    """Decide what a person's resume means for the call that stopped the task.

    An amended resume (message or frame patch) drops a failed call so the agent
    plans again with what the person changed; a plain resume retries it as
    planned. A call whose outcome is unknown runs again only because a person
    said so, and that is logged.
    """
    snap = runner.snap
    call = snap.call
    if call is None:
        agenda = snap.frame.agenda
        if amended and agenda and agenda[0]["kind"] == "tool_call":
            agenda.pop(0)
        return
    if call.status == "started":
        tool = runner.harness.tools.get(call.tool)
        if tool is not None and (tool.idempotent or tool.reconcile_fn is not None):
            return  # resolved like any call in doubt, after the status is running again
        call.status = "planned"
        runner.log_recovery("human_rerun", detail=f"a person resumed; {call.tool} key={call.key}"
                            " runs again on their say-so")
    elif amended:
        snap.frame.agenda.pop(0)
        snap.call = None
    else:
        call.retry_at = None
        call.attempt = 0


async def rollback(runner: Runner, event: Event) -> None:
    """Go back to a kept version; later dialog rows stay stored on their own branch (R14, E4)."""
    assert event.id is not None
    if runner.snap.status is Status.CANCELLED:
        runner.log_recovery("rollback_refused", event.id, "the task was cancelled; cancel is final")
        return
    payload = event.payload if isinstance(event.payload, dict) else {}
    version = payload.get("version")
    version = check_count(version, "the version a rollback names")
    task_id = runner.snap.task_id
    data = await _rollback_target(runner, event.id, version)
    old = Snapshot.loads(data, task_id, version)
    failpoint("during_rollback")
    epoch = await branch_history(runner.store, old)
    if payload.get("redo_side_effects"):
        old.key_salt = f"~redo{epoch}"
        _reopen_call(old)
    timers.rearm_waits(old, time.time(), f"r{epoch}")
    old.recovery = type(old.recovery)()
    if old.status is Status.PENDING:
        old.status = Status.RUNNING
    elif old.status is Status.NEEDS_HUMAN or old.status.is_terminal:
        old.status = Status.PAUSED
    runner.forget_uncommitted()
    runner.snap = old
    history = await runner.store.read_history(task_id, old.history_segments)
    runner.history[:] = history[: old.history_len]
    runner.log_recovery("rollback", event.id, f"rolled back to version {version} by"
                        f" {payload.get('by') or 'unknown'}"
                        + (" (side effects will be redone)" if payload.get("redo_side_effects")
                           else ""))
    if old.call is not None and old.call.status == "started":
        await resolve_in_doubt(runner)


async def _rollback_target(runner: Runner, event_id: int, version: int) -> bytes:
    """The head to roll back to, always as the store has it (an event never carries state):
    read now, or by this process's lever when it was asked (so pruning cannot race it)."""
    task_id = runner.snap.task_id
    captured = runner.harness.captured_head(event_id, version)
    if captured is not None:
        return await blobs.resolve(runner.store, captured, task_id, version)
    try:
        _, data = await blobs.load_head(runner.store, task_id, version)
    except VersionNotFound:
        raise VersionNotFound(f"task {task_id}: version {version} is no longer kept (pruned"
                              " before the rollback was applied); roll back to a kept version"
                              ) from None
    return data


def _reopen_call(snap: Snapshot) -> None:
    """Forget an open call's key so it is derived again with the new salt (a real redo)."""
    if snap.call is not None and snap.stack and snap.frame.agenda:
        snap.frame.agenda[0].pop("open_call", None)
    snap.call = None


def retry_now(runner: Runner, event: Event) -> None:
    """A P2 signal (retry, degrade...) brings a pending retry forward."""
    snap = runner.snap
    if snap.call is not None and snap.call.retry_at:
        snap.call.retry_at = time.time()
    elif snap.recovery.retry_at:
        snap.recovery.retry_at = time.time()
    else:
        return
    runner.log_recovery("retry_now", event.id, f"{event.type}: retrying now")

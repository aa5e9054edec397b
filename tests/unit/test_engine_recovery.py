"""Recovery against the RunningTask interface, with no store: calls in doubt, tool and plan
failures, restarts and step limits (R10, R12, R15, R16, R22, R23, R26, E3, E6, E8); a
person's levers are in test_engine_levers.py."""

from __future__ import annotations

import time
from typing import Any

import pytest
from engine_double import (
    TASK,
    FakeReads,
    FakeTask,
    ScriptedAgent,
    in_doubt_task,
    lever,
    make_snap,
    make_tool,
    open_call,
    record_for,
    waiting_task,
    with_reconcile,
)

from tether.engine import budget, calls, recovery
from tether.errors import NotRetryable
from tether.model import (
    CallStatus,
    OutcomeStatus,
    Replan,
    Reply,
    Resource,
    Status,
    ToolCall,
)
from tether.resources import ResourceKind, ResourceKinds
from tether.settings import Settings
from tether.store.base import Claim
from tether.strategies import Strategy
from tether.tools import RetryPolicy, Tool, ToolContext

# --------------------------------------------------------------------------- calls in doubt


async def test_r10_a_succeeded_record_is_reused_and_the_call_not_rerun() -> None:
    """R10, R15: an in-doubt call whose idempotency record says it succeeded (same call) takes
    the stored result; nothing runs again and the result is not recorded a second time."""
    runs: list[dict[str, Any]] = []
    reads = FakeReads()
    task = in_doubt_task(reads=reads, tools=[make_tool(side_effect=True, runs=runs)])
    call = task.snap.call
    assert call is not None
    reads.idempotency[call.key] = record_for(call, OutcomeStatus.SUCCEEDED, {"paid": 5})

    await calls.resolve_in_doubt(task)

    assert task.strategies == [Strategy.REUSE_RESULT]
    assert task.finished == [(call.key, {"paid": 5}, True, False)]
    assert task.idempotency == []
    assert task.snap.call is None and task.snap.frame.last_tool_result == {"paid": 5}
    assert [entry.kind for entry in task.snap.frame.agenda] == ["reply"]
    assert task.commit_requested and runs == []
    assert task.snap.status is Status.RUNNING


async def test_e3_a_succeeded_record_of_other_arguments_is_not_reused() -> None:
    """E3, R10: the same key with other arguments is a different call: never answered from the
    record; a side-effecting call in doubt then goes to a person."""
    reads = FakeReads()
    task = in_doubt_task(reads=reads)
    call = task.snap.call
    assert call is not None
    reads.idempotency[call.key] = record_for(call, OutcomeStatus.SUCCEEDED, {"paid": 99},
                                             args_hash_="another-call")

    await calls.resolve_in_doubt(task)

    assert task.finished == []
    assert task.snap.status is Status.NEEDS_HUMAN
    assert task.snap.call is call and call.status is CallStatus.STARTED


async def test_r10_a_failed_record_makes_the_call_safe_to_run() -> None:
    """R10: a record saying the last attempt failed makes the call planned (safe to run)."""
    reads = FakeReads()
    task = in_doubt_task(reads=reads)
    call = task.snap.call
    assert call is not None
    reads.idempotency[call.key] = record_for(call, OutcomeStatus.FAILED)

    await calls.resolve_in_doubt(task)

    assert task.strategies == [Strategy.RERUN_FAILED]
    assert task.snap.call is call and call.status is CallStatus.PLANNED
    assert task.finished == [] and task.snap.status is Status.RUNNING


async def test_r10_an_idempotent_tool_in_doubt_runs_again_with_its_key() -> None:
    """R10, R15: an idempotent tool with no known outcome re-runs (same key)."""
    task = in_doubt_task(side_effect=False)
    call = task.snap.call
    assert call is not None
    key = call.key

    await calls.resolve_in_doubt(task)

    assert task.strategies == [Strategy.RERUN_IDEMPOTENT]
    assert call.status is CallStatus.PLANNED and call.key == key
    assert task.snap.status is Status.RUNNING


async def test_r10_r26_a_side_effect_without_reconcile_goes_to_a_person_unrepeated() -> None:
    """R10, R26: a side-effecting call in doubt with no reconcile hook is never repeated: the
    task goes to needs_human, the call stays started, and a commit is asked for."""
    runs: list[dict[str, Any]] = []
    task = in_doubt_task(tools=[make_tool(side_effect=True, runs=runs)])
    call = task.snap.call
    assert call is not None

    await calls.resolve_in_doubt(task)

    assert task.snap.status is Status.NEEDS_HUMAN
    assert task.snap.call is call and call.status is CallStatus.STARTED
    assert task.commit_requested and runs == []
    assert task.strategies == [Strategy.NEEDS_HUMAN]
    assert task.snap.error is not None and call.key in task.snap.error
    assert "not repeated" in task.snap.error
    assert task.snap.recovery.reasons == [task.snap.error]


async def test_e8_an_unregistered_tool_in_doubt_goes_to_a_person_naming_it() -> None:
    """E8: a call in doubt whose tool is no longer registered cannot be checked: a person."""
    task = in_doubt_task(tools=[])

    await calls.resolve_in_doubt(task)

    assert task.snap.status is Status.NEEDS_HUMAN
    assert task.snap.error is not None and "'pay'" in task.snap.error
    assert "no longer" in task.snap.error


async def test_r10_reconcile_returning_none_runs_the_call_now_with_the_same_key() -> None:
    """R10: a reconcile hook saying the call never happened makes it planned (same key); the
    hook got the call's arguments, key and the lease's fence."""
    seen: list[tuple[ToolContext, dict[str, Any]]] = []

    async def never_happened(ctx: ToolContext, **args: Any) -> Any:
        seen.append((ctx, args))
        return None

    task = in_doubt_task(tools=[with_reconcile(never_happened)],
                         claim=Claim(TASK, fence=42, crashed=False))
    call = task.snap.call
    assert call is not None

    await calls.resolve_in_doubt(task)

    assert task.strategies == [Strategy.RECONCILE_NOT_DONE]
    assert call.status is CallStatus.PLANNED and task.snap.call is call
    assert [(ctx.idempotency_key, ctx.fence, args) for ctx, args in seen] == [
        (call.key, 42, {"amount": 5})]
    assert task.finished == []


async def test_r10_reconcile_returning_a_value_records_it_without_repeating() -> None:
    """R10: a reconcile hook that finds the effect recovers its result: the call is finished
    with it (recorded as succeeded) and not run again."""
    runs: list[dict[str, Any]] = []

    async def found(ctx: ToolContext, **args: Any) -> Any:
        return ("refund", 5)  # a tuple: stored as plain JSON (a list)

    tool = make_tool(side_effect=True, runs=runs)
    tool.reconcile(found)
    task = in_doubt_task(tools=[tool])
    call = task.snap.call
    assert call is not None

    await calls.resolve_in_doubt(task)

    assert task.strategies == [Strategy.RECONCILE]
    assert task.finished == [(call.key, ["refund", 5], False, False)]
    assert [(r.key, r.status, r.result) for r in task.idempotency] == [
        (call.key, OutcomeStatus.SUCCEEDED, ["refund", 5])]
    assert task.snap.call is None and task.commit_requested and runs == []


async def test_r10_r26_a_reconcile_hook_that_raises_hands_the_task_to_a_person() -> None:
    """R10, R26: a failing reconcile hook must not crash the worker nor repeat the call."""

    async def broken(ctx: ToolContext, **args: Any) -> Any:
        raise RuntimeError("gateway down")

    task = in_doubt_task(tools=[with_reconcile(broken)])
    call = task.snap.call
    assert call is not None

    await calls.resolve_in_doubt(task)

    assert task.snap.status is Status.NEEDS_HUMAN
    assert task.snap.error is not None and "RuntimeError: gateway down" in task.snap.error
    assert call.status is CallStatus.STARTED and task.finished == []


async def test_r10_outcome_unknown_with_no_effect_becomes_an_ordinary_failure() -> None:
    """R10: a side-effecting call that lost its answer is reconciled first; when it never
    happened it is an ordinary failure, retried per its policy."""

    async def never_happened(ctx: ToolContext, **args: Any) -> Any:
        return None

    tool = make_tool(side_effect=True, retry=RetryPolicy(max_attempts=3, backoff=10, jitter=0))
    tool.reconcile(never_happened)
    task = in_doubt_task(tools=[tool])
    call = task.snap.call
    assert call is not None

    await calls.outcome_unknown(task, tool, call, TimeoutError("no answer"))

    assert task.strategies == [Strategy.OUTCOME_UNKNOWN, Strategy.RECONCILE_NOT_DONE]
    assert call.status is CallStatus.FAILED and call.retry_at is not None
    assert task.snap.status is Status.RUNNING


async def test_r10_outcome_unknown_without_reconcile_goes_to_a_person() -> None:
    """R10: a lost answer from a side-effecting tool with no reconcile hook is never retried."""
    tool = make_tool(side_effect=True)
    task = in_doubt_task(tools=[tool])
    call = task.snap.call
    assert call is not None

    await calls.outcome_unknown(task, tool, call, TimeoutError("no answer"))

    assert task.strategies == [Strategy.OUTCOME_UNKNOWN, Strategy.NEEDS_HUMAN]
    assert call.status is CallStatus.STARTED and call.retry_at is None
    assert task.idempotency == []


# --------------------------------------------------------------------------- tool failures


def failing_task(agent: ScriptedAgent, *, retry: RetryPolicy | None = None,
                 settings: Settings | None = None, attempt: int = 1) -> tuple[FakeTask, Tool]:
    tool = make_tool(retry=retry or RetryPolicy(max_attempts=3, backoff=10, jitter=0))
    snap = make_snap(agenda=[Reply("after")])
    open_call(snap, attempt=attempt)
    return FakeTask(snap, tools=[tool], agents=[agent], settings=settings), tool


async def test_r15_a_retryable_failure_sets_retry_at_and_asks_for_a_commit() -> None:
    """R15, E6: a failure the policy retries stores its due time and is made durable; the
    agent is not asked yet."""
    agent = ScriptedAgent(answer=Reply("never asked"))
    task, tool = failing_task(agent)
    call = task.snap.call
    assert call is not None

    before = time.time()
    await calls.tool_failed(task, tool, call, RuntimeError("boom"))
    after = time.time()

    assert call.status is CallStatus.FAILED and call.error == "RuntimeError: boom"
    assert call.retry_at is not None and before + 10 <= call.retry_at <= after + 10
    assert task.commit_requested
    assert [(r.key, r.status, r.error) for r in task.idempotency] == [
        (call.key, OutcomeStatus.FAILED, "RuntimeError: boom")]
    assert agent.events == [] and task.rows == [] and task.recovery_log == []


async def test_r15_giving_up_offers_a_tool_error_event_to_the_agent() -> None:
    """R15, R12: a tool that gave up is offered to the agent as a P2 ``tool_error``; declined,
    the call is retried after a backoff, counted against the recovery budget."""
    agent = ScriptedAgent(answer=None)
    task, tool = failing_task(agent, attempt=3, settings=Settings(recovery_backoff=4.0))
    call = task.snap.call
    assert call is not None
    key = call.key

    before = time.time()
    await calls.tool_failed(task, tool, call, RuntimeError("boom"))
    after = time.time()

    [event] = agent.events
    assert (event.type, event.priority, event.task_id) == ("tool_error", 2, TASK)
    assert {k: event.payload[k] for k in ("tool", "key", "error", "attempts")} == {
        "tool": "pay", "key": key, "error": "RuntimeError: boom", "attempts": 3}
    assert event.payload["fingerprint"] in task.snap.recovery.fingerprints
    assert task.strategies == [Strategy.RETRY_BACKOFF]
    assert call.attempt == 0 and call.status is CallStatus.FAILED
    assert call.retry_at is not None and before + 4 <= call.retry_at <= after + 4
    assert task.snap.recovery.attempts == 1 and task.commit_requested
    assert task.rows == [{"role": "tool", "name": "pay", "key": key,
                          "error": "RuntimeError: boom", "traceback": "RuntimeError: boom"}]


async def test_r15_a_not_retryable_error_gives_up_at_the_first_attempt() -> None:
    """R15: NotRetryable skips the remaining attempts and goes straight to the agent."""
    agent = ScriptedAgent(answer=None)
    task, tool = failing_task(agent, attempt=1)
    call = task.snap.call
    assert call is not None

    await calls.tool_failed(task, tool, call, NotRetryable("bad card"))

    assert [e.type for e in agent.events] == ["tool_error"]
    assert task.strategies == [Strategy.RETRY_BACKOFF]


async def test_r15_the_agent_may_compensate_a_call_that_gave_up() -> None:
    """R15: an action from the agent replaces the failed call (skipped, recorded), runs first,
    and the rest of the frame's to-do list is kept."""
    agent = ScriptedAgent(answer=ToolCall("refund", {"amount": 5}), scratch={"noted": True})
    task, tool = failing_task(agent, attempt=3)
    call = task.snap.call
    assert call is not None

    await calls.tool_failed(task, tool, call, RuntimeError("boom"))

    frame = task.snap.frame
    assert task.snap.call is None
    assert [entry.action for entry in frame.agenda] == [
        {"kind": "tool_call", "name": "refund", "args": {"amount": 5}},
        {"kind": "reply", "text": "after"}]
    assert frame.agenda[0].planned_by == "main@1"
    assert frame.last_tool_error is not None and frame.last_tool_error["key"] == call.key
    assert frame.scratch == {"noted": True}
    assert (frame.steps, task.snap.step) == (1, 1)
    assert task.strategies == [Strategy.SKIP] and task.commit_requested


async def test_r15_the_agent_may_replan_after_a_call_gave_up() -> None:
    """R15: Replan from the agent drops the frame's recorded work so it plans again."""
    agent = ScriptedAgent(answer=Replan())
    task, tool = failing_task(agent, attempt=3)
    call = task.snap.call
    assert call is not None

    await calls.tool_failed(task, tool, call, RuntimeError("boom"))

    assert task.snap.frame.agenda == [] and task.snap.call is None
    assert task.strategies == [Strategy.SKIP]


async def test_r22_the_same_call_failing_the_same_way_twice_goes_to_a_person() -> None:
    """R22: the same tool and arguments giving up with the same fingerprint (numbers masked)
    again stops the task, even though the agent keeps skipping it."""
    agent = ScriptedAgent(answer=Reply("skipped"))
    task, tool = failing_task(agent, attempt=3)
    first = task.snap.call
    assert first is not None
    await calls.tool_failed(task, tool, first, TimeoutError("timeout after 30.2s"))
    assert task.snap.status is Status.RUNNING and task.strategies == [Strategy.SKIP]

    second = open_call(task.snap, attempt=3)  # planned again at a later position, same args
    assert second.key != first.key
    await calls.tool_failed(task, tool, second, TimeoutError("timeout after 31.9s"))

    assert task.snap.status is Status.NEEDS_HUMAN
    assert task.snap.error is not None and "fingerprint" in task.snap.error
    assert len(agent.events) == 1


async def test_r22_the_same_failure_with_other_arguments_is_not_a_repeat() -> None:
    """R22: a different call (other arguments) failing the same way is offered to the agent
    again, not treated as a loop."""
    agent = ScriptedAgent(answer=Reply("skipped"))
    task, tool = failing_task(agent, attempt=3)
    first = task.snap.call
    assert first is not None
    await calls.tool_failed(task, tool, first, RuntimeError("boom"))

    second = open_call(task.snap, args={"amount": 6}, attempt=3)
    await calls.tool_failed(task, tool, second, RuntimeError("boom"))

    assert task.snap.status is Status.RUNNING
    assert task.strategies == [Strategy.SKIP, Strategy.SKIP] and len(agent.events) == 2


async def test_r12_r22_a_retried_call_giving_up_the_same_way_again_goes_to_a_person() -> None:
    """R12, R22: after a backoff recovery the same call gives up again with the same failure:
    it is not retried a second time."""
    agent = ScriptedAgent(answer=None)
    task, tool = failing_task(agent, attempt=3)
    call = task.snap.call
    assert call is not None
    await calls.tool_failed(task, tool, call, RuntimeError("boom"))
    assert task.strategies == [Strategy.RETRY_BACKOFF]

    call.attempt = 3  # the retries after the recovery used up the policy again
    await calls.tool_failed(task, tool, call, RuntimeError("boom"))

    assert task.snap.status is Status.NEEDS_HUMAN
    assert task.strategies == [Strategy.RETRY_BACKOFF, Strategy.NEEDS_HUMAN]


# --------------------------------------------------------------------------- plan failures


async def test_r12_a_failed_plan_is_retried_after_a_backoff() -> None:
    """R12: the agent's plan raising (a model call) is retried after a stored backoff."""
    task = FakeTask(make_snap(), agents=[ScriptedAgent()],
                    settings=Settings(recovery_backoff=2.0))

    before = time.time()
    recovery.plan_failed(task, RuntimeError("rate limited"))
    after = time.time()

    retry_at = task.snap.recovery.retry_at
    assert retry_at is not None and before + 2 <= retry_at <= after + 2
    assert task.strategies == [Strategy.RETRY_PLAN] and task.commit_requested
    assert task.snap.recovery.attempts == 1 and task.snap.status is Status.RUNNING


async def test_r22_a_plan_failing_the_same_way_twice_goes_to_a_person() -> None:
    """R22: the same planning failure (numbers masked) seen again is not retried."""
    task = FakeTask(make_snap(), agents=[ScriptedAgent()])

    recovery.plan_failed(task, RuntimeError("model timeout after 30.2s"))
    recovery.plan_failed(task, RuntimeError("model timeout after 31.7s"))

    assert task.snap.status is Status.NEEDS_HUMAN
    assert task.strategies == [Strategy.RETRY_PLAN, Strategy.NEEDS_HUMAN]
    assert task.snap.error is not None and "fingerprint" in task.snap.error


async def test_r12_plan_failures_beyond_the_budget_go_to_a_person() -> None:
    """R12: different failures still use up max_recovery_attempts; then a person."""
    task = FakeTask(make_snap(), agents=[ScriptedAgent()],
                    settings=Settings(max_recovery_attempts=2))

    for error in (ValueError("a"), KeyError("b"), TypeError("c")):
        recovery.plan_failed(task, error)

    assert task.strategies == [Strategy.RETRY_PLAN, Strategy.RETRY_PLAN, Strategy.NEEDS_HUMAN]
    assert task.snap.status is Status.NEEDS_HUMAN and task.commit_requested
    assert task.snap.error is not None and "gave up after 2 recoveries" in task.snap.error


async def test_r12_progress_starts_the_recovery_budget_afresh() -> None:
    """R12: the budget is per resume point: a successful step resets attempts and
    fingerprints, and the next commit is marked as progress."""
    task = FakeTask(make_snap(), agents=[ScriptedAgent()])
    task.snap.recovery.attempts = 2
    task.snap.recovery.fingerprints = ["x"]
    task.snap.recovery.started_at = 1.0

    budget.progress_made(task)

    rec = task.snap.recovery
    assert (rec.attempts, rec.fingerprints, rec.started_at) == (0, [], None)
    assert task.progress and task.counters["steps"] == 1


# --------------------------------------------------------------------------- restarts


def crashed(crashes: int = 1) -> Claim:
    return Claim(TASK, fence=2, crashed=True, crashes=crashes)


async def test_r12_r15_a_crashed_claim_counts_an_attempt_and_resumes() -> None:
    """R12, R15: a task whose worker died is restored and the recovery is counted."""
    task = FakeTask(make_snap(), agents=[ScriptedAgent()], claim=crashed(1))

    await recovery.restore(task)

    assert task.snap.status is Status.RUNNING
    assert task.snap.recovery.attempts == 1
    assert task.strategies == [Strategy.RESUME]


@pytest.mark.parametrize(("crashes", "status"), [(3, Status.RUNNING), (4, Status.NEEDS_HUMAN)])
async def test_r12_crashes_beyond_max_recovery_attempts_go_to_a_person(
        crashes: int, status: Status) -> None:
    """R12, R26: the store's crash count is the floor of the attempts; one past
    max_recovery_attempts hands the task to a person instead of resuming it."""
    task = FakeTask(make_snap(), agents=[ScriptedAgent()], claim=crashed(crashes),
                    settings=Settings(max_recovery_attempts=3))

    await recovery.restore(task)

    assert task.snap.status is status
    if status is Status.NEEDS_HUMAN:
        assert task.strategies == [Strategy.NEEDS_HUMAN] and task.commit_requested
        assert task.snap.error is not None and "gave up after 3 recoveries" in task.snap.error
    else:
        assert task.strategies == [Strategy.RESUME]


async def test_r12_a_recovery_taking_longer_than_recovery_timeout_fails_the_task() -> None:
    """R12: a recovery that has gone on for longer than recovery_timeout fails the task."""
    task = FakeTask(make_snap(), agents=[ScriptedAgent()], claim=crashed(1),
                    settings=Settings(recovery_timeout=600))
    task.snap.recovery.started_at = time.time() - 10_000

    await recovery.restore(task)

    assert task.snap.status is Status.FAILED
    assert task.strategies == [Strategy.FAIL_TIMEOUT]
    assert task.snap.error is not None and "recovery_timeout=600" in task.snap.error


async def test_r10_a_crash_with_a_call_in_doubt_resolves_the_call() -> None:
    """R10, R15: after a crash the call in flight is looked at again (here: idempotent, so it
    re-runs), after the attempt is counted."""
    task = in_doubt_task(side_effect=False, claim=crashed(1))

    await recovery.restore(task)

    assert task.strategies == [Strategy.RESUME, Strategy.RERUN_IDEMPOTENT]
    assert task.snap.call is not None and task.snap.call.status is CallStatus.PLANNED


async def test_r10_a_call_in_doubt_without_a_crash_is_resolved_without_counting() -> None:
    """R10, R12: a call left in doubt by a clean hand-over is resolved; no recovery counted."""
    task = in_doubt_task(side_effect=False)

    await recovery.restore(task)

    assert task.strategies == [Strategy.RERUN_IDEMPOTENT]
    assert task.snap.recovery.attempts == 0


async def test_r10_a_parked_tasks_call_in_doubt_is_not_looked_at_again() -> None:
    """R10, R26: a task a person holds already had its call in doubt resolved (to them):
    loading it again does not re-ask or re-decide anything."""
    task = in_doubt_task(status=Status.NEEDS_HUMAN)

    await recovery.restore(task)

    assert task.recovery_log == [] and task.snap.status is Status.NEEDS_HUMAN
    assert task.snap.call is not None and task.snap.call.status is CallStatus.STARTED


async def test_r11_a_finished_task_is_not_recovered() -> None:
    """R11: a terminal task is left alone, even after a crashed claim."""
    task = FakeTask(make_snap(Status.COMPLETED), agents=[ScriptedAgent()], claim=crashed(9))

    await recovery.restore(task)

    assert task.recovery_log == [] and task.snap.recovery.attempts == 0
    assert task.snap.status is Status.COMPLETED


async def test_r16_a_wait_that_already_happened_outside_ends_on_load() -> None:
    """R16: a waiting task asks its agent whether the awaited event already happened; if so
    the wait ends without an event and the task runs on."""
    agent = ScriptedAgent(found={"approved": True})
    task = waiting_task(agent)

    await recovery.restore(task)

    assert task.snap.status is Status.RUNNING and task.snap.frame.wait is None
    assert task.snap.frame.last_event == {"type": "approval", "payload": {"approved": True},
                                          "source": "check_wait"}
    assert task.strategies == [Strategy.WAIT_VALIDATED]


async def test_r16_a_wait_that_has_not_happened_stays_waiting() -> None:
    """R16: check_wait answering None leaves the wait armed."""
    agent = ScriptedAgent(found=None)
    task = waiting_task(agent)

    await recovery.restore(task)

    assert task.snap.status is Status.WAITING and task.snap.frame.wait is not None
    assert [w["event_type"] for w in agent.waits] == ["approval"]
    assert task.recovery_log == []


async def test_r16_r26_a_failing_check_wait_hands_the_task_to_a_person() -> None:
    """R16, R26: agent code raising in check_wait parks the task for a person."""
    agent = ScriptedAgent(found_raises=RuntimeError("approvals API down"))
    task = waiting_task(agent)

    await recovery.restore(task)

    assert task.snap.status is Status.NEEDS_HUMAN
    assert task.snap.error is not None and "approvals API down" in task.snap.error


async def test_e6_an_overdue_wait_fires_its_timer_instead_of_asking_the_agent() -> None:
    """E6, R16: a wait whose due time passed while no worker ran fires its timer; the agent
    is not asked (the timer decides)."""
    agent = ScriptedAgent(found={"approved": True})
    task = waiting_task(agent, due_at=time.time() - 60)

    await recovery.restore(task)

    assert [(e.type, e.source_event_id) for e in task.fired] == [("timer", "timer:f0:0")]
    assert agent.waits == [] and task.snap.status is Status.WAITING


async def test_r16_a_resource_gone_while_the_task_was_down_is_marked_missing() -> None:
    """R16, R8: after a crash each resource is checked; one that vanished is marked (once)."""
    kinds = ResourceKinds()
    kinds.register("box", ResourceKind(exists=lambda ref: ref == "kept", cleanup=lambda ref: None))
    snap = make_snap()
    snap.resources = [Resource("box", "gone"), Resource("box", "kept")]
    task = FakeTask(snap, agents=[ScriptedAgent()], claim=crashed(1), resource_kinds=kinds)

    await recovery.restore(task)
    recovery.check_resources(task)

    assert [r.missing for r in snap.resources] == [True, False]
    assert task.strategies == [Strategy.RESUME, Strategy.RESOURCE_MISSING]


# --------------------------------------------------------------------------- step limit


@pytest.mark.parametrize(("step", "budget_start", "limit_hit"),
                         [(9, 0, False), (10, 0, True), (14, 5, False), (15, 5, True)])
async def test_r12_over_step_limit(step: int, budget_start: int, limit_hit: bool) -> None:
    """R12, R26: a task that used its budget of steps (since the last resume) goes to a person
    naming max_steps; below it nothing happens. The task's own max_steps beats the setting."""
    snap = make_snap(step=step)
    snap.budget_start = budget_start
    snap.max_steps = 10
    task = FakeTask(snap, agents=[ScriptedAgent()], settings=Settings(max_steps=1000))

    assert recovery.over_step_limit(task) is limit_hit

    if limit_hit:
        assert snap.status is Status.NEEDS_HUMAN and task.strategies == [Strategy.STEP_LIMIT]
        assert snap.error is not None and "max_steps=10" in snap.error
    else:
        assert snap.status is Status.RUNNING and task.recovery_log == []


# --------------------------------------------------------------------------- records


async def test_r15_a_p2_signal_brings_a_pending_retry_forward() -> None:
    """R15, R4: a retry signal makes a backed-off call due now; with nothing pending it does
    nothing."""
    snap = make_snap()
    call = open_call(snap, status=CallStatus.FAILED)
    call.retry_at = time.time() + 1000
    task = FakeTask(snap, agents=[ScriptedAgent()])
    signal = lever("retry", None, event_id=4)

    recovery.retry_now(task, signal)
    assert call.retry_at <= time.time()
    assert task.recovery_log == [(Strategy.RETRY_NOW, 4, "retry: retrying now")]

    call.retry_at = None
    recovery.retry_now(task, signal)
    assert len(task.recovery_log) == 1


async def test_r23_a_recovery_record_has_the_named_fields() -> None:
    """R23: each recovery record names task_id, checkpoint_version, event_id,
    resume_strategy and recovery_attempt."""
    task = FakeTask(make_snap(step=4), version=12)
    task.snap.recovery.attempts = 2

    record = recovery.log_record(task, Strategy.RESUME, 31, "why")

    assert {k: record[k] for k in ("task_id", "checkpoint_version", "event_id",
                                   "resume_strategy", "recovery_attempt", "step", "detail")} == {
        "task_id": TASK, "checkpoint_version": 12, "event_id": 31,
        "resume_strategy": Strategy.RESUME, "recovery_attempt": 2, "step": 4, "detail": "why"}

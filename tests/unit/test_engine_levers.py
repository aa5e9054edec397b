"""Unit tests of the levers people pull (tether.engine.levers), on a RunningTask double and no
store: resume (R21, R26; never a call in doubt, R10), decide (R10, R26), rollback (R14, E4, E6)."""

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
)

from tether.engine import calls, levers
from tether.errors import IllegalTransition, InDoubtCall, InvalidInput, VersionNotFound
from tether.model import (
    CallStatus,
    Event,
    OutcomeStatus,
    Reply,
    Status,
)
from tether.strategies import Strategy
from tether.tools import idempotency_key

# --------------------------------------------------------------------------- resume


async def test_r21_a_resume_of_a_running_task_is_ignored() -> None:
    """R21: a duplicate resume signal for a running task causes no second recovery."""
    task = FakeTask(make_snap(), agents=[ScriptedAgent()])
    task.snap.recovery.attempts = 2

    await levers.human_resume(task, lever("resume", {"by": "ann"}))

    assert task.recovery_log == [(Strategy.RESUME_IGNORED, 9, task.recovery_log[0][2])]
    assert task.snap.status is Status.RUNNING and task.snap.recovery.attempts == 2
    assert task.rows == [] and not task.progress


async def test_r26_a_resume_with_a_message_amends_a_running_task() -> None:
    """R26, R3: a person's message for a running task is added to the dialog (an amend)
    without a recovery."""
    task = FakeTask(make_snap(), agents=[ScriptedAgent()])
    task.snap.recovery.attempts = 2

    await levers.human_resume(task, lever("resume", {"message": "use the EU account",
                                                       "frame_patch": {"region": "eu"}}))

    assert task.strategies == [Strategy.AMEND]
    assert task.rows == [{"role": "user", "type": "resume", "content": "use the EU account"}]
    assert task.snap.frame.scratch == {"region": "eu"}
    assert task.snap.recovery.attempts == 2


async def test_r10_a_plain_resume_is_refused_while_a_side_effect_is_in_doubt() -> None:
    """R10, R26: a side-effecting call in doubt must be decided, not resumed: InDoubtCall, and
    nothing changes."""
    task = in_doubt_task(status=Status.NEEDS_HUMAN)

    with pytest.raises(InDoubtCall):
        await levers.human_resume(task, lever("resume", {"message": "go on"}))

    assert task.snap.status is Status.NEEDS_HUMAN and task.rows == []
    assert task.snap.call is not None and task.snap.call.status is CallStatus.STARTED


async def test_e8_a_resume_is_refused_while_a_call_of_a_vanished_tool_is_in_doubt() -> None:
    """E8, R10: a call in doubt whose tool is gone cannot be reconciled: a person decides."""
    task = in_doubt_task(status=Status.NEEDS_HUMAN, tools=[])

    with pytest.raises(InDoubtCall):
        await levers.human_resume(task, lever("resume", {}))


async def test_r26_a_plain_resume_retries_the_failed_call_with_a_fresh_budget() -> None:
    """R26, R12: a person's resume runs the task again with a fresh recovery and step budget;
    the failed call is retried at once."""
    snap = make_snap(Status.NEEDS_HUMAN, agenda=[Reply("after")], step=7)
    call = open_call(snap, status=CallStatus.FAILED, attempt=3)
    call.retry_at = time.time() + 100
    snap.error = "gave up"
    snap.recovery.attempts = 3
    task = FakeTask(snap, tools=[make_tool(side_effect=True)], agents=[ScriptedAgent()])

    await levers.human_resume(task, lever("resume", {"by": "ann"}))

    assert snap.status is Status.RUNNING and snap.error is None
    assert snap.recovery.attempts == 0 and snap.budget_start == 7
    assert snap.call is call and (call.attempt, call.retry_at) == (0, None)
    assert task.progress
    assert task.recovery_log == [(Strategy.HUMAN_RESUME, 9, "resumed by ann")]


async def test_r26_an_amended_resume_drops_the_failed_call_so_the_agent_plans_again() -> None:
    """R26 (issue 27): a resume with a message drops the failed call, and the rest of the
    answer is newer than nothing the person said: it is set aside too (a reply's text kept
    in the dialog, before the message); a patch without a message keeps the rest."""
    snap = make_snap(Status.NEEDS_HUMAN, agenda=[Reply("after")])
    open_call(snap, status=CallStatus.FAILED, attempt=3)
    task = FakeTask(snap, tools=[make_tool()], agents=[ScriptedAgent()])

    await levers.human_resume(task, lever("resume", {"message": "try the other card"}))

    assert snap.call is None and snap.frame.agenda == []
    assert snap.status is Status.RUNNING
    assert [row["content"] for row in task.rows] == ["after", "try the other card"]

    patched = make_snap(Status.NEEDS_HUMAN, agenda=[Reply("after")])
    open_call(patched, status=CallStatus.FAILED, attempt=3)
    task = FakeTask(patched, tools=[make_tool()], agents=[ScriptedAgent()])
    await levers.human_resume(task, lever("resume", {"frame_patch": {"card": 2}}))
    assert patched.call is None and [e.kind for e in patched.frame.agenda] == ["reply"]


async def test_r26_resuming_a_waiting_task_ends_its_wait() -> None:
    """R26, R11: a person resuming a waiting task ends the wait with their resume."""
    task = waiting_task(ScriptedAgent(), due_at=time.time() + 100)

    await levers.human_resume(task, lever("resume", {"by": "ann"}))

    assert task.snap.status is Status.RUNNING and task.snap.frame.wait is None
    assert task.snap.frame.last_event == {"type": "resume", "payload": {"by": "ann"}}


async def test_r15_resuming_a_paused_task_keeps_its_armed_wait() -> None:
    """R15: a paused task (interrupted while its wait was armed) keeps that wait on resume."""
    snap = make_snap(Status.PAUSED)
    snap.frame.wait = {"event_type": "approval", "due_at": None, "timeout": None}
    task = FakeTask(snap, agents=[ScriptedAgent()])

    await levers.human_resume(task, lever("resume", {}))

    assert snap.status is Status.RUNNING and snap.frame.wait is not None


async def test_r10_resuming_with_an_idempotent_call_in_doubt_reruns_it() -> None:
    """R10, R26: a call in doubt that settles itself (idempotent) is resolved as after a
    crash, once the task runs again."""
    task = in_doubt_task(side_effect=False, status=Status.NEEDS_HUMAN)

    await levers.human_resume(task, lever("resume", {}))

    assert task.strategies == [Strategy.HUMAN_RESUME, Strategy.RERUN_IDEMPOTENT]
    assert task.snap.call is not None and task.snap.call.status is CallStatus.PLANNED


# --------------------------------------------------------------------------- decide


def decide(task: FakeTask, outcome: Any, **extra: Any) -> Event:
    assert task.snap.call is not None
    return lever("decide", {"outcome": outcome, "by": "ann", **calls.observation(task.snap),
                            **extra})


async def test_r10_r26_decided_happened_records_the_result_without_running() -> None:
    """R10, R26: a person says the call happened: its result is recorded, it is not run."""
    runs: list[dict[str, Any]] = []
    task = in_doubt_task(status=Status.NEEDS_HUMAN, tools=[make_tool(side_effect=True,
                                                                     runs=runs)])
    call = task.snap.call
    assert call is not None
    task.snap.error = "outcome unknown"

    await calls.human_decide(task, decide(task, "happened", result={"refund": "r1"}))

    assert task.snap.status is Status.RUNNING and task.snap.error is None
    assert task.finished == [(call.key, {"refund": "r1"}, False, False)]
    assert [(r.status, r.result) for r in task.idempotency] == [
        (OutcomeStatus.SUCCEEDED, {"refund": "r1"})]
    assert task.rows[0]["type"] == "decide" and task.rows[0]["content"]["outcome"] == "happened"
    assert task.strategies == [Strategy.HUMAN_DECISION] and task.recovery_log[0][1] == 9
    assert runs == [] and task.progress


async def test_r10_r26_decided_not_happened_runs_the_call_with_its_key() -> None:
    """R10, R26: a person says the call never happened: it is planned again, same key."""
    task = in_doubt_task(status=Status.NEEDS_HUMAN)
    call = task.snap.call
    assert call is not None
    key = call.key

    await calls.human_decide(task, decide(task, "not_happened"))

    assert task.snap.status is Status.RUNNING
    assert task.snap.call is call and call.status is CallStatus.PLANNED and call.key == key
    assert task.finished == []


async def test_r10_r26_decided_skip_drops_the_call_and_moves_on() -> None:
    """R10, R26, R15: a person skips the call: it is dropped without running, recorded as
    skipped, and the rest of the to-do list is kept."""
    task = in_doubt_task(status=Status.NEEDS_HUMAN)
    call = task.snap.call
    assert call is not None

    await calls.human_decide(task, decide(task, "skip"))

    frame = task.snap.frame
    assert task.snap.call is None and [e.kind for e in frame.agenda] == ["reply"]
    assert frame.last_tool_error == {"tool": "pay", "key": call.key, "skipped": True, "by": "ann"}
    assert task.rows[-1] == {"role": "tool", "name": "pay", "key": call.key, "content": None,
                             "skipped": True}
    assert task.snap.step == 1 and task.finished == []


@pytest.mark.parametrize(("outcome", "key", "status", "error"), [
    ("maybe", None, CallStatus.STARTED, InvalidInput),
    ("happened", "another-key", CallStatus.STARTED, IllegalTransition),
    ("happened", None, CallStatus.FAILED, IllegalTransition),
])
async def test_r26_a_decision_that_does_not_fit_changes_nothing(
        outcome: str, key: str | None, status: CallStatus, error: type[Exception]) -> None:
    """R26, R10: an unknown outcome, another call's key or a call not in doubt is refused."""
    task = in_doubt_task(status=Status.NEEDS_HUMAN)
    call = task.snap.call
    assert call is not None
    call.status = status

    with pytest.raises(error):
        await calls.human_decide(task, lever("decide", {"outcome": outcome,
                                                           "key": key or call.key}))

    assert task.snap.status is Status.NEEDS_HUMAN and task.rows == [] and task.finished == []


# --------------------------------------------------------------------------- rollback


def rollback_setup(old_status: Status = Status.RUNNING, **old_changes: Any
                   ) -> tuple[FakeTask, FakeReads]:
    """A task at step 5 with four dialog rows; version 3 is kept, at step 2 with two rows."""
    reads = FakeReads()
    reads.rows = [{"role": "user", "content": n} for n in range(4)]
    old = make_snap(old_status, agenda=[Reply("again")], step=2)
    old.history_len = 2
    old.recovery.attempts = 1
    for name, value in old_changes.items():
        setattr(old, name, value)
    reads.heads[3] = old.dumps()
    current = make_snap(step=5)
    current.history_len = 4
    task = FakeTask(current, reads=reads, agents=[ScriptedAgent()],
                    tools=[make_tool(side_effect=True)], history=[dict(r) for r in reads.rows],
                    version=8)
    return task, reads


async def test_r14_rollback_swaps_in_the_kept_version_on_a_new_branch() -> None:
    """R14: a rollback replaces the state with the kept version's; its dialog is cut back to
    that version's rows, and later rows stay stored on their own branch."""
    task, reads = rollback_setup()

    await levers.rollback(task, lever("rollback", {"version": 3, "by": "ann"}))

    assert len(task.replaced) == 1
    snap = task.snap
    assert snap.step == 2 and [e.kind for e in snap.frame.agenda] == ["reply"]
    assert await task.history.rows() == reads.rows[:2]
    assert snap.history_segments == [[0, 2], [1, -1]]
    assert snap.recovery.attempts == 0 and snap.status is Status.RUNNING
    assert task.recovery_log == [(Strategy.ROLLBACK, 9, "rolled back to version 3 by ann")]


@pytest.mark.parametrize(("old_status", "status"), [
    (Status.PENDING, Status.RUNNING), (Status.NEEDS_HUMAN, Status.PAUSED),
    (Status.COMPLETED, Status.PAUSED), (Status.FAILED, Status.PAUSED),
    (Status.PAUSED, Status.PAUSED), (Status.RUNNING, Status.RUNNING)])
async def test_r14_a_rolled_back_task_can_go_on(old_status: Status, status: Status) -> None:
    """R14, R26: a version that was finished or parked comes back paused (a person then
    resumes it); a pending one comes back running."""
    task, _ = rollback_setup(old_status)

    await levers.rollback(task, lever("rollback", {"version": 3}))

    assert task.snap.status is status


async def test_e4_rollback_to_a_call_in_doubt_reuses_its_recorded_result() -> None:
    """E4, R10: rolled back to a version whose call was in flight, the call that since
    succeeded returns its recorded result and is not run again."""
    old = make_snap(agenda=[Reply("after")], step=2)
    call = open_call(old)
    task, reads = rollback_setup(call=call, stack=old.stack)
    reads.idempotency[call.key] = record_for(call, OutcomeStatus.SUCCEEDED, {"paid": 5})

    await levers.rollback(task, lever("rollback", {"version": 3}))

    assert task.strategies == [Strategy.ROLLBACK, Strategy.REUSE_RESULT]
    assert task.snap.call is None and task.snap.frame.last_tool_result == {"paid": 5}


async def test_e4_rollback_to_a_call_in_back_off_reuses_its_later_result() -> None:
    """E4, R10: rolled back to a version whose call was waiting out a retry, the call that
    succeeded since (same key, tool and arguments) returns its recorded result instead of
    being left open to run again."""
    old = make_snap(agenda=[Reply("after")], step=2)
    call = open_call(old, status=CallStatus.FAILED)
    call.retry_at = 123.0
    task, reads = rollback_setup(call=call, stack=old.stack)
    reads.idempotency[call.key] = record_for(call, OutcomeStatus.SUCCEEDED, {"paid": 5})

    await levers.rollback(task, lever("rollback", {"version": 3}))

    assert task.snap.call is None and task.snap.frame.last_tool_result == {"paid": 5}


async def test_e4_rollback_with_redo_side_effects_gives_calls_new_keys() -> None:
    """E4: redoing side effects is explicit: the key salt changes, so the open call is derived
    again under a new key instead of being answered from its record."""
    old = make_snap(agenda=[Reply("after")], step=2)
    call = open_call(old)
    task, _ = rollback_setup(call=call, stack=old.stack)

    await levers.rollback(task, lever("rollback", {"version": 3, "redo_side_effects": True}))

    snap = task.snap
    assert snap.key_salt == "~redo1" and snap.call is None
    assert snap.frame.agenda[0].kind == "tool_call" and snap.frame.agenda[0].open_call is None
    assert idempotency_key(TASK, "f0", snap.frame.steps, snap.key_salt) != call.key
    assert task.strategies == [Strategy.ROLLBACK]
    assert "side effects will be redone" in task.recovery_log[0][2]


async def test_e6_rollback_rearms_timed_waits_under_new_timer_ids() -> None:
    """E6, R14: a restored wait runs its timeout again from now, under a new timer id (the old
    one may have fired already)."""
    old = make_snap(Status.WAITING, step=2)
    old.frame.wait = {"event_type": "approval", "due_at": 100.0, "timeout": 30,
                      "timer": "timer:f0:1"}
    task, _ = rollback_setup(Status.WAITING, stack=old.stack)

    before = time.time()
    await levers.rollback(task, lever("rollback", {"version": 3}))
    after = time.time()

    wait = task.snap.frame.wait
    assert wait is not None and wait["timer"] == "timer:f0:1:r1"
    assert before + 30 <= wait["due_at"] <= after + 30


async def test_r14_a_cancelled_task_is_not_rolled_back() -> None:
    """R14: cancel is final; a rollback of a cancelled task is refused and recorded."""
    task, _ = rollback_setup()
    task.snap.status = Status.CANCELLED

    await levers.rollback(task, lever("rollback", {"version": 3}))

    assert task.replaced == [] and task.strategies == [Strategy.ROLLBACK_REFUSED]


async def test_r14_rollback_to_a_pruned_version_says_so() -> None:
    """R14: a version no longer kept cannot be rolled back to; nothing changes."""
    task, reads = rollback_setup()
    reads.heads.clear()

    with pytest.raises(VersionNotFound, match="no longer kept"):
        await levers.rollback(task, lever("rollback", {"version": 3}))

    assert task.replaced == [] and task.snap.step == 5


async def test_r14_rollback_uses_the_head_its_lever_captured() -> None:
    """R14: the head this process read when the lever was pulled is used, so pruning between
    the lever and its application cannot lose it."""
    task, reads = rollback_setup()
    task.captured[(9, 3)] = reads.heads.pop(3)

    await levers.rollback(task, lever("rollback", {"version": 3}))

    assert task.snap.step == 2 and task.strategies == [Strategy.ROLLBACK]


@pytest.mark.parametrize("version", [0, -1, "3", True, None, 3.0])
async def test_r14_rollback_needs_a_positive_whole_version(version: Any) -> None:
    """R14, R3: the version named must be a positive integer."""
    task, _ = rollback_setup()

    with pytest.raises(InvalidInput):
        await levers.rollback(task, lever("rollback", {"version": version}))

    assert task.replaced == []

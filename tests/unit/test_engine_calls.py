"""R10, R26, E4 (issue 26): the pieces of ``tether.engine.calls`` and ``forking`` that let any
process answer a person truthfully about a call, and apply a decision only to the state it
was made about.

- A call records what its tool declared (side effect, idempotent, a reconcile hook); whether
  it awaits a person follows that record, not a tool of the same name in the process asking
  (:func:`call_awaiting_decision`, :func:`awaiting_decision`), and a process whose tool of that
  name declares otherwise does not judge it (:func:`code_differs`).
- A decision carries its observation (key, attempt, dialog branch) and applies only while
  the task is still there (:func:`decision_applies`, :func:`human_decide`).
- A fork's copied calls get keys of its own (:func:`own_key`).
- Snapshot format 9 keeps the declaration; a format-8 head loads with none recorded.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from engine_double import FakeReads, FakeTask

from tether.engine.calls import (
    awaiting_decision,
    call_awaiting_decision,
    code_differs,
    decision_applies,
    declaration_of,
    human_decide,
    observation,
)
from tether.engine.forking import own_key
from tether.errors import CorruptSnapshot, StaleDecision
from tether.model import (
    SNAPSHOT_FORMAT,
    AgendaEntry,
    CallState,
    CallStatus,
    Declaration,
    Event,
    Frame,
    IdempotencyRecord,
    OutcomeStatus,
    Snapshot,
    Status,
)
from tether.tools import RetryPolicy, Tool, ToolContext, idempotency_key

BLIND = Declaration(side_effect=True, idempotent=False, reconciles=False)
HOOKED = Declaration(side_effect=True, idempotent=False, reconciles=True)
IDEMPOTENT = Declaration(side_effect=False, idempotent=True, reconciles=False)


async def _pay(ctx: ToolContext, order_id: str, cents: int) -> dict[str, Any]:
    return {"paid": order_id}


async def _found(ctx: ToolContext, order_id: str, cents: int) -> dict[str, Any] | None:
    return None


def refund_tool(*, hook: bool = False, idempotent: bool = False) -> Tool:
    tool = Tool(_pay, name="refund", side_effect=not idempotent, idempotent=idempotent,
                timeout=None, retry=RetryPolicy(max_attempts=1), interruptible=False)
    if hook:
        tool.reconcile(_found)
    return tool


def call(declared: Declaration | None = BLIND, status: CallStatus = CallStatus.STARTED,
         attempt: int = 1, key: str = "t1:f1:0") -> CallState:
    return CallState(key=key, tool="refund", args={"order_id": "A1", "cents": 100},
                     args_hash="h1", status=status, attempt=attempt, declared=declared)


def snapshot(open_call: CallState | None, status: Status = Status.NEEDS_HUMAN,
             segments: list[list[int]] | None = None) -> Snapshot:
    return Snapshot(task_id="t1", agent="refund", input=None, status=status, created_at=1.0,
                    stack=[Frame(agent="refund", frame_id="f1")], call=open_call,
                    history_segments=segments or [[0, -1]])


def record(status: OutcomeStatus, args_hash: str = "h1") -> IdempotencyRecord:
    return IdempotencyRecord("t1:f1:0", "t1", "refund", args_hash, status, attempts=1)


# ---------------------------------------------------------------------- declarations


@pytest.mark.parametrize(("tool", "declared"), [
    (refund_tool(), BLIND),
    (refund_tool(hook=True), HOOKED),
    (refund_tool(idempotent=True), IDEMPOTENT),
], ids=["side_effect", "with_hook", "idempotent"])
def test_r10_a_call_records_what_its_tool_declared(tool: Tool, declared: Declaration) -> None:
    """R10: what a call keeps of its tool: side effect, idempotent, a reconcile hook or not."""
    assert declaration_of(tool) == declared
    assert declared.settles_itself() is (declared.idempotent or declared.reconciles)


def test_r10_r26_code_differs_names_a_tool_that_is_missing_here() -> None:
    """R26: a process without the call's tool (a CLI without --app) may not judge it."""
    reason = code_differs(call(), {})
    assert reason is not None and "'refund' is not registered in this process" in reason


def test_r10_r26_code_differs_names_a_tool_of_the_same_name_declaring_otherwise() -> None:
    """R10/R26 (defect 1): the built-in examples' ``refund`` has a reconcile hook; the user's,
    which made the call, had none. The examples' tool may not judge the call, and the reason
    says what each declared."""
    reason = code_differs(call(BLIND), {"refund": refund_tool(hook=True)})
    assert reason is not None
    assert "here declares side-effecting, with a reconcile hook" in reason
    assert "declared side-effecting, without a reconcile hook" in reason
    other = code_differs(call(IDEMPOTENT), {"refund": refund_tool()})
    assert other is not None and "idempotent" in other


def test_r10_code_differs_lets_the_same_declaration_or_an_unrecorded_one_be_judged_here() -> None:
    """R10: the same declaration judges; a call opened before calls recorded declarations
    (None) is judged by the tool registered here, as before."""
    assert code_differs(call(HOOKED), {"refund": refund_tool(hook=True)}) is None
    assert code_differs(call(None), {"refund": refund_tool(hook=True)}) is None


# ---------------------------------------------------------------------- awaiting a person


def test_r10_r26_a_call_declared_without_a_hook_awaits_a_person_whatever_the_tool_here() -> None:
    """R10/R26 (defect 1): the process asking has another app's ``refund`` with a hook, or no
    ``refund`` at all: the call's own record says no hook, so it awaits a decision."""
    snap = snapshot(call(BLIND))
    assert call_awaiting_decision(snap, {"refund": refund_tool(hook=True)}) is snap.call
    assert call_awaiting_decision(snap, {}) is snap.call


@pytest.mark.parametrize("declared", [IDEMPOTENT, HOOKED], ids=["idempotent", "with_hook"])
def test_r10_r26_a_call_that_settles_itself_awaits_no_person_even_without_its_tool_here(
        declared: Declaration) -> None:
    """R10/R26 (issue 26, also seen): a call recorded as idempotent (or with a hook) is not in
    doubt for a process without the app's code; its worker re-runs (or reconciles) it."""
    assert call_awaiting_decision(snapshot(call(declared)), {}) is None


def test_r10_a_call_with_no_recorded_declaration_is_judged_by_the_tool_here() -> None:
    """R10: a call opened before format 9 (nothing recorded) awaits a person unless the tool
    registered here settles itself; a call not started awaits no one."""
    snap = snapshot(call(None))
    assert call_awaiting_decision(snap, {}) is snap.call
    assert call_awaiting_decision(snap, {"refund": refund_tool()}) is snap.call
    assert call_awaiting_decision(snap, {"refund": refund_tool(hook=True)}) is None
    for status in (CallStatus.PLANNED, CallStatus.FAILED):
        assert call_awaiting_decision(snapshot(call(BLIND, status)), {}) is None
    assert call_awaiting_decision(snapshot(None), {}) is None


@pytest.mark.parametrize(("stored", "awaits"), [
    (None, True),
    (record(OutcomeStatus.STARTED), True),
    (record(OutcomeStatus.SUCCEEDED), False),
    (record(OutcomeStatus.FAILED), False),
    (record(OutcomeStatus.SUCCEEDED, args_hash="other"), True),
], ids=["no_record", "started", "succeeded", "failed", "another_calls_record"])
async def test_r10_e4_a_call_whose_record_knows_its_outcome_awaits_no_person(
        stored: IdempotencyRecord | None, awaits: bool) -> None:
    """R10/E4 (defect 8): a started call whose idempotency record says it succeeded (or
    failed) is answered from the record, so no decision is asked (a fork at a resume point
    the source completed); a record of another call under that key does not count."""
    reads = FakeReads()
    if stored is not None:
        reads.idempotency[stored.key] = stored
    snap = snapshot(call(BLIND))
    assert (await awaiting_decision(reads, snap, {}) is snap.call) is awaits


# ---------------------------------------------------------------------- the observation


def test_r10_r26_a_decision_observes_the_calls_key_attempt_and_branch() -> None:
    snap = snapshot(call(BLIND, attempt=2), segments=[[0, 5], [3, -1]])
    assert observation(snap) == {"key": "t1:f1:0", "attempt": 2, "branch": 3,
                                 "status": "needs_human"}


SEEN = {"outcome": "not_happened", "key": "t1:f1:0", "attempt": 1, "branch": 0, "by": "bob"}


@pytest.mark.parametrize("status", [Status.NEEDS_HUMAN, Status.FAILED, Status.RUNNING])
def test_r10_r26_a_decision_applies_to_the_state_it_was_made_about_in_any_open_status(
        status: Status) -> None:
    """R10/R26 (defect 3): the in-doubt rule holds in every status, failed included."""
    assert decision_applies(snapshot(call(), status), SEEN) is None


@pytest.mark.parametrize(("snap", "why"), [
    (snapshot(call(), Status.COMPLETED), "the task is completed"),
    (snapshot(call(), Status.CANCELLED), "the task is cancelled"),
    (snapshot(None), "no longer the task's open call"),
    (snapshot(call(key="t1:f1:1")), "(now key=t1:f1:1)"),
    (snapshot(call(status=CallStatus.PLANNED)), "no longer in doubt (it is planned)"),
    (snapshot(call(attempt=2)), "attempt 1 of refund"),
    (snapshot(call(), segments=[[0, 3], [1, -1]]), "rolled back"),
], ids=["completed", "cancelled", "no_call", "other_key", "not_started", "attempted_again",
        "rolled_back"])
def test_r10_r26_a_decision_about_a_state_the_task_has_left_does_not_apply(
        snap: Snapshot, why: str) -> None:
    """R10/R26 (defect 2): settled, run again, attempted again or rolled back since: the
    decision is about a state that is gone, and the reason says which."""
    reason = decision_applies(snap, SEEN)
    assert reason is not None and why in reason


async def test_r10_r26_a_stale_decision_is_refused_and_changes_nothing() -> None:
    """R10/R26 (defect 2): :func:`human_decide` refuses a decision about attempt 1 once the
    call is in doubt at attempt 2: StaleDecision ("not applied"), the call stays in doubt,
    no dialog row, no recovery record, no status change."""
    task = FakeTask(snapshot(call(BLIND, attempt=2)), tools=[refund_tool()])
    with pytest.raises(StaleDecision, match="was not applied: it was made about attempt 1"):
        await human_decide(task, Event("decide", "t1", dict(SEEN), id=7))
    assert task.snap.call is not None and task.snap.call.status == CallStatus.STARTED
    assert task.snap.status is Status.NEEDS_HUMAN
    assert (task.rows, task.recovery_log, task.idempotency) == ([], [], [])


async def test_r10_r26_a_decision_about_the_state_as_it_is_is_applied() -> None:
    """R10/R26: the same decision made about attempt 2 is applied: the call runs again."""
    task = FakeTask(snapshot(call(BLIND, attempt=2)), tools=[refund_tool()])
    await human_decide(task, Event("decide", "t1", {**SEEN, "attempt": 2}, id=7))
    assert task.snap.call is not None and task.snap.call.status == CallStatus.PLANNED
    assert task.snap.status is Status.RUNNING
    assert [row["content"]["attempt"] for row in task.rows if row.get("type") == "decide"] == [2]


# ---------------------------------------------------------------------- a fork's own keys


def test_e4_a_forks_copied_call_gets_a_key_of_its_own() -> None:
    """E4 (defect 5): the fork's key for a copied call is its own (never its source's or
    another fork's), the same every time it is derived, and bounded in length however many
    forks deep."""
    source = idempotency_key("src", "f1", 3)
    mine = own_key("fork1", source)
    assert mine != source and mine.startswith("fork1:fork:")
    assert own_key("fork1", source) == mine
    assert own_key("fork2", source) != mine
    assert own_key("fork1", idempotency_key("src", "f1", 4)) != mine
    key = source
    for depth in range(50):
        key = own_key(f"fork{depth}", key)
    assert len(key) == len(own_key("fork49", source)) <= len("fork49:fork:") + 20


# ---------------------------------------------------------------------- snapshot format 9


def test_r10_snapshot_format_9_keeps_what_each_call_declared() -> None:
    """R10: the declaration of the current call and of a call put aside in the agenda
    survive dumps/loads as Declarations."""
    assert SNAPSHOT_FORMAT >= 9
    snap = snapshot(call(BLIND))
    snap.frame.agenda = [AgendaEntry({"kind": "tool_call", "name": "refund", "args": {}},
                                     open_call=call(HOOKED, CallStatus.FAILED))]
    loaded = Snapshot.loads(snap.dumps(), "t1", 2)
    assert loaded == snap
    assert loaded.call is not None and loaded.call.declared == BLIND
    assert loaded.frame.agenda[0].open_call is not None
    assert loaded.frame.agenda[0].open_call.declared == HOOKED


def test_r10_a_format_8_head_loads_with_no_declaration_recorded() -> None:
    """R10, E8: a head written before calls recorded declarations (format 8) is upgraded:
    its calls (current and put aside) say nothing was recorded, so the tool here judges."""
    snap = snapshot(call(None))
    snap.frame.agenda = [AgendaEntry({"kind": "tool_call", "name": "refund", "args": {}},
                                     open_call=call(None, CallStatus.FAILED))]
    raw = orjson.loads(snap.dumps())
    raw["format"] = 8
    del raw["call"]["declared"], raw["stack"][0]["agenda"][0]["open_call"]["declared"]
    loaded = Snapshot.loads(orjson.dumps(raw), "t1", 2)
    assert loaded.format == SNAPSHOT_FORMAT
    assert loaded.call is not None and loaded.call.declared is None
    assert loaded.frame.agenda[0].open_call is not None
    assert loaded.frame.agenda[0].open_call.declared is None
    assert loaded == snap


@pytest.mark.parametrize("declared", [
    {"side_effect": True, "idempotent": False, "reconciles": False, "trusted": True},
    {"side_effect": True, "idempotent": False},
    "blind",
], ids=["unknown_field", "missing_field", "not_an_object"])
def test_r10_a_damaged_declaration_is_damage_named_by_task_and_version(declared: Any) -> None:
    """R10, R13: a declaration no tether of this format writes makes the head unreadable
    (CorruptSnapshot naming the task and version), never a guess about the call."""
    raw = orjson.loads(snapshot(call(BLIND)).dumps())
    raw["call"]["declared"] = declared
    with pytest.raises(CorruptSnapshot, match="task t1 version 2"):
        Snapshot.loads(orjson.dumps(raw), "t1", 2)


def test_e4_a_redo_forgets_every_open_call_also_one_put_aside_in_a_parent_frame() -> None:
    """E4: a rollback or fork with redo_side_effects derives every open call's key again; a
    call a parent put aside (in its agenda) while a subtask runs above it kept its old key
    before, so the "redo" answered it from the old record under the source's key."""
    from tether.engine.levers import reopen_call

    parked = CallState(key="src:parent:2", tool="pay", args={}, args_hash="h",
                       status=CallStatus.FAILED, attempt=1)
    parent = Frame(agent="a", frame_id="parent", agenda=[
        AgendaEntry({"kind": "spawn", "agent": "b", "input": None}),
        AgendaEntry({"kind": "tool_call", "name": "pay", "args": {}}, open_call=parked)])
    child = Frame(agent="b", frame_id="child", agenda=[
        AgendaEntry({"kind": "tool_call", "name": "pay", "args": {}})])
    snap = Snapshot(task_id="src", agent="a", input=None, stack=[parent, child],
                    call=CallState(key="src:child:0", tool="pay", args={}, args_hash="h"))
    child.agenda[0].open_call = None

    reopen_call(snap)

    assert snap.call is None
    assert all(entry.open_call is None for frame in snap.stack for entry in frame.agenda)

"""Crash tests with real processes killed by SIGKILL (R1, R10, R13, R16, R19).

Every scenario runs the harness in a child process (``tests/chaos/app.py``),
kills it with SIGKILL -- at a named failpoint, or from here after a handshake
-- and then lets a fresh child finish the work. The checks are about the
outside world (the payment provider's ledger, which no crash can roll back)
as much as about tether's own state. ``test_negative_control_*`` proves the
checks can fail.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from _child import ChildProcess

import tether as tt
from tether.failpoints import POINTS

HERE = Path(__file__).resolve().parent
APP_PATH = HERE / "app.py"
_spec = importlib.util.spec_from_file_location("tether_chaos_app", APP_PATH)
assert _spec is not None and _spec.loader is not None
app = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(app)

T = TypeVar("T")
KILLED = -signal.SIGKILL
CHILD_TIMEOUT = 20.0

pytestmark = pytest.mark.timeout(60)

# The mixed task: tool call n (1-based) is the n-th pass of ``inside_tool``.
#   1 lookup o0 | 2 refund_keyed o1 | 3 refund_reconciled o2 | 4 lookup o3 | 5 refund_keyed o4
# Commits (mid_checkpoint / after_checkpoint passes): call n's resume point is commit 2n-1,
# its result commit 2n; commit 11 carries out Finish. before_plan_recorded: pass n precedes
# call n, pass 6 precedes Finish.
MIXED_CALLS = [
    ["lookup", "o0", 0],
    ["refund_keyed", "o1", 11],
    ["refund_reconciled", "o2", 22],
    ["lookup", "o3", 0],
    ["refund_keyed", "o4", 44],
]
MIXED_REFUNDS = ["o1", "o2", "o4"]
MIXED_LOOKUPS = ["o0", "o3"]

# The blind task: call 2 is the refund nobody can reconcile.
BLIND_CALLS = [
    ["lookup", "b0", 0],
    ["refund_blind", "b1", 15],
    ["refund_keyed", "b2", 25],
]


# ---------------------------------------------------------------------- child processes


@dataclass
class Paths:
    dir: Path
    db: Path
    ledger: Path


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    p = Paths(tmp_path, tmp_path / "tether.db", tmp_path / "provider.db")
    app.init_ledger(p.ledger)
    return p


class Child(ChildProcess):
    """One worker (or emitter) process running app.py."""

    _count = 0

    def __init__(self, paths: Paths, mode: str = "drain", failpoints: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        Child._count += 1
        clean = {k: v for k, v in os.environ.items()
                 if k != "TETHER_FAILPOINTS" and not k.startswith("TETHER_CHAOS")}
        clean.update(TETHER_CHAOS_DB=str(paths.db), TETHER_CHAOS_LEDGER=str(paths.ledger),
                     PYTHONUNBUFFERED="1", TETHER_CHAOS_DEADLINE=str(CHILD_TIMEOUT))
        if failpoints:
            clean["TETHER_FAILPOINTS"] = failpoints
        clean.update(env or {})
        super().__init__([sys.executable, str(APP_PATH), mode], clean, paths.dir,
                         f"child{Child._count}", CHILD_TIMEOUT)
        self.label = f"child{Child._count}({mode}, {failpoints or 'no failpoints'})"

    def assert_killed(self, timeout: float = CHILD_TIMEOUT) -> None:
        code = self.wait(timeout)
        assert code == KILLED, (f"{self.label}: expected death by SIGKILL (-9), got exit code"
                                f" {code}: the failpoint never fired; stdout {self.seen};"
                                f" stderr:\n{self.stderr()}")

    def assert_clean_exit(self, timeout: float = CHILD_TIMEOUT) -> None:
        code = self.wait(timeout)
        assert code == 0, f"{self.label}: exit code {code}; stderr:\n{self.stderr()}"


@pytest.fixture
def children() -> Iterator[Callable[..., Child]]:
    started: list[Child] = []

    def start(*args: Any, **kwargs: Any) -> Child:
        child = Child(*args, **kwargs)
        started.append(child)
        return child

    yield start
    for child in started:  # only the processes this test started, each by its pid
        if child.proc.poll() is None:
            child.kill()


# ---------------------------------------------------------------------- parent-side harness


def with_harness(paths: Paths, fn: Callable[[tt.Harness], Awaitable[T]], unsafe: bool = False) -> T:
    async def go() -> T:
        harness = app.build_harness(paths.db, paths.ledger, unsafe=unsafe)
        try:
            return await fn(harness)
        finally:
            await harness.close()

    return asyncio.run(go())


def submit(paths: Paths, agent: str, input: Any, task_id: str) -> str:
    return with_harness(paths, lambda h: h.submit(agent, input, task_id=task_id))


@dataclass
class TaskState:
    status: str
    reason: str | None
    error: str | None
    result: Any
    versions: list[int]
    strategies: list[str]
    log: list[dict[str, Any]] = field(default_factory=list)
    idempotency: dict[str, str] = field(default_factory=dict)


def state(paths: Paths, task_id: str) -> TaskState:
    """The task as stored, after checking that every kept snapshot version loads."""

    async def go(h: tt.Harness) -> TaskState:
        info = await h.get(task_id)
        versions = [v for v, _, _ in await h.store.list_versions(task_id)]
        assert versions, f"task {task_id} keeps no snapshot version"
        assert len(versions) <= h.settings.keep_versions
        for version in versions:
            _, data = await h.store.load_head(task_id, version)
            snap = tt.Snapshot.loads(data, task_id, version)  # raises CorruptSnapshot if damaged
            assert snap.task_id == task_id
        log = await h.store.list_recovery_log(task_id)
        records = await h.store.list_idempotency(task_id)
        return TaskState(info.record.status.value, info.record.reason, info.snapshot.error,
                         info.snapshot.result, versions,
                         [r["resume_strategy"] for r in log], log,
                         {r.tool + ":" + str(r.key): r.status for r in records})

    return with_harness(paths, go)


def wait_for_status(paths: Paths, task_id: str, status: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while True:
        current = with_harness(paths, lambda h: h.store.get_task(task_id)).status.value
        if current == status:
            return
        assert time.monotonic() < end, f"task {task_id} is {current}, never became {status}"
        time.sleep(0.05)


def refund_problems(ledger: Path, once: Sequence[str] = (), never: Sequence[str] = (),
                    at_most_once: Sequence[str] = ()) -> list[str]:
    """THE checker: every problem with the provider's ledger, as readable lines.

    ``once``: orders that must have been paid exactly once; ``never``: not at
    all; ``at_most_once``: 0 or 1. Any order paid twice, or paid without being
    expected, is a problem too.
    """
    counts = app.refund_counts(ledger)
    problems = []
    for order in once:
        if counts[order] != 1:
            problems.append(f"order {order} refunded {counts[order]} times, expected exactly once")
    for order in never:
        if counts[order] != 0:
            problems.append(f"order {order} refunded {counts[order]} times, expected never")
    for order in at_most_once:
        if counts[order] > 1:
            problems.append(f"order {order} refunded {counts[order]} times, expected at most once")
    expected = {*once, *never, *at_most_once}
    for order, count in sorted(counts.items()):
        if order not in expected:
            problems.append(f"order {order} refunded {count} times, but no task asked for it")
    return problems


def run_to_kill(paths: Paths, children: Callable[..., Child], failpoints: str,
                env: dict[str, str] | None = None) -> None:
    """A worker armed with *failpoints* must die by SIGKILL; then a fresh one finishes."""
    doomed = children(paths, "drain", failpoints=failpoints, env=env)
    doomed.expect("READY")
    doomed.assert_killed()
    rescuer = children(paths, "drain", env=env)
    rescuer.expect("READY")
    rescuer.assert_clean_exit()


# ---------------------------------------------------------------------- the baseline


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The mixed task's result in an uninterrupted run (a real child, no failpoints)."""
    d = tmp_path_factory.mktemp("baseline")
    p = Paths(d, d / "tether.db", d / "provider.db")
    app.init_ledger(p.ledger)
    submit(p, "refunder", {"calls": MIXED_CALLS}, "base")
    child = Child(p, "drain")
    child.expect("READY")
    child.assert_clean_exit()
    st = state(p, "base")
    assert st.status == "completed", st
    assert refund_problems(p.ledger, once=MIXED_REFUNDS) == []
    assert app.lookup_counts(p.ledger) == {"o0": 1, "o3": 1}
    assert "resume" not in st.strategies
    assert st.result == app.expected_summary(MIXED_CALLS)
    return st.result


def test_failpoint_names_used_here_exist() -> None:
    for name in ("before_plan_recorded", "after_resume_point", "inside_tool",
                 "after_tool_before_commit", "mid_checkpoint", "after_checkpoint", "event_stored",
                 "during_recovery", "during_rollback"):
        assert name in POINTS


# ---------------------------------------------------------------------- kill at every failpoint

# (failpoint spec, recovery strategy the rescuer must log or None, is the crash a recovery?)
MIXED_SCENARIOS = [
    ("before_plan_recorded@2", None, True),        # lookup o0 done; keyed o1 not yet planned
    ("before_plan_recorded@6", None, True),        # all calls done; Finish not yet recorded
    ("after_resume_point@1", "rerun_idempotent", True),    # lookup o0 in doubt, never ran
    ("after_resume_point@2", "reconcile_not_done", True),  # keyed o1 in doubt, never ran
    ("after_resume_point@3", "reconcile_not_done", True),  # reconciled o2 in doubt, never ran
    ("inside_tool@1", "rerun_idempotent", True),   # lookup o0 ran, result lost
    ("inside_tool@2", "reconcile", True),          # keyed o1 PAID, result lost
    ("inside_tool@3", "reconcile", True),          # reconciled o2 PAID, result lost
    ("inside_tool@5", "reconcile", True),          # keyed o4 PAID, result lost
    ("after_tool_before_commit@2", "reconcile", True),
    ("after_tool_before_commit@3", "reconcile", True),
    ("after_tool_before_commit@4", "rerun_idempotent", True),
    ("mid_checkpoint@3", None, True),              # keyed o1's resume point rolled back
    ("mid_checkpoint@4", "reconcile", True),       # keyed o1's result commit rolled back
    ("mid_checkpoint@6", "reconcile", True),       # reconciled o2's result commit rolled back
    ("mid_checkpoint@11", None, True),             # the Finish commit rolled back
    ("after_checkpoint@3", "reconcile_not_done", True),
    ("after_checkpoint@4", None, True),
    ("after_checkpoint@11", None, False),          # completed and committed, then killed
]


@pytest.mark.parametrize(("spec", "strategy", "recovers"), MIXED_SCENARIOS,
                         ids=[s[0] for s in MIXED_SCENARIOS])
def test_sigkill_at_failpoint_then_fresh_worker_finishes(
        paths: Paths, children: Callable[..., Child], baseline: Any,
        spec: str, strategy: str | None, recovers: bool) -> None:
    assert spec.partition("@")[0] in POINTS
    submit(paths, "refunder", {"calls": MIXED_CALLS}, "t1")
    run_to_kill(paths, children, spec)

    st = state(paths, "t1")  # also loads every kept snapshot version
    assert st.status == "completed", (st.status, st.reason, st.log)
    # the outside world: every keyed / reconciled refund happened exactly once
    assert refund_problems(paths.ledger, once=MIXED_REFUNDS) == []
    # the idempotent lookup may have run again, but at most once more
    lookups = app.lookup_counts(paths.ledger)
    assert set(lookups) == set(MIXED_LOOKUPS)
    assert all(1 <= lookups[o] <= 2 for o in MIXED_LOOKUPS), lookups
    # the result is exactly what an uninterrupted run returns
    assert st.result == baseline
    # and the rescuer really recovered (and chose the right strategy for the in-doubt call)
    assert ("resume" in st.strategies) is recovers, st.strategies
    if strategy is not None:
        assert strategy in st.strategies, st.strategies
    # a lookup runs twice exactly when the kill came after it ran and before its result commit
    ran_twice = spec in ("inside_tool@1", "after_tool_before_commit@4")
    assert sum(lookups.values()) == (3 if ran_twice else 2), lookups
    assert all(status == "succeeded" for status in st.idempotency.values()), st.idempotency


DEFERRED_KILLS = [f"{point}@{n}" for point in ("before_plan_recorded", "inside_tool",
                                                "after_tool_before_commit", "mid_checkpoint",
                                                "after_checkpoint") for n in (1, 2, 4)]


@pytest.mark.parametrize("spec", DEFERRED_KILLS)
def test_sigkill_with_deferred_idempotent_results_keeps_every_guarantee(
        paths: Paths, children: Callable[..., Child], baseline: Any, spec: str) -> None:
    """R10, R25: with the default deferral of quick idempotent results (one fsync per step),
    a kill anywhere still pays each refund exactly once, re-runs a lookup at most once more,
    and ends with the uninterrupted result. Exact re-run positions differ, so only the
    invariants are asserted here; the enumerated table above pins positions down."""
    submit(paths, "refunder", {"calls": MIXED_CALLS}, "t1")
    run_to_kill(paths, children, spec, env={"TETHER_CHAOS_DEFER": "1"})
    st = state(paths, "t1")
    assert st.status == "completed", (st.status, st.reason, st.log)
    assert refund_problems(paths.ledger, once=MIXED_REFUNDS) == []
    lookups = app.lookup_counts(paths.ledger)
    assert all(1 <= lookups[o] <= 2 for o in MIXED_LOOKUPS), lookups
    assert st.result == baseline


# ---------------------------------------------------------------------- blind side effects

BLIND_SCENARIOS = [
    ("inside_tool@2", True),               # paid, then killed inside the tool
    ("after_tool_before_commit@2", True),  # paid, returned, killed before the result commit
    ("mid_checkpoint@4", True),            # paid, result commit rolled back by the kill
    ("after_resume_point@2", False),       # killed after the resume point, before paying
]


@pytest.mark.parametrize(("spec", "paid"), BLIND_SCENARIOS, ids=[s[0] for s in BLIND_SCENARIOS])
def test_blind_refund_in_doubt_is_not_repeated_and_goes_to_a_person(
        paths: Paths, children: Callable[..., Child], spec: str, paid: bool) -> None:
    submit(paths, "refunder", {"calls": BLIND_CALLS}, "blind")
    run_to_kill(paths, children, spec)

    st = state(paths, "blind")
    assert st.status == "needs_human", (st.status, st.log)
    for reason in (st.reason, st.error):
        assert reason is not None and "outcome unknown" in reason, reason
        assert "refund_blind" in reason, reason
    # never repeated: paid exactly as often as the killed worker paid (once or not at all)
    if paid:
        assert refund_problems(paths.ledger, once=["b1"], never=["b2"]) == []
    else:
        assert refund_problems(paths.ledger, never=["b1", "b2"]) == []
    assert "resume" in st.strategies and "needs_human" in st.strategies, st.strategies
    blind_records = {k: v for k, v in st.idempotency.items() if k.startswith("refund_blind:")}
    assert list(blind_records.values()) == ["started"], st.idempotency

    # a second worker run leaves it alone: still parked, still paid at most once
    again = children(paths, "drain")
    again.expect("READY")
    again.assert_clean_exit()
    assert state(paths, "blind").status == "needs_human"
    assert app.refund_counts(paths.ledger)["b1"] == (1 if paid else 0)


# ---------------------------------------------------------------------- kill from outside (R10)


@pytest.mark.parametrize("tool", ["refund_reconciled", "refund_keyed"])
def test_parent_sigkills_worker_blocked_in_slow_refund(
        paths: Paths, children: Callable[..., Child], tool: str) -> None:
    """The refund example: paid, no answer yet, process killed. Reconcile, never pay twice."""
    calls = [[tool, "s1", 99]]
    submit(paths, "refunder", {"calls": calls}, "slow")
    worker = children(paths, "serve", env={"TETHER_CHAOS_SLOW_TOOL": tool,
                                           "TETHER_CHAOS_SLOW": "60"})
    worker.expect("READY")
    worker.expect("IN_TOOL s1")
    assert worker.kill() == KILLED
    assert app.refund_counts(paths.ledger)["s1"] == 1  # the provider did pay

    rescuer = children(paths, "drain")
    rescuer.expect("READY")
    rescuer.assert_clean_exit()
    st = state(paths, "slow")
    assert st.status == "completed", (st.status, st.reason)
    assert refund_problems(paths.ledger, once=["s1"]) == []
    assert "reconcile" in st.strategies, st.strategies
    assert st.result == app.expected_summary(calls)


# ---------------------------------------------------------------------- approvals (R16, R19)


def _approval_finishes(paths: Paths, children: Callable[..., Child], task_id: str,
                       approver: str, source: str) -> None:
    rescuer = children(paths, "drain")
    rescuer.expect("READY")
    rescuer.assert_clean_exit()
    st = state(paths, task_id)
    assert st.status == "completed", (st.status, st.reason, st.log)
    assert st.result["approval"] == {"approver": approver}
    assert st.result["approval_source"] == source
    assert st.result["refund"] == app.refund_result(f"{task_id}-order", 7)
    assert refund_problems(paths.ledger, once=[f"{task_id}-order"]) == []


def test_approval_emitted_while_no_worker_runs_is_found(
        paths: Paths, children: Callable[..., Child]) -> None:
    submit(paths, "approver", {"order": "ap-order", "amount": 7}, "ap")
    worker = children(paths, "serve")
    worker.expect("READY")
    wait_for_status(paths, "ap", "waiting")
    assert worker.kill() == KILLED
    receipt = with_harness(paths, lambda h: h.emit(
        tt.Event("approval", "ap", {"approver": "alice"}, source_event_id="approval-1")))
    assert receipt.accepted and receipt.outcome == "stored"
    assert app.refund_counts(paths.ledger)["ap-order"] == 0  # nothing ran without a worker
    _approval_finishes(paths, children, "ap", "alice", "event")


def test_approval_emitted_while_dead_worker_still_holds_the_lease(
        paths: Paths, children: Callable[..., Child]) -> None:
    submit(paths, "approver", {"order": "al-order", "amount": 7}, "al")
    # commit 1 is the Wait; the worker dies right after it, before releasing its lease
    doomed = children(paths, "drain", failpoints="after_checkpoint@1")
    doomed.expect("READY")
    doomed.assert_killed()
    record = with_harness(paths, lambda h: h.store.get_task("al"))
    assert record.status.value == "waiting" and record.lease_owner is not None
    receipt = with_harness(paths, lambda h: h.emit(
        tt.Event("approval", "al", {"approver": "bob"}, source_event_id="approval-2")))
    assert receipt.accepted
    _approval_finishes(paths, children, "al", "bob", "event")


def test_approval_given_outside_tether_is_seen_by_check_wait(
        paths: Paths, children: Callable[..., Child]) -> None:
    """R16: the approval system says yes but no event is ever delivered; resume must notice."""
    submit(paths, "approver", {"order": "ext-order", "amount": 7}, "ext")
    worker = children(paths, "serve")
    worker.expect("READY")
    wait_for_status(paths, "ext", "waiting")
    assert worker.kill() == KILLED
    app.record_approval(paths.ledger, "ext", "carol")
    _approval_finishes(paths, children, "ext", "carol", "check_wait")
    assert "wait_validated" in state(paths, "ext").strategies


# ---------------------------------------------------------------------- durable events (R19)


def test_event_acknowledged_just_before_sigkill_is_never_lost(
        paths: Paths, children: Callable[..., Child]) -> None:
    submit(paths, "approver", {"order": "ev-order", "amount": 7}, "ev")
    worker = children(paths, "serve")
    worker.expect("READY")
    wait_for_status(paths, "ev", "waiting")
    assert worker.kill() == KILLED

    spec = {"type": "approval", "task_id": "ev", "payload": {"approver": "dave"},
            "source_event_id": "approval-ev"}
    emitter = children(paths, "emit", env={"TETHER_CHAOS_EVENT": json.dumps(spec)})
    line = emitter.expect("EMITTED")
    assert emitter.kill() == KILLED  # killed the instant emit() returned
    _, event_id, outcome = line.split()
    assert outcome == "stored"

    pending = with_harness(paths, lambda h: h.store.pending_events("ev"))
    assert [(e.event.id, e.event.type, e.event.payload) for e in pending] == \
        [(int(event_id), "approval", {"approver": "dave"})]
    _approval_finishes(paths, children, "ev", "dave", "event")
    # dedup is durable too (R6): the same source_event_id again is refused after all this
    again = with_harness(paths, lambda h: h.emit(tt.Event(**spec)))
    assert not again.accepted and again.outcome == "duplicate" and again.event_id == int(event_id)


def test_emit_killed_before_commit_stores_nothing_and_retry_is_accepted(
        paths: Paths, children: Callable[..., Child]) -> None:
    """No acknowledgement, no promise: a half-stored event must not appear, and the retry works."""
    submit(paths, "approver", {"order": "ek-order", "amount": 7}, "ek")
    worker = children(paths, "serve")
    worker.expect("READY")
    wait_for_status(paths, "ek", "waiting")
    assert worker.kill() == KILLED

    spec = {"type": "approval", "task_id": "ek", "payload": {"approver": "erin"},
            "source_event_id": "approval-ek"}
    emitter = children(paths, "emit", failpoints="event_stored@1",
                       env={"TETHER_CHAOS_EVENT": json.dumps(spec)})
    emitter.assert_killed()
    assert not any(line.startswith("EMITTED") for line in emitter.seen)
    events = with_harness(paths, lambda h: h.store.pending_events("ek"))
    assert events == []
    receipt = with_harness(paths, lambda h: h.emit(tt.Event(**spec)))
    assert receipt.accepted and receipt.outcome == "stored"
    _approval_finishes(paths, children, "ek", "erin", "event")


# ---------------------------------------------------------------------- two workers (R13)


def test_two_workers_one_killed_every_task_completes_each_side_effect_once(
        paths: Paths, children: Callable[..., Child]) -> None:
    tasks = {f"w{i:02d}": [["refund_keyed", f"w{i:02d}-a", 10 + i],
                           ["lookup", f"w{i:02d}-b", 0],
                           ["refund_reconciled", f"w{i:02d}-c", 100 + i]] for i in range(20)}

    async def submit_all(h: tt.Harness) -> None:
        for task_id, calls in tasks.items():
            await h.submit("refunder", {"calls": calls}, task_id=task_id)

    with_harness(paths, submit_all)
    gate = paths.dir / "go"
    env = {"TETHER_CHAOS_GATE": str(gate), "TETHER_CHAOS_TOOL_DELAY": "0.02"}
    doomed = children(paths, "drain", failpoints="inside_tool@10", env=env)
    survivor = children(paths, "drain", env=env)
    doomed.expect("READY")
    survivor.expect("READY")
    gate.touch()  # both start taking work at the same moment
    doomed.assert_killed()
    survivor.assert_clean_exit(timeout=30)

    once = [order for calls in tasks.values() for tool, order, _ in calls if tool != "lookup"]
    assert refund_problems(paths.ledger, once=once) == []
    lookups = app.lookup_counts(paths.ledger)
    assert all(1 <= lookups[f"{t}-b"] <= 2 for t in tasks), lookups
    # both workers did real work on the shared file
    assert {doomed.proc.pid, survivor.proc.pid} <= app.ledger_pids(paths.ledger)
    recovered = 0
    for task_id, calls in tasks.items():
        st = state(paths, task_id)
        assert st.status == "completed", (task_id, st.status, st.reason, st.log)
        assert st.result == app.expected_summary(calls), task_id
        recovered += "resume" in st.strategies
    assert recovered >= 1  # the killed worker's tasks were taken over after its leases expired


# ---------------------------------------------------------------------- negative control


def test_negative_control_unprotected_refund_is_paid_twice_and_the_checker_says_so(
        paths: Paths, children: Callable[..., Child], baseline: Any) -> None:
    """Same kill as inside_tool@2, with provider dedup AND harness protection switched off.

    If this test ever fails, the chaos tests above prove nothing: either the kill
    no longer lands inside the refund, or the checker cannot see a double refund.
    """
    unsafe = {"TETHER_CHAOS_UNSAFE": "1"}
    submit(paths, "refunder", {"calls": MIXED_CALLS}, "t1")
    run_to_kill(paths, children, "inside_tool@2", env=unsafe)

    st = state(paths, "t1")
    assert st.status == "completed"  # the harness is none the wiser...
    assert st.result == baseline
    assert "rerun_idempotent" in st.strategies
    problems = refund_problems(paths.ledger, once=MIXED_REFUNDS)  # ...but the checker is
    assert problems == ["order o1 refunded 2 times, expected exactly once"]


# ---------------------------------------------------------------------- crash loops and ghosts


def test_three_rescuers_at_once_recover_a_crashed_task_exactly_once(
        paths: Paths, children: Callable[..., Child]) -> None:
    """R21: several workers see the same dead lease; one recovery, one reconcile, one refund."""
    submit(paths, "refunder", {"calls": MIXED_CALLS}, "t1")
    doomed = children(paths, "drain", failpoints="inside_tool@2")
    doomed.expect("READY")
    doomed.assert_killed()
    gate = paths.dir / "go"
    rescuers = [children(paths, "drain", env={"TETHER_CHAOS_GATE": str(gate)}) for _ in range(3)]
    for rescuer in rescuers:
        rescuer.expect("READY")
    gate.touch()
    for rescuer in rescuers:
        rescuer.assert_clean_exit()
    st = state(paths, "t1")
    assert st.status == "completed", (st.status, st.reason)
    assert refund_problems(paths.ledger, once=MIXED_REFUNDS) == []
    assert st.strategies.count("resume") == 1, st.strategies
    assert st.strategies.count("reconcile") == 1, st.strategies


def test_tool_that_kills_every_worker_ends_in_needs_human(
        paths: Paths, children: Callable[..., Child]) -> None:
    """A poison call (the process dies inside it every time) must not crash workers forever (R12).

    Run 1 dies on the first try; runs 2-4 are recoveries 1-3 (max_recovery_attempts=3)
    and die too; run 5 is recovery 4 and must hand the task to a person instead of
    calling the tool again, though it is armed to die there as well.
    """
    submit(paths, "refunder", {"calls": [["lookup", "p0", 0]]}, "poison")
    for _ in range(4):
        doomed = children(paths, "drain", failpoints="inside_tool@1")
        doomed.expect("READY")
        doomed.assert_killed()
    last = children(paths, "drain", failpoints="inside_tool@1")
    last.expect("READY")
    last.assert_clean_exit()
    st = state(paths, "poison")
    assert st.status == "needs_human", (st.status, st.strategies)
    assert st.reason is not None and "gave up after 3 recoveries" in st.reason, st.reason
    assert app.lookup_counts(paths.ledger)["p0"] == 4


RECOVERY_DEATHS = {
    "during_recovery_failpoint": ({}, "during_recovery@1"),
    "reconcile_hook_kills_process": ({"TETHER_CHAOS_RECONCILE_KILL": "1"}, None),
}


@pytest.mark.parametrize("death", list(RECOVERY_DEATHS))
def test_worker_dying_during_recovery_still_uses_up_the_recovery_budget(
        paths: Paths, children: Callable[..., Child], death: str) -> None:
    """R12 + E5: every expired lease is a recovery attempt, even one that died while recovering.

    The refund o1 is in doubt after the first kill. Workers 2-4 each die inside the
    recovery -- at the ``during_recovery`` failpoint, or because the tool's reconcile
    hook takes the process down -- i.e. three crashed recoveries. Worker 5 is the
    fourth recovery of the same resume point: past max_recovery_attempts=3 it must
    hand the task to a person, not go on recovering. (If crashes during recovery are
    never counted, a task whose recovery kills the process loops forever.)
    """
    submit(paths, "refunder", {"calls": MIXED_CALLS}, "t1")
    first = children(paths, "drain", failpoints="inside_tool@2")
    first.expect("READY")
    first.assert_killed()
    env, failpoints = RECOVERY_DEATHS[death]
    for _ in range(3):
        doomed = children(paths, "drain", failpoints=failpoints, env=env)
        doomed.expect("READY")
        doomed.assert_killed()
    last = children(paths, "drain")
    last.expect("READY")
    last.assert_clean_exit()
    st = state(paths, "t1")
    # whatever happens, never twice
    assert refund_problems(paths.ledger, once=["o1"], at_most_once=["o2", "o4"]) == []
    assert st.status == "needs_human", (st.status, st.strategies)
    assert st.reason is not None and "gave up after 3 recoveries" in st.reason, st.reason


def test_person_resuming_after_reconcile_killed_every_worker_reconciles_and_never_pays_twice(
        paths: Paths, children: Callable[..., Child], baseline: Any) -> None:
    """R10 + R26: a refund whose reconcile hook took down every recovering worker parks the
    task with a person. Their plain ``tether resume`` (no patch, no message about the call)
    must resolve the call in doubt -- reconcile it now that the provider answers -- and not
    re-run it: ``refund_reconciled`` pays on every call, so a blind re-run pays o2 twice.
    (Regression: a person's resume once marked the in-doubt call "planned" and re-ran it.)
    """
    submit(paths, "refunder", {"calls": MIXED_CALLS}, "t1")
    first = children(paths, "drain", failpoints="inside_tool@3")  # o2 paid, result lost
    first.expect("READY")
    first.assert_killed()
    for _ in range(3):  # three recoveries, each killed inside the reconcile hook
        doomed = children(paths, "drain", env={"TETHER_CHAOS_RECONCILE_KILL": "1"})
        doomed.expect("READY")
        doomed.assert_killed()
    parker = children(paths, "drain")
    parker.expect("READY")
    parker.assert_clean_exit()
    parked = state(paths, "t1")
    assert parked.status == "needs_human", (parked.status, parked.strategies)
    assert app.refund_counts(paths.ledger)["o2"] == 1

    resumed = cli(paths, "resume", "t1")
    assert resumed.returncode == 0, (resumed.stdout, resumed.stderr)
    finisher = children(paths, "drain")
    finisher.expect("READY")
    finisher.assert_clean_exit()
    st = state(paths, "t1")
    assert refund_problems(paths.ledger, once=MIXED_REFUNDS) == []
    assert st.status == "completed", (st.status, st.reason, st.strategies)
    assert st.result == baseline
    assert "human_rerun" not in st.strategies, st.strategies
    assert st.strategies.index("human_resume") < st.strategies.index("reconcile"), st.strategies


# ---------------------------------------------------------------------- killed while recovering

FAST_LEASE = {"TETHER_CHAOS_LEASE": "0.3", "TETHER_CHAOS_POLL": "0.02"}

# (kill that leaves a refund in doubt, the order in doubt, paid by then?, strategy of the rescue)
RECOVERY_KILLS = [
    ("inside_tool@2", "o1", True, "reconcile"),             # keyed o1 PAID, result lost
    ("inside_tool@3", "o2", True, "reconcile"),             # reconciled o2 PAID, result lost
    ("after_resume_point@3", "o2", False, "reconcile_not_done"),  # reconciled o2 never ran
]


@pytest.mark.parametrize(("first", "order", "paid", "strategy"), RECOVERY_KILLS,
                         ids=[k[0] for k in RECOVERY_KILLS])
def test_worker_killed_while_recovering_an_in_doubt_refund_next_one_still_reconciles(
        paths: Paths, children: Callable[..., Child], baseline: Any,
        first: str, order: str, paid: bool, strategy: str) -> None:
    """``during_recovery``: the worker recovering an in-doubt refund dies before deciding
    anything. The next worker must still reconcile it (not re-run it, not lose it), and the
    dead recovery counts as one (R12)."""
    submit(paths, "refunder", {"calls": MIXED_CALLS}, "t1")
    doomed = children(paths, "drain", failpoints=first, env=FAST_LEASE)
    doomed.expect("READY")
    doomed.assert_killed()
    assert app.refund_counts(paths.ledger)[order] == int(paid)
    before = state(paths, "t1")

    recovering = children(paths, "drain", failpoints="during_recovery@1", env=FAST_LEASE)
    recovering.expect("READY")
    recovering.assert_killed()
    # it died inside restore(): nothing decided, nothing paid, nothing committed
    during = state(paths, "t1")
    assert during.versions == before.versions
    assert during.strategies == before.strategies == []
    assert app.refund_counts(paths.ledger)[order] == int(paid)

    rescuer = children(paths, "drain", env=FAST_LEASE)
    rescuer.expect("READY")
    rescuer.assert_clean_exit()
    st = state(paths, "t1")
    assert st.status == "completed", (st.status, st.reason, st.log)
    assert refund_problems(paths.ledger, once=MIXED_REFUNDS) == []
    assert st.result == baseline
    assert st.strategies.count("resume") == 1, st.strategies
    assert st.strategies.count(strategy) == 1, st.strategies
    resume = next(r for r in st.log if r["resume_strategy"] == "resume")
    assert resume["recovery_attempt"] == 2, resume  # the recovery that died was counted


# ---------------------------------------------------------------------- killed while rolling back

ROLLBACK_CALLS = [
    ["refund_keyed", "r1", 10],
    ["refund_reconciled", "r2", 20],
    ["refund_blind", "r3", 30],
    ["lookup", "r4", 0],
]


def cli(paths: Paths, *args: str, failpoints: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real ``tether`` CLI on the chaos app (``--app app:cli_harness``)."""
    env = {k: v for k, v in os.environ.items()
           if k != "TETHER_FAILPOINTS" and not k.startswith("TETHER_CHAOS")}
    env.update(TETHER_CHAOS_LEDGER=str(paths.ledger), PYTHONPATH=str(HERE), **FAST_LEASE)
    if failpoints:
        env["TETHER_FAILPOINTS"] = failpoints
    return subprocess.run(
        [sys.executable, "-m", "tether", "--store", f"sqlite:///{paths.db}", "--app",
         "app:cli_harness", *args], env=env, cwd=str(paths.dir), capture_output=True, text=True,
        timeout=CHILD_TIMEOUT)


def stored_history(paths: Paths, task_id: str) -> set[tuple[int, int, bytes]]:
    rows = app.ledger_query(paths.db, "SELECT epoch, seq, entry FROM history WHERE task_id = ?",
                            (task_id,))
    return {(int(e), int(s), bytes(x)) for e, s, x in rows}


def version_where(paths: Paths, task_id: str, pred: Callable[[tt.Snapshot], bool]) -> int:
    async def go(h: tt.Harness) -> int:
        for version, _, _ in await h.store.list_versions(task_id):
            _, data = await h.store.load_head(task_id, version)
            if pred(tt.Snapshot.loads(data, task_id, version)):
                return version
        raise AssertionError(f"no kept version of {task_id} matches")

    return with_harness(paths, go)


def test_rollback_killed_mid_way_twice_is_applied_exactly_once_and_repeats_no_refund(
        paths: Paths, children: Callable[..., Child]) -> None:
    """``during_rollback``: a person rolls a parked task back with the CLI; the CLI process
    applying it dies mid-rollback, then so does the first worker that picks it up. The third
    applies it: once, with the dialog kept, every kept version loadable, and no refund paid
    again (E4: the rolled-back calls are answered from their records)."""
    submit(paths, "refunder", {"calls": ROLLBACK_CALLS}, "rb")
    run_to_kill(paths, children, "inside_tool@3", env=FAST_LEASE)  # r3 blind: paid, in doubt
    parked = state(paths, "rb")
    assert parked.status == "needs_human" and "refund_blind" in (parked.reason or ""), parked
    assert refund_problems(paths.ledger, once=["r1", "r2", "r3"], never=["r4"]) == []
    rows_before = stored_history(paths, "rb")
    # back to the version right after r1's result (r2 not yet planned)
    target = version_where(paths, "rb", lambda s: s.call is None and s.step == 1)

    killed = cli(paths, "rollback", "rb", "--to", str(target), failpoints="during_rollback@1")
    assert killed.returncode == KILLED, (killed.returncode, killed.stdout, killed.stderr)
    events = with_harness(paths, lambda h: h.store.list_events("rb"))
    assert [(e.event.type, e.status) for e in events] == [("rollback", "pending")]
    mid = state(paths, "rb")
    # nothing applied (claiming the parked task re-decides its in-doubt call first, which may
    # commit one more needs_human version; the rollback itself left no trace)
    assert mid.status == "needs_human" and "rollback" not in mid.strategies, mid
    assert mid.versions[:len(parked.versions)] == parked.versions

    doomed = children(paths, "serve", failpoints="during_rollback@1", env=FAST_LEASE)
    doomed.expect("READY")
    doomed.assert_killed()
    events = with_harness(paths, lambda h: h.store.list_events("rb"))
    assert [(e.event.type, e.status) for e in events] == [("rollback", "pending")]
    assert "rollback" not in state(paths, "rb").strategies

    worker = children(paths, "serve", env=FAST_LEASE)
    worker.expect("READY")
    end = time.monotonic() + CHILD_TIMEOUT
    while True:  # the task parks again (r3 is still in doubt); serve never exits by itself
        events = with_harness(paths, lambda h: h.store.list_events("rb"))
        record = with_harness(paths, lambda h: h.store.get_task("rb"))
        if events[0].status != "pending" and record.status.value == "needs_human" \
                and record.lease_owner is None:
            break
        assert time.monotonic() < end, (events, record)
        time.sleep(0.05)
    assert worker.kill() == KILLED

    st = state(paths, "rb")  # every kept version loads
    assert [(e.event.type, e.status) for e in events] == [("rollback", "applied")]
    assert st.strategies.count("rollback") == 1, st.strategies
    assert not any(s.startswith("rollback_") for s in st.strategies), st.strategies
    assert "reuse_result" in st.strategies, st.strategies  # r2 answered from its record
    # parked again on the same in-doubt blind refund, never paid twice, r4 never reached
    assert st.status == "needs_human", (st.status, st.log)
    assert st.reason is not None and "outcome unknown" in st.reason and "refund_blind" in st.reason
    assert refund_problems(paths.ledger, once=["r1", "r2", "r3"], never=["r4"]) == []
    assert app.lookup_counts(paths.ledger)["r4"] == 0
    # the dialog: nothing stored was deleted, and the head reads a consistent branch
    assert rows_before <= stored_history(paths, "rb")

    async def dialog(h: tt.Harness) -> tuple[list[dict[str, Any]], int, list[list[int]]]:
        info = await h.get("rb")
        return await h.history("rb"), info.snapshot.history_len, info.snapshot.history_segments

    history, history_len, segments = with_harness(paths, dialog)
    assert len(history) == history_len
    assert len(segments) == 2, segments  # one rollback, one new branch
    tool_results = [row["content"] for row in history if row.get("role") == "tool"]
    assert tool_results == [app.refund_result("r1", 10), app.refund_result("r2", 20)]

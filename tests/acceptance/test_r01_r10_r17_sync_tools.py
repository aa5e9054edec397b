"""Sync tools end to end: a plain ``def`` registered with ``@harness.tool`` runs in a thread
of its own, under the same idempotency key, timeout, retry and crash rules as an async tool
(R1, R10, R12, R17, E1).

A real harness on SQLite; the crash tests kill a real ``tether worker`` process. No test
depends on timing luck: a tool that must be slow waits on a ``threading.Event`` the test
sets, orderings are asserted on recorded events, and every wait is bounded only so that a
bug fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from _support import fast_settings

import tether as tt

pytestmark = pytest.mark.timeout(120)

BOUND = 10.0
"""The most a blocked tool waits for the test (a failing test ends, never hangs)."""


class OneCall(tt.Agent):
    """Calls one tool, then finishes with its result; a call that gave up finishes with the
    error the agent was shown."""

    def __init__(self, tool: str, args: dict[str, Any] | None = None) -> None:
        self.tool, self.args = tool, args or {}

    async def plan(self, task: tt.TaskView) -> tt.Action:
        if task.last_tool_result is None:
            return tt.ToolCall(self.tool, self.args)
        return tt.Finish(task.last_tool_result)

    async def on_event(self, task: tt.TaskView, event: tt.Event) -> tt.Action | None:
        if event.type == "tool_error":
            return tt.Finish({"error": event.payload["error"]})
        return None


def thread_named(name: str) -> threading.Thread:
    found = [thread for thread in threading.enumerate() if thread.name == name]
    assert len(found) == 1, [thread.name for thread in threading.enumerate()]
    return found[0]


# --------------------------------------------------------------------------- running


async def test_r10_r17_a_sync_tool_runs_in_a_task_end_to_end_with_its_key(db_url: str) -> None:
    """R10/R17: ``@harness.tool`` takes a plain ``def``; the call runs in another thread, gets
    its idempotency key in ctx, and is recorded like any call: one succeeded record under
    that key, the call and its result in the dialog, the result the task's."""
    h = tt.Harness(db_url, settings=fast_settings())
    seen: list[tuple[str, int | None]] = []

    @h.tool(side_effect=True)
    def refund(ctx: tt.ToolContext, order: str, cents: int) -> dict[str, Any]:
        seen.append((ctx.idempotency_key, threading.get_ident()))
        return {"order": order, "refunded": cents}

    assert refund.sync and not refund.interruptible
    h.add_agent("refunds", OneCall("refund", {"order": "A1", "cents": 500}))
    tid = await h.submit("refunds")
    await h.run_until_idle(timeout=20)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == {"order": "A1", "refunded": 500}
    [(key, thread)] = seen
    assert thread != threading.get_ident()  # not the event loop's thread
    records = await h.store.list_idempotency(tid)
    assert [(r.key, r.status) for r in records] == [(key, "succeeded")]
    rows = await h.history(tid)
    assert [r["tool_call"]["key"] for r in rows if "tool_call" in r] == [key]
    assert [r["content"] for r in rows if r.get("role") == "tool"] == [
        {"order": "A1", "refunded": 500}]
    await h.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_r12_a_sync_tool_past_its_timeout_is_reported_as_a_timeout(db_url: str,
                                                                         kind: str) -> None:
    """R12: a sync tool that sleeps past its timeout is reported exactly as an async tool's:
    the agent is shown the same ToolTimeout, after the same retries. (The sync tool's thread
    is still waiting when the task is over; it cannot be stopped, and is released here.)"""
    h = tt.Harness(db_url, settings=fast_settings())
    release = threading.Event()
    options: dict[str, Any] = {"idempotent": True, "timeout": 0.1,
                               "retry": tt.RetryPolicy(max_attempts=2, backoff=0.0)}
    attempts: list[int] = []
    if kind == "sync":
        @h.tool(**options)
        def slow(ctx: tt.ToolContext) -> str:
            attempts.append(ctx.attempt)
            release.wait(BOUND)
            return "too late"
    else:
        @h.tool(**options)
        async def slow(ctx: tt.ToolContext) -> str:
            attempts.append(ctx.attempt)
            await asyncio.Event().wait()
            return "too late"

    h.add_agent("a", OneCall("slow"))
    try:
        tid = await h.submit("a")
        await h.run_until_idle(timeout=20)
        info = await h.get(tid)
    finally:
        release.set()
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == {"error": "ToolTimeout: tool slow timed out after 0.1s"}
    assert attempts == [1, 2]
    await h.close()


@pytest.mark.parametrize("kind", ["sync", "blocking async (the control)"])
async def test_r17_a_sync_tool_leaves_the_event_loop_free_for_other_tasks(db_url: str,
                                                                         kind: str) -> None:
    """R17: while task A's sync tool blocks in its thread, task B runs on the same event loop
    and its tool is what releases A's. The control shows the test can tell: the same body as
    an ``async def`` blocks the loop, so B cannot run until A's bounded wait has given up."""
    h = tt.Harness(db_url, settings=fast_settings())
    events: list[str] = []
    a_started, release = threading.Event(), threading.Event()
    bound = BOUND if kind == "sync" else 0.5

    def body(ctx: tt.ToolContext) -> bool:
        events.append("A started")
        a_started.set()
        released = release.wait(bound)
        events.append("A finished")
        return released

    if kind == "sync":
        h.tool(name="hold")(body)
    else:
        @h.tool(name="hold")
        async def hold(ctx: tt.ToolContext) -> bool:
            return body(ctx)  # a blocking call inside async def: the mistake sync tools avoid

    @h.tool()
    async def nudge(ctx: tt.ToolContext) -> str:
        for _ in range(int(BOUND / 0.005)):
            if a_started.is_set():
                break
            await asyncio.sleep(0.005)
        events.append("B ran")
        release.set()
        return "nudged"

    h.add_agent("a", OneCall("hold"))
    h.add_agent("b", OneCall("nudge"))
    try:
        ta, tb = await h.submit("a"), await h.submit("b")
        await h.run_until_idle(timeout=30)
    finally:
        release.set()
    assert (await h.get(tb)).snapshot.result == "nudged"
    if kind == "sync":
        assert events == ["A started", "B ran", "A finished"]
        assert (await h.get(ta)).snapshot.result is True  # B's tool released it
    else:
        assert events == ["A started", "A finished", "B ran"]
        assert (await h.get(ta)).snapshot.result is False  # nothing could release it
    await h.close()


# --------------------------------------------------------------------------- side effects past their timeout


class Wire:
    """A sync side-effecting tool's body: the request goes out at once, the bank answers when
    the test (or the reconcile hook) releases it."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.release = threading.Event()

    def __call__(self, ctx: tt.ToolContext, amount: int) -> dict[str, Any]:
        self.sent.append(ctx.idempotency_key)
        self.release.wait(BOUND)
        return {"wired": amount, "key": ctx.idempotency_key}


def wire_harness(db_url: str, wire: Wire) -> tuple[tt.Harness, tt.Tool]:
    h = tt.Harness(db_url, settings=fast_settings())
    tool = h.tool(name="wire", side_effect=True, timeout=0.1,
                  retry=tt.RetryPolicy(max_attempts=3, backoff=0.0))(wire)
    h.add_agent("a", OneCall("wire", {"amount": 100}))
    return h, tool


async def test_r10_a_side_effecting_sync_tool_past_its_timeout_is_in_doubt(db_url: str) -> None:
    """R10: past its timeout a side-effecting sync call may still happen (its thread runs on),
    so it is in doubt like a crash inside it: no hook, so a person decides. A person who says
    it never happened gets the call run with the same key, and that attempt takes the late
    thread's outcome: the money went out once."""
    wire = Wire()
    h, _ = wire_harness(db_url, wire)
    try:
        tid = await h.submit("a")
        await h.run_until_idle(timeout=20)
        info = await h.get(tid)
        assert info.record.status is tt.Status.NEEDS_HUMAN
        assert "outcome unknown" in (info.record.reason or "")
        [key] = wire.sent
        log = {r["resume_strategy"]: r["detail"] for r in await h.store.list_recovery_log(tid)}
        assert "ToolTimeout: tool wire timed out after 0.1s" in log["outcome_unknown"]
    finally:
        wire.release.set()  # the bank answers, late
    await asyncio.to_thread(thread_named(f"tether: wire {key}").join, BOUND)
    await h.decide(tid, "not_happened", by="ops")
    await h.run_until_idle(timeout=20)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == {"wired": 100, "key": key}
    assert wire.sent == [key]  # not sent a second time
    await h.close()


async def test_r10_a_sync_reconcile_hook_that_looked_too_early_does_not_double_the_wire(
        db_url: str) -> None:
    """R10: a sync reconcile hook (accepted, run in a thread) asked right after the timeout
    says the transfer never happened, though the tool's thread sends it a moment later; the
    retry under the same key takes that thread's outcome instead of sending it again."""
    wire = Wire()
    h, tool = wire_harness(db_url, wire)
    asked: list[str] = []

    @tool.reconcile
    def looked(ctx: tt.ToolContext, amount: int) -> Any:
        asked.append(ctx.idempotency_key)
        wire.release.set()  # ... the bank completes the transfer just after looking
        return None

    try:
        tid = await h.submit("a")
        await h.run_until_idle(timeout=20)
    finally:
        wire.release.set()
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    [key] = wire.sent
    assert asked == [key] and info.snapshot.result == {"wired": 100, "key": key}
    log = [r["resume_strategy"] for r in await h.store.list_recovery_log(tid)]
    assert "reconcile_not_done" in log
    await h.close()


# --------------------------------------------------------------------------- a killed worker


APP = textwrap.dedent('''
    import os, sqlite3, threading
    import tether as tt
    from tether.failpoints import failpoint

    harness = tt.Harness(settings=tt.Settings(lease_seconds=0.5, poll_interval=0.02))
    LEDGER = os.environ["LEDGER"]

    def pay(order, key):
        db = sqlite3.connect(LEDGER, isolation_level=None)
        db.execute("CREATE TABLE IF NOT EXISTS paid (order_id TEXT, key TEXT)")
        db.execute("INSERT INTO paid VALUES (?, ?)", (order, key))
        db.close()
        return {"order": order}

    @harness.tool(side_effect=True)
    def refund(ctx, order: str) -> dict:
        paid = pay(order, ctx.idempotency_key)
        failpoint("inside_tool")  # in the tool's own thread: the whole process dies
        return paid

    @refund.reconcile
    def _(ctx, order: str):
        db = sqlite3.connect(LEDGER, isolation_level=None)
        row = db.execute("SELECT order_id FROM paid WHERE key = ?",
                         (ctx.idempotency_key,)).fetchone()
        db.close()
        return {"order": row[0]} if row else None

    @harness.tool(side_effect=True)
    def blind_refund(ctx, order: str) -> dict:
        paid = pay(order, ctx.idempotency_key)
        failpoint("inside_tool")
        return paid

    @harness.tool(side_effect=True, timeout=0.2)
    def stuck_refund(ctx, order: str) -> dict:
        pay(order, ctx.idempotency_key)
        threading.Event().wait()  # the bank never answers; the thread never returns
        return {"order": order}

    @harness.agent("refunds")
    class Refunds(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is not None:
                return tt.Finish(task.last_tool_result)
            return tt.ToolCall(task.input["tool"], {"order": "A"})
''')


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "sync_app.py").write_text(APP)
    return tmp_path


def _worker(app_dir: Path, failpoints: str = "") -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [str(app_dir), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "LEDGER": str(app_dir / "ledger.db"), "TETHER_FAILPOINTS": failpoints,
           "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-m", "tether", "--store", f"sqlite:///{app_dir / 'tether.db'}",
         "worker", "sync_app:harness", "--until-idle", "--concurrency", "1"],
        cwd=app_dir, env=env, capture_output=True, text=True, timeout=60)


def _paid(app_dir: Path) -> list[str]:
    db = sqlite3.connect(app_dir / "ledger.db")
    rows = [r[0] for r in db.execute("SELECT order_id FROM paid ORDER BY rowid")]
    db.close()
    return rows


async def _submit(app_dir: Path, tool: str) -> tuple[tt.Harness, str]:
    harness = tt.Harness(f"sqlite:///{app_dir / 'tether.db'}")
    harness.add_agent("refunds", tt.Agent())  # only to accept the submission here
    return harness, await harness.submit("refunds", {"tool": tool})


async def _settle(app_dir: Path, harness: tt.Harness, task_id: str) -> tt.TaskInfo:
    """Run fresh worker processes until the task settles (the dead lease must expire first)."""
    for _ in range(20):
        rescuer = _worker(app_dir)
        assert rescuer.returncode == 0, rescuer.stderr
        info = await harness.get(task_id)
        if info.record.status in (tt.Status.COMPLETED, tt.Status.NEEDS_HUMAN):
            return info
    raise AssertionError(f"task never settled: {info.record.status}")


@pytest.mark.parametrize("kill_at", ["inside_tool", "after_tool_before_commit"])
async def test_r01_r10_a_worker_killed_in_a_sync_side_effect_leaves_it_in_doubt(
        app_dir: Path, kill_at: str) -> None:
    """R1/R10: a worker SIGKILLed while a sync refund ran (in its thread, or after it returned
    and before the commit) leaves the call in doubt, exactly as an async tool's: without a
    reconcile hook the next worker hands it to a person, naming it; it is not repeated."""
    harness, task_id = await _submit(app_dir, "blind_refund")
    doomed = _worker(app_dir, kill_at)
    assert doomed.returncode == -9, (doomed.returncode, doomed.stderr)
    info = await _settle(app_dir, harness, task_id)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "outcome unknown" in (info.record.reason or "")
    assert "blind_refund" in (info.record.reason or "")
    assert _paid(app_dir) == ["A"]
    await harness.close()


async def test_r01_r10_a_sync_reconcile_hook_settles_a_killed_sync_refund(app_dir: Path) -> None:
    """R1/R10: with a sync reconcile hook, the next worker asks it (in a thread), finds the
    refund, and completes with its result: paid once."""
    harness, task_id = await _submit(app_dir, "refund")
    doomed = _worker(app_dir, "inside_tool")
    assert doomed.returncode == -9, (doomed.returncode, doomed.stderr)
    info = await _settle(app_dir, harness, task_id)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == {"order": "A"}
    assert _paid(app_dir) == ["A"]
    log = [r["resume_strategy"] for r in await harness.store.list_recovery_log(task_id)]
    assert "reconcile" in log
    await harness.close()


async def test_r01_r10_a_sync_tool_that_never_returns_does_not_keep_the_worker_alive(
        app_dir: Path) -> None:
    """R1/R10: a sync tool whose thread never returns times out, its call goes to a person
    (in doubt), and the worker still exits when it is idle: the thread is a daemon, not a
    pool thread that the interpreter would wait for at exit."""
    harness, task_id = await _submit(app_dir, "stuck_refund")
    worker = _worker(app_dir)  # (subprocess.run's own timeout catches a hang)
    assert worker.returncode == 0, worker.stderr
    info = await harness.get(task_id)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "outcome unknown" in (info.record.reason or "")
    assert _paid(app_dir) == ["A"]
    await harness.close()


# --------------------------------------------------------------------------- tether torture

TORTURED = textwrap.dedent('''
    import tether as tt

    harness = tt.Harness()

    @harness.tool(side_effect=True)
    def charge(ctx, customer: str) -> dict:
        return {"customer": customer, "charged": True}

    @charge.reconcile
    def _found(ctx, customer: str):
        return None

    @harness.tool(idempotent=True, timeout=5.0)
    def lookup(ctx, customer: str) -> dict:
        return {"customer": customer}

    @harness.agent("charges")
    class Charges(tt.Agent):
        async def plan(self, task):
            i = task.scratch.get("i", 0)
            customers = task.input["customers"]
            if i == 2 * len(customers):
                return tt.Finish({"done": i})
            task.scratch["i"] = i + 1
            tool = "lookup" if i % 2 == 0 else "charge"
            return tt.ToolCall(tool, {"customer": customers[i // 2]})
''')


async def test_r01_r10_tether_torture_runs_an_app_of_sync_tools(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R1/R10: ``tether torture`` wraps every tool with its faults (again for every seed); a
    sync tool is run in its thread under them, not awaited as if it were async: with no fault
    injected every fault run completes, and the kill runs find nothing repeated, lost or
    stuck."""
    from tether.testing import FaultPlan, Target, torture

    (tmp_path / "sync_tortured_app.py").write_text(TORTURED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("TETHER_DEMO_LEDGER", str(tmp_path / "demo-ledger.db"))
    target = Target("sync_tortured_app:harness", "charges", {"customers": ["a", "b"]})
    quiet = await torture(target, seeds=3, kills=False, plan=FaultPlan.none())
    assert quiet.violations == [] and quiet.outcomes == {"completed": 3}, quiet
    report = await torture(target, seeds=3)
    assert report.violations == [], report.violations
    assert report.runs == 6

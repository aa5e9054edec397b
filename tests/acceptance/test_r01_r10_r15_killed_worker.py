"""A worker process SIGKILLed mid-task is resumed by a new process; no side effect repeats.

R1 (environment suspension), R10 (resume points, idempotency, the refund example), R15
(process restart → restore and continue), R19 (nothing lives only in memory). The worker
is a real `tether worker` process running a user's app loaded by import path; the payment
provider is a separate SQLite file the harness does not own and that does not deduplicate.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tether as tt

APP = textwrap.dedent('''
    import os, sqlite3
    import tether as tt

    harness = tt.Harness(settings=tt.Settings(lease_seconds=0.5, poll_interval=0.02))
    LEDGER = os.environ["LEDGER"]

    def pay(order, key):
        db = sqlite3.connect(LEDGER, isolation_level=None)
        db.execute("CREATE TABLE IF NOT EXISTS paid (order_id TEXT, key TEXT)")
        db.execute("INSERT INTO paid VALUES (?, ?)", (order, key))
        db.close()
        return {"order": order}

    def find(key):
        db = sqlite3.connect(LEDGER, isolation_level=None)
        row = db.execute("SELECT order_id FROM paid WHERE key = ?", (key,)).fetchone()
        db.close()
        return {"order": row[0]} if row else None

    @harness.tool(side_effect=True)
    async def refund(ctx, order: str) -> dict:
        return pay(order, ctx.idempotency_key)

    @refund.reconcile
    async def _(ctx, order: str):
        return find(ctx.idempotency_key)

    @harness.tool(side_effect=True)
    async def blind_refund(ctx, order: str) -> dict:
        return pay(order, ctx.idempotency_key)

    @harness.agent("refunds")
    class Refunds(tt.Agent):
        async def plan(self, task):
            i = task.scratch.get("i", 0)
            orders = task.input["orders"]
            if i == len(orders):
                return tt.Finish({"done": len(orders)})
            task.scratch["i"] = i + 1
            return tt.ToolCall(task.input["tool"], {"order": orders[i]})
''')


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "refund_app.py").write_text(APP)
    return tmp_path


def _worker(app_dir: Path, failpoints: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LEDGER": str(app_dir / "ledger.db"), "TETHER_FAILPOINTS": failpoints,
           "PYTHONPATH": str(app_dir)}
    return subprocess.run(
        [sys.executable, "-m", "tether", "--store", f"sqlite:///{app_dir / 'tether.db'}",
         "worker", "refund_app:harness", "--until-idle", "--concurrency", "1"],
        cwd=app_dir, env=env, capture_output=True, text=True, timeout=60)


def _paid(app_dir: Path) -> list[str]:
    db = sqlite3.connect(app_dir / "ledger.db")
    rows = [r[0] for r in db.execute("SELECT order_id FROM paid ORDER BY rowid")]
    db.close()
    return rows


async def _submit(app_dir: Path, tool: str) -> tuple[tt.Harness, str]:
    harness = tt.Harness(f"sqlite:///{app_dir / 'tether.db'}")
    harness.add_agent("refunds", tt.Agent())  # only to accept the submission here
    task_id = await harness.submit("refunds", {"tool": tool, "orders": ["A", "B", "C"]})
    return harness, task_id


async def _finish(app_dir: Path, harness: tt.Harness, task_id: str) -> tt.TaskInfo:
    """Run fresh worker processes until the task settles (the dead lease must expire first)."""
    for _ in range(20):
        rescuer = _worker(app_dir)
        assert rescuer.returncode == 0, rescuer.stderr
        info = await harness.get(task_id)
        if info.record.status in (tt.Status.COMPLETED, tt.Status.NEEDS_HUMAN):
            return info
    raise AssertionError(f"task never settled: {info.record.status}")


@pytest.mark.parametrize("kill_at", ["after_tool_before_commit@2", "mid_checkpoint@4",
                                     "after_resume_point@2"])
async def test_killed_mid_refund_resumes_in_new_process_and_pays_each_order_once(
        app_dir: Path, kill_at: str) -> None:
    """R10: the refund in flight at the kill is reconciled (or run, if it never happened),
    never repeated; the rest of the batch continues in the new process."""
    harness, task_id = await _submit(app_dir, "refund")
    doomed = _worker(app_dir, kill_at)
    assert doomed.returncode == -9, (doomed.returncode, doomed.stderr)
    info = await _finish(app_dir, harness, task_id)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert sorted(_paid(app_dir)) == ["A", "B", "C"]
    strategies = [r["resume_strategy"] for r in await harness.store.list_recovery_log(task_id)]
    assert strategies[0] == "resume"
    assert {"reconcile", "reconcile_not_done"} & set(strategies)
    await harness.close()


async def test_in_doubt_side_effect_without_reconcile_goes_to_a_person(app_dir: Path) -> None:
    """R10, R26: with no reconcile hook, the in-doubt refund is not repeated; the task waits
    for a person with a reason naming the call."""
    harness, task_id = await _submit(app_dir, "blind_refund")
    doomed = _worker(app_dir, "after_tool_before_commit@2")
    assert doomed.returncode == -9
    info = await _finish(app_dir, harness, task_id)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "outcome unknown" in (info.record.reason or "")
    assert "blind_refund" in (info.record.reason or "")
    assert _paid(app_dir) == ["A", "B"]
    bundle = await harness.export(task_id)
    assert bundle["snapshot"]["call"]["tool"] == "blind_refund"
    await harness.close()

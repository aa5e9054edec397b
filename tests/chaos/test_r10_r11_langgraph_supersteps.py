"""A hand-built LangGraph graph under tether, its worker SIGKILLed (R10, R11, R15; issue 28).

The child (``_graph_app.py``) runs the graph and blocks where the test says; the parent
kills it with SIGKILL there, then finishes the task with a harness of its own on the same
SQLite store, once the dead worker's lease has run out. The ledger counts what ran again:
a node that finished before the kill never runs again, the interrupted node runs again from
its first line, a side effect is never repeated blindly.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import sqlite3
import sys
from collections import Counter
from pathlib import Path

import pytest
from _child import ChildProcess

import tether as tt

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("tether_chaos_graph_app", HERE / "_graph_app.py")
assert _spec is not None and _spec.loader is not None
app = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = app  # LangGraph reads the state's type hints through the module
_spec.loader.exec_module(app)


def killed_at(tmp_path: Path, point: str, reconcile: bool = False) -> str:
    """Start the child, wait until it blocks at *point*, SIGKILL it; the task's id."""
    env = {**os.environ, "GRAPH_LEDGER": str(tmp_path / "ledger.db"), "GRAPH_BLOCK": point,
           "GRAPH_CHILD": "1", "GRAPH_RECONCILE": "1" if reconcile else "0",
           "PYTHONPATH": str(HERE), "PYTHONUNBUFFERED": "1"}
    child = ChildProcess([sys.executable, str(HERE / "_graph_app.py"), str(tmp_path / "t.db")],
                         env, tmp_path, "graph", 60.0)
    task = child.expect("TASK ").split()[1]
    child.expect(f"IN {point}")
    child.signal(signal.SIGKILL)
    child.proc.wait(timeout=10)
    return task


async def finish(tmp_path: Path, task: str, reconcile: bool = False) -> tt.TaskInfo:
    os.environ["GRAPH_LEDGER"] = str(tmp_path / "ledger.db")
    os.environ["GRAPH_RECONCILE"] = "1" if reconcile else "0"
    try:
        h = app.harness(str(tmp_path / "t.db"))
        await h.run_until_idle(timeout=60)
        info = await h.get(task)
        await h.close()
    finally:
        for name in ("GRAPH_LEDGER", "GRAPH_RECONCILE"):
            os.environ.pop(name, None)
    return info


def ran(tmp_path: Path) -> Counter[str]:
    """How many times each node and each tool ran, from the ledger."""
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        return Counter(what for (what,) in db.execute("select what from runs"))


@pytest.mark.parametrize("point", ["pay", "ship"])
def test_r11_a_kill_inside_a_node_runs_that_node_again_and_no_finished_one(
        tmp_path: Path, point: str) -> None:
    """Killed inside ``pay`` (super-step 2) or ``ship`` (the last): the nodes before it ran
    once, the interrupted one once more (from its first line), the task completes. (``pay``
    runs twice in any run: once to its charge, once again when resumed with its result.)"""
    task = killed_at(tmp_path, point)
    info = asyncio.run(finish(tmp_path, task))
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result["log"] == ["prepared", "paid 5", "shipped"]
    counts = ran(tmp_path)
    assert counts["prepare"] == 1
    assert counts["pay"] == (3 if point == "pay" else 2)
    assert counts["charge"] == 1  # made once: the kill in ship came after it was kept
    assert counts["ask"] == 2 and counts["lookup"] == 1  # two model turns, one tool call
    assert counts["ship"] == (2 if point == "ship" else 1)


def test_r10_a_kill_inside_a_side_effect_without_reconcile_goes_to_a_person(
        tmp_path: Path) -> None:
    """Killed after the charge happened but before its result was kept: tether cannot know,
    so it asks a person and never charges again."""
    task = killed_at(tmp_path, "charge")
    info = asyncio.run(finish(tmp_path, task))
    assert info.record.status is tt.Status.NEEDS_HUMAN, info.record.status
    assert "charge" in (info.record.reason or "")
    counts = ran(tmp_path)
    assert counts["charge"] == 1 and counts["ship"] == 0


def test_r10_a_kill_inside_a_side_effect_with_reconcile_is_found_not_repeated(
        tmp_path: Path) -> None:
    """With a reconcile hook the ledger says the charge happened: its result is kept, the
    node resumes with it, and the graph goes on to the end with one charge."""
    task = killed_at(tmp_path, "charge", reconcile=True)
    info = asyncio.run(finish(tmp_path, task, reconcile=True))
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result["log"] == ["prepared", "paid 5", "shipped"]
    counts = ran(tmp_path)
    assert counts["charge"] == 1 and counts["pay"] == 2 and counts["prepare"] == 1


def test_r10_a_kill_inside_an_idempotent_tool_node_call_runs_it_again(tmp_path: Path) -> None:
    """An idempotent ``ToolNode`` tool killed mid-call is made again with the same key; the
    model turn before it is not asked again."""
    task = killed_at(tmp_path, "lookup")
    info = asyncio.run(finish(tmp_path, task))
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    counts = ran(tmp_path)
    assert counts["lookup"] == 2 and counts["ask"] == 2 and counts["charge"] == 1
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        keys = {key for (key,) in db.execute("select key from runs where what = 'lookup'")}
    assert len(keys) == 1  # the same call, the same key

"""Failures a person can debug: tracebacks kept with them (R22, R23, R26; issue 18).

Before, only ``TypeError: 'NoneType' object is not subscriptable`` reached the person, with
no file or line. Now the traceback (bounded) is in the tool's dialog row, in the recovery
log and so in the bundle and the API.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from _support import fast_settings
from click.testing import CliRunner

import tether as tt
from tether.cli.main import main
from tether.tools import TRACEBACK_CHARS, traceback_text


def lookup_customer(order: dict[str, Any] | None) -> str:
    return order["customer"]  # type: ignore[index]  # the bug a person must find


def harness(tmp_path: Path) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{tmp_path / 'debug.db'}", settings=fast_settings())

    @h.tool(idempotent=True, retry=tt.RetryPolicy(max_attempts=1))
    async def customer_of(ctx: tt.ToolContext, order: str) -> str:
        return lookup_customer(None)

    @h.agent("support")
    class Support(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.ToolCall("customer_of", {"order": "A1"})

    @h.agent("planner")
    class Broken(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.Finish(lookup_customer(None))

    return h


async def test_r26_a_tools_traceback_reaches_the_dialog_the_log_and_the_bundle(
        tmp_path: Path) -> None:
    h = harness(tmp_path)
    tid = await h.submit("support")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    [row, *_] = [r for r in await h.history(tid) if r.get("role") == "tool" and "error" in r]
    for trace in (row["traceback"],
                  (await h.reads.recovery_log(tid))[-1]["traceback"],
                  (await h.export(tid))["recovery_log"][-1]["traceback"]):
        assert "test_r22_r26_failures_you_can_debug.py" in trace
        assert "in lookup_customer" in trace and 'return order["customer"]' in trace
        assert "TypeError: 'NoneType' object is not subscriptable" in trace
    await h.close()


async def test_r26_a_planning_failure_keeps_its_traceback(tmp_path: Path) -> None:
    h = harness(tmp_path)
    tid = await h.submit("planner")
    await h.run_until_idle(timeout=10)
    log = await h.reads.recovery_log(tid)
    assert [r["resume_strategy"] for r in log] == ["retry_plan", "needs_human"]
    assert all("in lookup_customer" in r["traceback"] for r in log)
    await h.close()


def test_r26_a_traceback_is_bounded_and_keeps_its_end() -> None:
    try:
        try:
            {}["missing"]
        except KeyError as cause:
            raise ValueError("the end of the story " + "x" * 2 * TRACEBACK_CHARS) from cause
    except ValueError as error:
        trace = traceback_text(error)
    assert len(trace) <= TRACEBACK_CHARS + 40 and trace.endswith("x" * 100)
    assert trace.startswith("... (earlier frames left out)")


async def test_r23_workers_log_what_became_of_each_task_they_let_go(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Operators read the worker's log: each task it lets go of, and what became of it."""
    h = harness(tmp_path)

    @h.agent("gate")
    class Gate(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.Wait("approval") if task.last_event is None else tt.Finish("ok")

    caplog.set_level(logging.INFO, logger="tether")
    parked = await h.submit("gate")
    failed = await h.submit("support")
    await h.run_until_idle(timeout=10)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert f"task {parked}: waiting for an event; released" in said
    assert f"task {failed}: needs a person; released" in said
    assert any(m.startswith(f"recovery retry_backoff on task {failed}") for m in said)
    await h.close()


async def test_r26_show_prints_the_traceback_and_who_holds_a_task(tmp_path: Path) -> None:
    h = harness(tmp_path)
    failed = await h.submit("support")
    await h.run_until_idle(timeout=10)
    held = await h.submit("support")
    assert (await h.store.claim("worker-that-died", time.time(), 60.0)) is not None
    await h.close()
    env = {"TETHER_STORE": f"sqlite:///{tmp_path / 'debug.db'}"}
    shown = await asyncio.to_thread(CliRunner().invoke, main, ["show", failed], env=env)
    assert "traceback of the last failure:" in shown.output
    assert "in lookup_customer" in shown.output and "not subscriptable" in shown.output
    shown = await asyncio.to_thread(CliRunner().invoke, main, ["show", held], env=env)
    assert "held by worker-that-died until" in shown.output

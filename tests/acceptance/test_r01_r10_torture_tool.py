"""`tether torture` / tether.testing: users point it at their own agents (issue 3, R1, R10).

It must pass the shipped examples and must find the fault in a deliberately broken agent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tether.testing import FaultPlan, Target, torture

BROKEN = Target("tether.examples.broken:harness", "charges", {"customers": ["a", "b", "c"]})


@pytest.fixture(autouse=True)
def _ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TETHER_DEMO_LEDGER", str(tmp_path / "demo-ledger.db"))


@pytest.mark.parametrize(("agent", "task_input"), [
    ("refund", {"orders": [{"id": "A", "cents": 100}, {"id": "B", "cents": 200}]}),
    ("contracts", {"files": ["contract-01.pdf", "contract-02.pdf", "contract-03.pdf"]}),
    ("report", {"report": "FY25"}),
])
async def test_the_examples_survive_faults_and_kills(agent: str, task_input: object) -> None:
    """R1/R10: the example agents under tool errors, slow tools, model errors, awkward events
    and worker kills: no side effect repeated, no event lost, nothing stuck, and a restart
    never changes a completed result."""
    report = await torture(Target("tether.examples:demo_app", agent, task_input), seeds=3)
    assert report.violations == []
    assert report.runs == 6 and report.kills >= 2


async def test_it_finds_the_fault_in_a_broken_agent() -> None:
    """An agent that keeps its progress in process memory charges customers twice after a
    restart: the kill runs must report it, with a command that replays the seed."""
    report = await torture(BROKEN, seeds=8, faults=False)
    repeats = [v for v in report.violations if v.kind == "side effect repeated"]
    assert repeats, report
    assert "charge" in repeats[0].detail
    assert f"--seed {repeats[0].seed} --only kills" in repeats[0].replay
    replayed = await torture(BROKEN, seeds=1, first_seed=repeats[0].seed, faults=False)
    assert replayed.violations, "the printed seed must reproduce the violation"


async def test_it_finds_an_agent_that_lost_its_place_with_harmless_tools() -> None:
    """Issue 17: an agent keeping its progress in a module global reads every page again after
    a restart. Nothing is paid twice, but the kill runs report the re-planned work (the
    baseline runs in a process of its own, so the global cannot hide it)."""
    reader = Target("tether.examples.broken:harness", "reader", {"pages": 4})
    report = await torture(reader, seeds=8, faults=False)
    replanned = [v for v in report.violations if v.kind == "re-planned work it had done"]
    assert replanned, report
    assert "fetch" in replanned[0].detail and "outside the task" in replanned[0].detail


async def test_a_pydantic_ai_agent_is_tortured_like_a_native_one() -> None:
    """Issue 17: the PydanticAI example under faults and kills: its tools are tether tools,
    so the ledger sees them, and nothing is repeated, lost or stuck."""
    pytest.importorskip("pydantic_ai")
    report = await torture(Target("tether.examples.pydantic_ai_refunds:harness", "refunds",
                                  "Refund A1 and B2"), seeds=4)
    assert report.violations == [], report.violations
    assert report.runs == 8 and report.kills >= 2


async def test_fault_runs_alone_find_nothing_wrong_with_the_harness() -> None:
    """With every fault switched on hard, the harness may park the task for a person, but it
    never repeats a side effect or loses an event."""
    plan = FaultPlan(tool_error=0.4, slow_tool=0.3, model_error=0.3, awkward_event=0.5)
    report = await torture(Target("tether.examples:demo_app", "refund",
                                  {"orders": [{"id": "A", "cents": 1}]}), seeds=6, kills=False,
                           plan=plan)
    assert report.violations == []
    assert report.runs == 6


def test_cli_exit_status_and_replay_line(tmp_path: Path) -> None:
    """`tether torture` exits 1 and prints a replay command when it finds a violation."""
    result = subprocess.run(
        [sys.executable, "-m", "tether", "torture", BROKEN.app, BROKEN.agent, "--input",
         json.dumps(BROKEN.input), "--seeds", "8", "--only", "kills"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    assert "side effect repeated" in out
    assert "replay: tether torture tether.examples.broken:harness charges" in out


def test_r01_a_baseline_that_does_not_complete_fails_the_command(tmp_path: Path) -> None:
    """Issue 29: with no --input the refund agent cannot complete even undisturbed; torture
    must not report "no violations" for runs that tested nothing: exit 1, saying why."""
    result = subprocess.run(
        [sys.executable, "-m", "tether", "torture", "tether.examples:demo_app", "refund",
         "--seeds", "1"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "COLUMNS": "300"})
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 1, said
    assert "does not complete even without faults or kills" in said
    assert "no violations" not in said


RECEIPTS = """
import tether as tt

harness = tt.Harness()


@harness.tool(side_effect=True)
async def pay(ctx: tt.ToolContext, amount: int) -> dict:
    return {"paid": amount, "receipt": ctx.idempotency_key}


@harness.agent("receipt")
class Receipt(tt.Agent):
    async def plan(self, task):
        if task.last_tool_result is None:
            return tt.ToolCall("pay", {"amount": task.input["amount"]})
        return tt.Finish({"receipt": task.last_tool_result["receipt"], "task": task.task_id})
"""


async def test_r01_a_result_holding_tethers_key_is_not_a_result_changed_by_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: each run is a task of its own, so tether's key (and the task's id) in a
    result differ from the baseline's whatever the agent does; they are left out of the
    comparison."""
    (tmp_path / "receipts_app.py").write_text(RECEIPTS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    report = await torture(Target("receipts_app:harness", "receipt", {"amount": 3}), seeds=3,
                           faults=False)
    assert [v for v in report.violations if v.kind == "result changed by a restart"] == []
    assert report.runs == 3

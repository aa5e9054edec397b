"""R9, R10, R11: a crew of five tasks whose worker is SIGKILLed inside the tool call of its
third task resumes in its third task (issue 31). The parent kills the child
(``_crew_app.py``) there, then finishes the task with a harness of its own on the same
store, as a restarted service would: the first two tasks are replayed from the dialog (no
model request, no tool run again), the interrupted call runs once more under the same key,
and not one model request is paid twice. Both ways CrewAI asks for tools: native function
calls, and ReAct text it parses."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("crewai", reason="CrewAI runs in its own environment: .ci/crewai-venv")

import tether as tt

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "chaos"))
from _child import ChildProcess  # noqa: E402

_spec = importlib.util.spec_from_file_location("tether_crew_app", HERE / "_crew_app.py")
assert _spec is not None and _spec.loader is not None
app = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(app)

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]


def killed_in(tmp_path: Path, step: int, native: bool) -> str:
    """Start the child, wait until crew task *step* is inside its tool call, SIGKILL it."""
    env = {**os.environ, "CREW_LEDGER": str(tmp_path / "ledger.db"), "CREW_BLOCK": str(step),
           "CREW_CHILD": "1", "CREW_TEXT": "0" if native else "1", "PYTHONUNBUFFERED": "1",
           "CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_TRACING_ENABLED": "false"}
    child = ChildProcess([sys.executable, str(HERE / "_crew_app.py"), str(tmp_path / "t.db")],
                         env, tmp_path, "crew", 60.0)
    task = child.expect("TASK ").split()[1]
    child.expect(f"IN work {step}")
    child.kill()
    return task


async def finish(tmp_path: Path, task: str, native: bool) -> tt.TaskInfo:
    h = app.harness(str(tmp_path / "t.db"), native=native)
    try:
        await h.run_until_idle(timeout=60)
        return await h.get(task)
    finally:
        await h.close()


@pytest.mark.parametrize("native", [True, False], ids=["native_calls", "react_text"])
def test_r09_r10_a_crew_killed_in_task_3_resumes_in_task_3(tmp_path: Path,
                                                           native: bool) -> None:
    """Killed inside the tool call of crew task 3 of 5: the task completes with task 5's
    answer; each crew task's model was asked exactly twice over both processes (the
    uninterrupted count: nothing paid again), tasks 1 and 2 ran their tool once, task 3's
    idempotent call ran again under the same key, tasks 4 and 5 once."""
    os.environ["CREW_LEDGER"] = str(tmp_path / "ledger.db")
    try:
        task = killed_in(tmp_path, 3, native)
        before = Counter((what, step) for what, step, _ in app.runs())
        assert before == Counter({("model", 1): 2, ("model", 2): 2, ("model", 3): 1,
                                  ("work", 1): 1, ("work", 2): 1, ("work", 3): 1}), before
        info = asyncio.run(finish(tmp_path, task, native))
        runs = app.runs()
    finally:
        os.environ.pop("CREW_LEDGER", None)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "step 5 done"
    counted = Counter((what, step) for what, step, _ in runs)
    assert all(counted["model", n] == 2 for n in range(1, 6)), counted
    assert [counted["work", n] for n in range(1, 6)] == [1, 1, 2, 1, 1], counted
    keys = [key for what, step, key in runs if what == "work" and step == 3]
    assert len(set(keys)) == 1, keys

"""Crash loops with real processes killed by SIGKILL (R12, R26, E5, E6).

The agent here takes its own worker process down with SIGKILL from inside ``plan()``
(a poison step: say, the model client running out of memory). Each scenario runs
workers as child processes -- this very file, run as a script -- one after another
on one SQLite file, and checks what the store says afterwards.

- The crash budget counts crashes that happen before the task ever committed a step
  (review r8): after ``max_recovery_attempts`` (3) crashed recoveries the next worker
  hands the task to a person instead of dying again.
- A person's resume starts a fresh budget (review r18): one later crash is recovered,
  not sent straight back to needs_human.

Child usage: ``python test_crash_loops.py DB {run|submit-first|submit-later}``; the agent
reads its mode (``kill``: die at the poison step, ``once``: die there once, ``ok``) from
``DB.mode``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

import tether as tt

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")
KILLED = -signal.SIGKILL
LEASE = 0.2
SETTINGS = tt.Settings(lease_seconds=LEASE, poll_interval=0.01, recovery_backoff=0.01)
TASK = "t1"


# ---------------------------------------------------------------------- the child's app


class Poisoned(tt.Agent):
    """Dies (SIGKILL of its own process) at its poison step, as ``DB.mode`` says.

    Input ``{"poison_at": 0}`` dies at the very first plan(), before the task ever
    committed anything; ``{"poison_at": 1}`` first commits a harmless Reply.
    Every plan() call that reaches the poison step is counted in ``DB.plans``.
    """

    def __init__(self, db: str) -> None:
        self.db = db

    async def plan(self, task: tt.TaskView) -> tt.Action:
        if task.step < task.input["poison_at"]:
            return tt.Reply("starting")
        with open(self.db + ".plans", "a") as f:
            f.write(f"{os.getpid()}\n")
        mode = Path(self.db + ".mode").read_text().strip()
        killed_once = Path(self.db + ".killed")
        if mode == "kill" or (mode == "once" and not killed_once.exists()):
            killed_once.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return tt.Finish("ok")


def build_harness(db: str | Path) -> tt.Harness:
    harness = tt.Harness(f"sqlite:///{db}", settings=SETTINGS)
    harness.add_agent("poisoned", Poisoned(str(db)))
    return harness


def _child_main(db: str, cmd: str) -> int:
    async def go() -> int:
        async with build_harness(db) as harness:
            if cmd.startswith("submit"):
                poison_at = 0 if cmd == "submit-first" else 1
                await harness.submit("poisoned", {"poison_at": poison_at}, task_id=TASK)
            else:
                await harness.run_until_idle(timeout=10)
        return 0

    return asyncio.run(go())


# ---------------------------------------------------------------------- parent side


def with_harness(db: Path, fn: Callable[[tt.Harness], Awaitable[T]]) -> T:
    async def go() -> T:
        async with build_harness(db) as harness:
            return await fn(harness)

    return asyncio.run(go())


def record(db: Path) -> tt.TaskRecord:
    return with_harness(db, lambda h: h.store.get_task(TASK))


def plans(db: Path) -> int:
    path = Path(f"{db}.plans")
    return len(path.read_text().split()) if path.exists() else 0


def set_mode(db: Path, mode: str) -> None:
    Path(f"{db}.mode").write_text(mode)


def worker(db: Path, cmd: str = "run") -> tuple[int, str]:
    """Run one child worker to its end (death by SIGKILL or a clean exit)."""
    proc = subprocess.run([sys.executable, __file__, str(db), cmd], capture_output=True,
                          text=True, timeout=30, cwd=str(db.parent))
    return proc.returncode, proc.stderr[-3000:]


def wait_for_lease_to_expire(db: Path) -> None:
    """A dead worker's lease must run out before anyone may claim the task again."""
    deadline = time.monotonic() + 5
    while True:
        rec = record(db)
        if rec.lease_until is None or rec.lease_until < time.time():
            return
        assert time.monotonic() < deadline, f"lease never expired: {rec}"
        time.sleep(0.02)


def killed_worker(db: Path) -> None:
    code, stderr = worker(db)
    assert code == KILLED, f"expected the worker to die by SIGKILL, got {code}:\n{stderr}"
    wait_for_lease_to_expire(db)


def clean_worker(db: Path) -> None:
    code, stderr = worker(db)
    assert code == 0, f"expected a clean exit, got {code}:\n{stderr}"


def crash_loop_to_needs_human(db: Path) -> tt.TaskRecord:
    """Run 1 dies; runs 2-4 are recoveries 1-3 and die; run 5 must hand it to a person."""
    for _ in range(1 + SETTINGS.max_recovery_attempts):
        killed_worker(db)
    clean_worker(db)
    return record(db)


# ---------------------------------------------------------------------- tests


def test_r12_crash_loop_before_the_first_commit_ends_in_needs_human(tmp_path: Path) -> None:
    """R12, R26, E6 (r8): a plan that SIGKILLs its worker on the task's very first step.

    The task never commits anything (it stays ``pending`` at version 1), yet every
    expired lease must count as a crash: after max_recovery_attempts crashed recoveries
    the next worker hands the task to a person instead of calling plan() and dying again.
    """
    db = tmp_path / "tether.db"
    set_mode(db, "kill")
    assert worker(db, "submit-first")[0] == 0

    for n in range(1 + SETTINGS.max_recovery_attempts):
        killed_worker(db)
        rec = record(db)
        # shown as running from the moment a worker started it (R2), but no snapshot committed
        assert rec.status is tt.Status.RUNNING and rec.head_version == 1
        assert plans(db) == n + 1

    clean_worker(db)  # armed to die as well, if it ever called plan()
    rec = record(db)
    assert rec.status is tt.Status.NEEDS_HUMAN, (rec.status, rec.reason)
    assert rec.reason is not None and "gave up after 3 recoveries" in rec.reason, rec.reason
    assert rec.lease_owner is None
    assert plans(db) == 1 + SETTINGS.max_recovery_attempts

    clean_worker(db)  # and it stays parked for the person: nobody runs it again
    assert record(db).status is tt.Status.NEEDS_HUMAN
    assert plans(db) == 1 + SETTINGS.max_recovery_attempts


def test_r12_person_resume_gives_a_crash_looped_task_a_fresh_budget(tmp_path: Path) -> None:
    """R12, R26 (r18): a task crash-looped into needs_human; a person fixes the cause and
    resumes it. One later crash is an ordinary recovery: the task must not go straight
    back to needs_human because of the crashes counted before the resume."""
    db = tmp_path / "tether.db"
    set_mode(db, "kill")
    assert worker(db, "submit-later")[0] == 0
    rec = crash_loop_to_needs_human(db)
    assert rec.status is tt.Status.NEEDS_HUMAN, (rec.status, rec.reason)
    assert plans(db) == 1 + SETTINGS.max_recovery_attempts

    set_mode(db, "once")  # the fix is not perfect: the process dies once more
    Path(f"{db}.killed").unlink()
    receipt = with_harness(db, lambda h: h.resume(TASK, message="fixed the OOM, go on"))
    assert receipt.accepted
    assert record(db).status is tt.Status.RUNNING

    killed_worker(db)
    clean_worker(db)
    info: Any = with_harness(db, lambda h: h.get(TASK))
    assert info.record.status is tt.Status.COMPLETED, (info.record.status, info.record.reason)
    assert info.snapshot.result == "ok"
    assert plans(db) == 1 + SETTINGS.max_recovery_attempts + 2


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1], sys.argv[2]))

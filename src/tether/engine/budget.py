"""The recovery budget (R12, R22): attempts counted per resume point, the failure
fingerprints already seen, and ``recovery_timeout`` for the whole recovery.

Both a failing call (:mod:`calls`) and a failing plan or a crash (:mod:`recovery`) spend
from one budget; a step that succeeds gives it back.
"""

from __future__ import annotations

import time

from tether.engine.task import RunningTask, hand_to_person
from tether.model import Status
from tether.strategies import Strategy


def count_attempt(task: RunningTask, why: str) -> bool:
    """Count one recovery; False (and the task handed over) once the budget is spent (R12)."""
    rec = task.snap.recovery
    rec.attempts += 1
    rec.started_at = rec.started_at or time.time()
    rec.reasons.append(why)
    if rec.attempts > task.settings.max_recovery_attempts:
        hand_to_person(task, f"gave up after {rec.attempts - 1} recoveries at step"
                             f" {task.snap.step}; last: {why}", strategy=Strategy.NEEDS_HUMAN)
        return False
    if time.time() - rec.started_at > task.settings.recovery_timeout:
        task.snap.error = (f"recovery took longer than recovery_timeout="
                             f"{task.settings.recovery_timeout}s; last: {why}")
        task.set_status(Status.FAILED)
        task.log_recovery(Strategy.FAIL_TIMEOUT, detail=task.snap.error)
        return False
    return True


def next_recovery(task: RunningTask, fingerprint: str, failure: str,
                   trace: str | None = None) -> float | None:
    """The backoff before the next recovery, or None once the task was handed over (R12, R22)."""
    rec = task.snap.recovery
    if fingerprint in rec.fingerprints:
        hand_to_person(task, f"{failure} failed again the same way; fingerprint"
                             f" {fingerprint} seen before, so it is not retried", traceback=trace)
        return None
    if not count_attempt(task, failure):
        task.request_commit()
        return None
    rec.fingerprints.append(fingerprint)
    return task.settings.recovery_backoff * float(2 ** (rec.attempts - 1))


def progress_made(task: RunningTask) -> None:
    """A step succeeded: the recovery budget is per resume point, so it starts afresh."""
    task.mark_progress()
    task.counters["steps"] += 1
    rec = task.snap.recovery
    if rec.attempts or rec.fingerprints:
        rec.attempts = 0
        rec.fingerprints = []
        rec.started_at = None

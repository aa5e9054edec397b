"""The names of recovery actions: what the recovery log, the metrics and the CLI call them (R23).

Every record in a task's recovery log names the one action taken, as ``resume_strategy``;
``/metrics`` counts them per name (``tether_recoveries_total{strategy=...}``), so these
strings are part of what operators alert on and must never change meaning.
"""

from __future__ import annotations

import enum


class Strategy(enum.StrEnum):
    """One recovery action, as logged."""

    # A worker died or stopped.
    RESUME = "resume"
    """A crashed task was restored from its newest snapshot by another worker."""
    RELEASED = "released"
    """A stopping worker handed the task over cleanly at a step boundary."""
    FALLBACK_VERSION = "fallback_version"
    """The newest snapshot was unreadable; an older one was loaded instead."""
    RESOURCE_MISSING = "resource_missing"
    CLEANUP_FAILED = "cleanup_failed"
    # A call whose outcome a crash left unknown (R10).
    REUSE_RESULT = "reuse_result"
    RERUN_FAILED = "rerun_failed"
    RERUN_IDEMPOTENT = "rerun_idempotent"
    RECONCILE = "reconcile"
    RECONCILE_NOT_DONE = "reconcile_not_done"
    OUTCOME_UNKNOWN = "outcome_unknown"
    IDEMPOTENCY_MISMATCH = "idempotency_mismatch"
    # Failures and their bounded retries (R12, R22).
    RETRY_BACKOFF = "retry_backoff"
    RETRY_PLAN = "retry_plan"
    RETRY_NOW = "retry_now"
    SKIP = "skip"
    FAIL_TIMEOUT = "fail_timeout"
    NEEDS_HUMAN = "needs_human"
    STEP_LIMIT = "step_limit"
    COMPLETION_LIMIT = "completion_limit"
    """The task paid for its budget of model completions (``Settings.max_completions``)."""
    REPEATED_SIDE_EFFECT = "repeated_side_effect"
    """The same side-effecting call was asked for once too often; it did not run."""
    # Events and time (R3, R5, E6).
    PAUSE = "pause"
    REPLAN = "replan"
    ANSWER_SET_ASIDE = "answer_set_aside"
    """A newer message arrived before the rest of an answer ran: its calls were not run."""
    REPLAN_REFUSED = "replan_refused"
    WAIT_VALIDATED = "wait_validated"
    WAIT_TIMEOUT = "wait_timeout"
    STALE_ANSWER_IGNORED = "stale_answer_ignored"
    """An event named the wait it answers, and the task no longer holds that wait (it moved
    on, or waits for another call): the answer was not applied to what it was not about."""
    TASK_TIMEOUT = "task_timeout"
    DEGRADE = "degrade"
    RECOVER = "recover"
    DEGRADE_PAUSE = "degrade_pause"
    RECOVER_RESUME = "recover_resume"
    # A person's levers (R14, R26).
    HUMAN_RESUME = "human_resume"
    HUMAN_DECISION = "human_decision"
    AMEND = "amend"
    RESUME_IGNORED = "resume_ignored"
    ROLLBACK = "rollback"
    ROLLBACK_REFUSED = "rollback_refused"
    CANCEL_SUBTASK = "cancel_subtask"
    """A parent ended its running subtasks; it sees their cancellation as ``child_error``."""
    CANCEL_SUBTASK_REFUSED = "cancel_subtask_refused"
    """A subtask could not be ended yet: its side-effecting call's outcome is unknown."""
    FORK = "fork"
    """This task was forked from a kept version of another (the first record of a fork)."""
    CANCEL_FAILED = "cancel_failed"
    RESUME_FAILED = "resume_failed"
    ROLLBACK_FAILED = "rollback_failed"
    DECIDE_FAILED = "decide_failed"

    @classmethod
    def lever_failed(cls, lever: str) -> Strategy:
        """The record of a lever (cancel, resume, rollback, decide) that could not be applied."""
        return cls(f"{lever}_failed")

    @staticmethod
    def is_refusal(name: str) -> bool:
        """Whether a record's strategy says a lever was refused, failed or ignored (the CLI
        reports it so); any name is judged, also one written by another tether version."""
        return name.endswith(("_failed", "_refused", "_ignored"))

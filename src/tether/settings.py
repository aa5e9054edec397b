"""Harness settings and their defaults (R12)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tether.errors import ConfigurationError

SCHEDULE_HOLD_MAX = 60.0
"""The longest a worker may hold schedules: as late as a run may start and still be on time
(``tether.schedules.GRACE``)."""


@dataclass(frozen=True)
class Settings:
    """Knobs with defaults a production deployment can start from.

    A tool call always gets a resume point before it runs; ``checkpoint_every_steps``
    sets how often the *other* steps (replies, spawns) are made durable: 1 makes
    every step durable, a larger number lets a light task batch them (R25).
    """

    max_recovery_attempts: int = 3
    """Recoveries of one resume point before the task goes to needs_human."""
    recovery_timeout: float = 600.0
    """Seconds one recovery may take in all before the task fails and someone is notified."""
    checkpoint_every_steps: int = 1
    inbox_capacity: int = 1000
    """Pending events per task; beyond it P2-P4 are refused, P0/P1 always taken (R7)."""
    max_payload_bytes: int = 1 << 20
    """Largest event payload or task input accepted, as JSON (1 MiB). Larger data belongs in a
    resource or blob store the payload points to; a huge payload would be copied into every
    recovery bundle and history read."""
    max_result_bytes: int = 4 << 20
    """Largest tool result accepted, as JSON (4 MiB). A larger one is recorded as done (its
    side effect happened) but not kept, and the task goes to a person naming the tool: the
    result would be copied into the dialog, the idempotency table and every bundle."""
    max_steps: int = 10_000
    """Steps a task may take before it goes to a person naming this limit: a runaway agent
    stops instead of running up a bill. Per task: ``submit(..., max_steps=)``; a person's
    resume grants the same number again."""
    max_completions: int = 1_000
    """Model completions a task may pay for before it goes to a person naming this limit (a
    model that loops costs money on every turn); a person's resume grants the same again."""
    max_identical_side_effects: int = 1
    """How often one side-effecting call (same tool, same arguments, a framework's call ids
    aside) may succeed in a task; the next identical one is held for a person before it runs
    (1: the second is held). A model that asks for the same refund again gets it under a new
    key, so idempotency alone does not stop it. A tool registered ``repeatable=True`` is never
    held for it; only calls that succeeded count."""
    coalesce_window: float = 1.5
    keep_versions: int = 10
    lease_seconds: float = 15.0
    """A worker that stops renewing for this long is presumed dead; its tasks are recovered."""
    drain_timeout: float = 30.0
    """On a graceful stop, how long tasks may take to finish the step they are in."""
    poll_interval: float = 0.2
    """How often a worker looks for work and for events sent by other processes."""
    recovery_backoff: float = 0.5
    """Base delay before re-running a call that gave up, doubled per recovery attempt."""
    defer_results_under: float = 0.05
    """An idempotent call quicker than this (seconds) commits its result together with the
    next step's resume point: one fsync per step instead of two. A crash in between re-runs
    that call (same key), wasting at most this much tool time. 0 commits every result at once.
    Side-effecting calls always commit their result at once."""
    slot_wait: float = 1.0
    """Seconds a task held back by a concurrency limit (its limit full, or others waiting
    ahead) waits for a slot in the memory of the worker running it, still leased, before it
    is parked in the store: a slot let go then reaches it at once (in the same worker, or by
    the store's notice) instead of through park, wake, claim and load. It holds one of the
    worker's places meanwhile. 0 parks at once."""
    sqlite_synchronous: str = "FULL"
    """FULL survives power loss; NORMAL survives a process crash only, and is faster."""
    blob_threshold: int = 64 * 1024
    """Strings longer than this many bytes are stored apart from the snapshot head, once
    per content, and loaded when the task is loaded to run (R20)."""
    cache_ttl: float = 3600.0
    """Seconds a snapshot head stays in the Redis cache after it was written or read."""
    postgres_pool_size: int = 10
    """Most connections one process holds to a PostgreSQL store."""
    retain_completed: float | None = None
    """Seconds a completed task is kept after it finished, then deleted with everything it
    stored (None: kept for ever). Workers delete in the background, in batches."""
    retain_failed: float | None = None
    """The same for failed tasks (they may be resumed, so a longer keep is usual)."""
    retain_cancelled: float | None = None
    """The same for cancelled tasks."""
    housekeeping_interval: float = 60.0
    """How often a worker deletes the finished tasks past their retention and collects the
    large values no kept version refers to any more."""
    schedule_hold: float = 30.0
    """Seconds a worker holds the due schedules it took while it starts their runs, so other
    workers take others: a worker that dies holding some delays their runs by at most this
    much. At most 60 (a run up to a minute late is still on time, so none is skipped for it);
    a worker slower than this only costs repeated attempts, which the store refuses."""

    def __post_init__(self) -> None:
        for name in ("max_recovery_attempts", "checkpoint_every_steps", "inbox_capacity",
                     "keep_versions", "max_payload_bytes", "postgres_pool_size",
                     "blob_threshold", "max_result_bytes", "max_steps", "max_completions",
                     "max_identical_side_effects"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"setting {name} must be at least 1")
        for name in ("recovery_timeout", "lease_seconds", "poll_interval", "drain_timeout",
                     "cache_ttl", "housekeeping_interval"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"setting {name} must be positive")
        if min(self.coalesce_window, self.recovery_backoff, self.defer_results_under,
               self.slot_wait) < 0:
            raise ConfigurationError("coalesce_window, recovery_backoff, defer_results_under and"
                                     " slot_wait cannot be negative")
        if any(keep is not None and keep < 0 for keep in self.retention().values()):
            raise ConfigurationError("retain_completed, retain_failed and retain_cancelled"
                                     " cannot be negative (None keeps tasks for ever)")
        if not 0 < self.schedule_hold <= SCHEDULE_HOLD_MAX:
            raise ConfigurationError(f"setting schedule_hold must be above 0 and at most"
                                     f" {SCHEDULE_HOLD_MAX:g} seconds (a run that late is still"
                                     f" on time)")
        if self.sqlite_synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise ConfigurationError("sqlite_synchronous must be FULL, NORMAL or EXTRA")

    def retention(self) -> dict[str, float | None]:
        """Seconds each finished status is kept (None: for ever), by status name."""
        return {"completed": self.retain_completed, "failed": self.retain_failed,
                "cancelled": self.retain_cancelled}

    def replace(self, **changes: object) -> Settings:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

"""Degraded modes (R3, "service degradation"): run the agent's declared fallback until recovery.

A ``degrade`` event puts one task in its agent's fallback until a ``recover``
event; ``Harness.degrade`` (or ``tether worker --degraded``) does it for every
task a worker runs, until ``Harness.recover``. What the fallback *is*, each
agent declares with a :class:`Fallback`:

- ``options``: settings the agent reads in ``plan`` while ``task.degraded`` is set
  (a cheaper model, a smaller context);
- ``tools``: the tools still allowed (a read-only set, say); a planned call to any
  other tool is not run: the task pauses until recovery, with the call kept;
- ``pause``: pause and ask instead of working degraded at all.

Every switch is written to the dialog with its scope (task or worker), so the
history shows which steps ran degraded. Like every event, the switch is applied
by the task's own loop, between steps.
"""

from __future__ import annotations

from typing import Any

from tether import dialog
from tether.engine.task import RunningTask
from tether.model import Event, Snapshot, Status
from tether.strategies import Strategy

DEGRADE_EVENTS = frozenset({"degrade", "recover"})
PAUSED_BY_DEGRADE = "degrade_paused"
"""Key in ``Snapshot.signals`` marking a pause that recovery should end (a person's pause
is never ended by a ``recover`` event)."""


def in_force(snap: Snapshot) -> dict[str, Any] | None:
    """The degradation a task runs under: its own, else its worker's."""
    return snap.degraded or snap.worker_degraded


def switch(task: RunningTask, event: Event) -> None:
    """A task-level ``degrade`` or ``recover`` event changes the task's mode. (The event itself
    is then delivered like any other: written to the dialog, offered to the agents, and
    treated per its priority; a P2 degrade also brings a pending retry forward, E2.)"""
    snap = task.snap
    if event.type == "recover" and snap.degraded is None:
        return
    payload = event.payload if isinstance(event.payload, dict) else {"reason": event.payload}
    snap.degraded = {**payload, "event_id": event.id} if event.type == "degrade" else None
    task.log_recovery(Strategy(event.type), event.id, f"task: {payload}")
    _follow(task, event.id)


def follow_worker(task: RunningTask) -> None:
    """Record a change of the worker-wide mode in this task's dialog, and follow it."""
    snap = task.snap
    wanted = task.worker_degraded
    if wanted == snap.worker_degraded or snap.status.is_terminal:
        return
    snap.worker_degraded = wanted
    kind = "degrade" if wanted else "recover"
    task.append_history(dialog.system(kind, scope="worker", content=wanted))
    task.log_recovery(Strategy(kind), detail=f"worker: {wanted}")
    _follow(task, None)


def allows(task: RunningTask, tool: str) -> bool:
    """Whether a call to *tool* may run now; if not, the task pauses until recovery."""
    snap = task.snap
    if in_force(snap) is None:
        return True
    allowed = task.agent_for(snap.frame).fallback.tools
    if allowed is None or tool in allowed:
        return True
    _pause(task, f"{tool} is not in the fallback tool set while degraded; it runs after a"
                   " recover event")
    return False


def _follow(task: RunningTask, event_id: int | None) -> None:
    """Pause if the agent's fallback says so; end a pause that degradation caused."""
    snap = task.snap
    if in_force(snap) is not None and task.agent_for(snap.frame).fallback.pause:
        _pause(task, "the agent's fallback is to pause while degraded")
    elif in_force(snap) is None and snap.signals.pop(PAUSED_BY_DEGRADE, None) \
            and snap.status is Status.PAUSED:
        task.set_status(Status.RUNNING)
        task.log_recovery(Strategy.RECOVER_RESUME, event_id, "degradation over; carrying on")


def _pause(task: RunningTask, why: str) -> None:
    snap = task.snap
    if snap.status is not Status.RUNNING:
        return
    snap.signals[PAUSED_BY_DEGRADE] = True
    task.set_status(Status.PAUSED)
    task.log_recovery(Strategy.DEGRADE_PAUSE, detail=why)

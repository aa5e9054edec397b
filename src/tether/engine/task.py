"""The task being run, as the engine's helpers see it: what they read and what they may change.

:mod:`recovery`, :mod:`events`, :mod:`timers` and :mod:`degrade` decide what a crash, an
event, a due time or a degraded mode means for a task. They work on a
:class:`RunningTask` (the runner is the one implementation), never on the runner itself:
they change the snapshot and buffer dialog rows, idempotency records and recovery records
through it, and ask for a commit with :meth:`RunningTask.request_commit`. Only the runner
commits, at the end of the step, the event or the restart that asked for it, so a helper
can be tested with a plain object and no store.

The few state changes several helpers share (a wait ending, a task handed to a person,
its resources cleaned up, an action put first, a frame popped) live here, below all of
them, so the runner and a test double run the same code for them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from tether import dialog
from tether.agent import Agent, TaskView
from tether.engine.dialog_rows import DialogRows
from tether.errors import TetherError
from tether.model import (
    Action,
    AgendaEntry,
    CallState,
    Cleanup,
    Event,
    Fail,
    Finish,
    Frame,
    IdempotencyRecord,
    OutcomeStatus,
    Snapshot,
    Status,
    action_to_dict,
    to_plain,
)
from tether.resources import ResourceKinds
from tether.settings import Settings
from tether.store.base import Claim, StoredEvent
from tether.strategies import Strategy
from tether.tools import Tool


class TaskReads(Protocol):
    """The store reads a helper may make while the task runs (all under the runner's lease)."""

    async def get_idempotency(self, key: str) -> IdempotencyRecord | None: ...

    async def idempotency_keys(self, task_id: str) -> set[str]: ...

    async def pending_events(self, task_id: str) -> list[StoredEvent]: ...

    async def read_history(self, task_id: str,
                           segments: Sequence[Sequence[int]]) -> list[dict[str, Any]]: ...

    async def next_epoch(self, task_id: str) -> int: ...

    async def load_head(self, task_id: str, version: int | None = None) -> tuple[int, bytes]: ...

    async def load_blobs(self, digests: Collection[str]) -> dict[str, bytes]: ...


class RunningTask(Protocol):
    """One claimed task in the middle of its run."""

    @property
    def snap(self) -> Snapshot:
        """The task's state; helpers change it in place (only while the runner awaits them)."""

    @property
    def version(self) -> int:
        """The version the snapshot was loaded from or last committed as."""

    @property
    def history(self) -> DialogRows:
        """The task's dialog (its rows read from the store when first needed)."""

    @property
    def claim(self) -> Claim: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def tools(self) -> Mapping[str, Tool]: ...

    @property
    def resource_kinds(self) -> ResourceKinds: ...

    @property
    def counters(self) -> Counter[str]: ...

    @property
    def worker_degraded(self) -> dict[str, Any] | None:
        """The worker-wide degradation the task should follow (R3)."""

    @property
    def reads(self) -> TaskReads: ...

    def agent_for(self, frame: Frame) -> Agent:
        """The registered agent of *frame*; UnknownAgent naming the task if it is gone."""

    async def view(self, scratch: dict[str, Any] | None = None,
                   frame: Frame | None = None) -> TaskView:
        """What an agent sees of the task (a copy of *frame*'s scratch unless given)."""

    def set_status(self, status: Status) -> None:
        """Move the task to *status*; IllegalTransition if the lifecycle does not allow it."""

    def supersedes(self, event_type: str) -> bool:
        """Whether the interruption protocol says an event of this type sets aside the rest
        of the answer being carried out (a newer message)."""

    def append_history(self, entry: dict[str, Any]) -> None:
        """Add one dialog row (written with the next commit)."""

    def log_recovery(self, strategy: Strategy, event_id: int | None = None,
                     detail: str = "", traceback: str | None = None) -> None:
        """Record one recovery action (R23), written with the next commit; *traceback* is
        the failure's, when there was one."""

    def record_idempotency(self, call: CallState, status: OutcomeStatus, result: Any = None,
                           error: str | None = None) -> None:
        """Record what is known of a keyed call's outcome, written with the next commit."""

    def put_first(self, action: Action, frame: Frame | None = None,
                  agent: Agent | None = None) -> None:
        """Run *action* before the frame's recorded work, keeping that work."""

    def pop_frame(self, action: Finish | Fail, by: dict[str, Any]) -> None:
        """End the top frame with *action*'s result or failure: its parent sees it, or the
        task completes or fails with it."""

    def finish_call(self, call: CallState, result: Any, from_record: bool = False,
                    defer: bool = False) -> None:
        """Record the open call's result and move past it; a commit is asked for unless
        *defer* (a quick idempotent call rides along with the next one)."""

    def replace_state(self, snap: Snapshot, history: list[dict[str, Any]]) -> None:
        """Swap in an older snapshot (a rollback); what was applied since the last commit
        goes back to the inbox."""

    def captured_head(self, event_id: int, version: int) -> bytes | None:
        """The head a rollback lever read in this process when it was asked, if still held."""

    async def fire(self, event: Event) -> None:
        """Store a timer's system event in the inbox, once (E6)."""

    def mark_progress(self) -> None:
        """The next commit moves the task forward (the store's crash counter starts again)."""

    def request_commit(self) -> None:
        """What was changed must be durable before the task goes on: the runner commits at
        the end of the current step, event or restart."""


def end_wait(task: RunningTask, outcome: dict[str, Any], frame: Frame | None = None) -> None:
    """Resolve a frame's wait with the event that ended it (or a timeout marker)."""
    frame = frame or task.snap.frame
    frame.wait = None
    frame.last_event = outcome
    if frame is task.snap.frame and task.snap.status is Status.WAITING:
        task.set_status(Status.RUNNING)


def hand_to_person(task: RunningTask, reason: str,
                   strategy: Strategy = Strategy.NEEDS_HUMAN,
                   traceback: str | None = None) -> None:
    """Park the task for a person (R26); the worker exports the bundle and notifies. The
    failure's *traceback* goes into the recovery log, where show, the console and the
    bundle find it."""
    task.snap.error = reason
    task.snap.recovery.reasons.append(reason)
    task.set_status(Status.NEEDS_HUMAN)
    task.log_recovery(strategy, detail=reason, traceback=traceback)
    task.request_commit()


def clean_up_resources(task: RunningTask) -> None:
    """Apply each resource's cleanup policy when the task ends."""
    succeeded = task.snap.status is Status.COMPLETED
    for resource in task.snap.resources:
        if resource.cleanup == Cleanup.KEEP or (resource.cleanup == Cleanup.ON_SUCCESS
                                                and not succeeded):
            continue
        try:
            task.resource_kinds.get(resource.kind).cleanup(resource.ref)
        except (OSError, TetherError) as error:
            task.log_recovery(Strategy.CLEANUP_FAILED,
                              detail=f"{resource.kind} {resource.ref}: {error}")


def recorded(action: Action, agent: Agent | None = None) -> AgendaEntry:
    """The action as the agenda keeps it, with the code that planned it (E8)."""
    return AgendaEntry(action_to_dict(action),
                       f"{agent.name}@{agent.version}" if agent is not None else None)


def put_first(task: RunningTask, action: Action, frame: Frame | None = None,
              agent: Agent | None = None) -> None:
    """Run *action* before the frame's recorded work, keeping that work (the to-do list).

    A call that is open but not in flight (cancelled by a P0, or waiting
    out a retry) is parked inside its own agenda entry with its key and
    attempt count, and picked up again when that entry comes round.
    """
    frame = frame or task.snap.frame
    call = task.snap.call
    if call is not None and frame is task.snap.frame and frame.agenda:
        frame.agenda[0].open_call = call
        task.snap.call = None
    frame.agenda.insert(0, recorded(action, agent))


def pop_frame(task: RunningTask, action: Finish | Fail, by: dict[str, Any]) -> None:
    """End the top frame with *action*'s result or failure: its parent sees it, or the task
    completes or fails with it (resources cleaned up)."""
    done = task.snap.stack.pop()
    failed = isinstance(action, Fail)
    outcome = action.reason if isinstance(action, Fail) else to_plain(action.result)
    task.append_history(dialog.system("fail" if failed else "finish", agent=done.agent,
                                      content=outcome, **by))
    if task.snap.stack:
        parent = task.snap.frame
        parent.child_result = None if failed else outcome
        parent.child_error = outcome if failed else None
        return
    task.snap.stack.append(done)
    if failed:
        task.snap.error = str(outcome)
        task.set_status(Status.FAILED)
    else:
        task.snap.result = outcome
        task.set_status(Status.COMPLETED)
    clean_up_resources(task)

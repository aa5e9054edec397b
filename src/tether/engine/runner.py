"""The per-task runner: each tick drains the inbox, then executes one step (R5, R11).

The runner is the single place that changes a task's state. Events are read
from the store and applied here, between steps; agents only propose actions.
Every tool call gets a resume point (a checkpoint recording its inputs and
idempotency key) before it runs, and its result is committed together with
the new head, the dialog rows and the events it consumed, in one transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from tether import blobs
from tether.agent import Agent, CutOff, TaskView
from tether.engine import degrade, recovery, timers
from tether.engine.events import apply_event
from tether.errors import (
    CorruptSnapshot,
    InvalidInput,
    LeaseLost,
    OutcomeUnknown,
    ToolTimeout,
    UnknownAgent,
)
from tether.failpoints import failpoint
from tether.model import (
    Action,
    CallState,
    Fail,
    Finish,
    Frame,
    IdempotencyRecord,
    Replan,
    Reply,
    Snapshot,
    Spawn,
    Status,
    ToolCall,
    Wait,
    action_from_dict,
    action_to_dict,
    check_transition,
    to_plain,
)
from tether.store import Checkpoint, Claim, HistoryRow, Store, StoredEvent
from tether.tools import Tool, ToolContext, args_hash, idempotency_key

if TYPE_CHECKING:
    from tether.harness import Harness

T = TypeVar("T")


class Preempted(Exception):
    """Internal: a P0 event cancelled the plan or interruptible tool in flight."""


async def _complete_history(store: Store, snap: Snapshot, version: int) -> list[dict[str, Any]]:
    """The head's dialog, or CorruptSnapshot if rows it counts on are missing from the store."""
    history = (await store.read_history(snap.task_id, snap.history_segments))[: snap.history_len]
    if len(history) < snap.history_len:
        raise CorruptSnapshot(f"task {snap.task_id} version {version}: dialog rows are missing"
                              f" (the head counts {snap.history_len}, the store has {len(history)})")
    return history


async def newest_readable(store: Store, task_id: str, with_history: bool = False
                          ) -> tuple[int, Snapshot, list[str], list[dict[str, Any]]]:
    """The newest version that reads back whole, why each newer one did not, and (with
    *with_history*) its dialog; a version whose dialog rows are missing is unreadable too."""
    version, data = await store.load_head(task_id)
    skipped: list[str] = []
    while True:
        try:
            snap = Snapshot.loads(await blobs.resolve(store, data, task_id, version), task_id,
                                  version)
            history = await _complete_history(store, snap, version) if with_history else []
            return version, snap, skipped, history
        except CorruptSnapshot as exc:
            skipped.append(str(exc))
            older = [v for v, _, _ in await store.list_versions(task_id) if v < version]
            if not older:
                raise CorruptSnapshot(f"task {task_id}: no readable snapshot is kept"
                                      f" ({'; '.join(skipped)})") from exc
            version, data = await store.load_head(task_id, older[-1])


class Runner:
    """Runs one claimed task until it parks, finishes or loses its lease."""

    def __init__(self, harness: Harness, claim: Claim, snap: Snapshot, version: int,
                 history: list[dict[str, Any]]) -> None:
        self.harness = harness
        self.store = harness.store
        self.settings = harness.settings
        self.claim = claim
        self.snap = snap
        self.version = version
        self.history = history
        self.wake = asyncio.Event()
        self.applied: set[int] = set()
        self.applied_levers: set[int] = set()
        self.fired: set[str] = set()
        self._stopping = False
        self._cancellable: asyncio.Future[Any] | None = None
        self._preempting = False
        self._rows: list[HistoryRow] = []
        self._events_done: list[tuple[int, str]] = []
        self._idempotency: list[IdempotencyRecord] = []
        self._log: list[dict[str, Any]] = []
        self._unsaved_steps = 0
        self._committed = False
        self._progress = False

    # ------------------------------------------------------------------ loading

    @classmethod
    async def load(cls, harness: Harness, claim: Claim) -> Runner:
        """Load the newest readable snapshot, falling back past corrupt versions."""
        store = harness.store
        version, snap, skipped, history = await newest_readable(store, claim.task_id,
                                                                with_history=True)
        if skipped:
            await recovery.branch_history(store, snap)
        runner = cls(harness, claim, snap, version, history)
        for reason in skipped:
            runner.log_recovery("fallback_version", detail=reason)
        return runner

    def view(self, scratch: dict[str, Any] | None = None, frame: Frame | None = None) -> TaskView:
        frame = frame or self.snap.frame
        scratch = copy.deepcopy(frame.scratch) if scratch is None else scratch
        return TaskView(self.snap, self.history, scratch, frame)

    def agent_for(self, frame: Frame) -> Agent:
        try:
            return self.harness.agents[frame.agent]
        except KeyError:
            raise UnknownAgent(
                f"agent {frame.agent!r} named by task {self.snap.task_id} is not registered"
            ) from None

    # ------------------------------------------------------------------ main loop

    async def run(self) -> Status:
        """Tick until the task parks (waiting, paused, needs_human) or ends."""
        await recovery.restore(self)
        with timers.deadline_alarm(self):
            while not self._stopping:
                await timers.fire_due(self)
                await self.tick()
                if self.snap.status is not Status.RUNNING:
                    break
                due = self._retry_due()
                if due is not None and due - time.time() >= self.settings.lease_seconds:
                    return await self.park(due)
                if due is not None and due > time.time():
                    await self.sleep_until(due)
                    continue
                await self.step()
        if self._stopping and self.snap.status is Status.RUNNING:
            self.log_recovery("released", detail="the worker is shutting down; the task was"
                              " released cleanly at a step boundary (no recovery counted)")
        await self.flush()
        return self.snap.status

    async def park(self, due: float) -> Status:
        """A long back-off: commit, and leave the due time to whichever worker is alive then
        (E6), instead of holding the lease and memory while nothing can happen."""
        await self.flush()
        await self.store.set_status(self.claim, Status.RUNNING, None, wake_at=due)
        return self.snap.status

    def _retry_due(self) -> float | None:
        call = self.snap.call
        if call is not None and call.retry_at:
            return call.retry_at
        return self.snap.recovery.retry_at

    async def tick(self) -> None:
        """Drain the inbox: apply pending events, most urgent first (R5)."""
        self.wake.clear()
        degrade.follow_worker(self)
        for stored in await self.store.pending_events(self.snap.task_id):
            if stored.event.id not in self.applied:
                with self.harness.telemetry.span("tether.event", **{
                        "tether.event_id": stored.event.id, "tether.event_type": stored.event.type,
                        "tether.priority": stored.priority}):
                    await apply_event(self, stored)

    async def step(self) -> None:
        """Carry out the frame's next recorded action, planning one first if there is none."""
        with self.harness.telemetry.span("tether.step", **{"tether.step": self.snap.step}):
            await self._step()

    async def _step(self) -> None:
        frame = self.snap.frame
        if self.snap.call is None and frame.agenda and "open_call" in frame.agenda[0]:
            self.snap.call = CallState(**frame.agenda[0].pop("open_call"))
        if self.snap.call is not None:
            pending = action_from_dict(frame.agenda[0])
            assert isinstance(pending, ToolCall), "an open call must head its frame's agenda"
            await self.call_tool(pending)
            return
        if not frame.agenda and frame.wait:
            self.set_status(Status.WAITING)  # an interjection ran; the armed wait resumes
            await self.commit()
            return
        if not frame.agenda:
            if await recovery.over_step_limit(self):
                return
            try:
                planned, scratch = await self.plan()
            except Preempted:
                return
            except Exception as error:  # a model call may fail in any way: bounded recovery
                await recovery.plan_failed(self, error)
                return
            self.snap.recovery.retry_at = None
            frame.scratch = scratch
            frame.agenda.append(planned)
            if self.agent_for(frame).commit_plans:
                await self.commit()  # the plan was paid for: never ask for it again
            return  # the loop drains the inbox before acting: what arrived meanwhile goes first
        action = action_from_dict(frame.agenda[0])
        failpoint("before_plan_recorded")
        if isinstance(action, ToolCall):
            await self.call_tool(action)
        else:
            await self.carry_out(action)

    async def plan(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The agent's next action, as the agenda records it, and the agent's new scratch."""
        scratch = copy.deepcopy(self.snap.frame.scratch)
        agent = self.agent_for(self.snap.frame)
        with self.harness.telemetry.span("tether.plan", **{"tether.agent": agent.name}):
            action = await self.cancellable(agent.plan(self.view(scratch)))
        if isinstance(action, Replan):
            raise InvalidInput(f"agent {agent.name!r}: plan() returned Replan, which only"
                               " on_event may return")
        return self.recorded(action, agent), scratch

    @staticmethod
    def recorded(action: Action, agent: Agent) -> dict[str, Any]:
        """The action as the agenda keeps it, with the code that planned it (E8)."""
        return {**action_to_dict(action), "planned_by": f"{agent.name}@{agent.version}"}

    def planned_by(self) -> dict[str, Any]:
        """Which code planned the action at the head of the agenda, for its dialog row."""
        agenda = self.snap.frame.agenda
        by = agenda[0].get("planned_by") if agenda else None
        return {"planned_by": by} if by else {}

    async def sleep_until(self, due: float) -> None:
        """Sleep until *due* or until an event arrives, whichever is first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout=max(0.0, due - time.time()))

    # ------------------------------------------------------------------ preemption

    async def cancellable(self, work: Awaitable[T]) -> T:
        """Run *work* so that a P0 event can cancel it at once (E1)."""
        future: asyncio.Future[T] = asyncio.ensure_future(work)
        self._cancellable = future
        try:
            return await future
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self._preempting and (current is None or not current.cancelling()):
                raise Preempted from None
            raise
        except CutOff as cut:
            if not self._preempting:
                raise
            self.append_history({"role": "assistant", "content": cut.partial, "cut_off": True})
            raise Preempted from None
        finally:
            self._cancellable = None
            self._preempting = False

    def stop(self) -> None:
        """Finish the step in flight, commit, and return (a graceful stop, E5).

        A plan (model call) or interruptible tool in flight is cancelled at once, as a P0
        would: it is redone by the next worker, and nothing about it is in doubt. A
        side-effecting call is always let finish.
        """
        self._stopping = True
        self.wake.set()
        self._cancel_cancellable()

    def safe_to_release(self) -> bool:
        """Whether this task can be handed over cleanly though its step was cut off: true
        unless a side-effecting call may be in flight (that one is left to crash recovery,
        which asks its reconcile hook)."""
        call = self.snap.call
        if call is None or call.status != "started":
            return True
        tool = self.harness.tools.get(call.tool)
        return tool is not None and not tool.side_effect

    def unseen(self, pending: list[StoredEvent]) -> list[StoredEvent]:
        """Pending events this runner has not applied yet (applied ones wait for a commit)."""
        return [e for e in pending if e.event.id not in self.applied]

    def notify(self, priority: int) -> None:
        """Called when an event for this task is stored; P0 cancels interruptible work."""
        self.wake.set()
        if priority == 0:
            self._cancel_cancellable()

    def _cancel_cancellable(self) -> None:
        if self._cancellable is not None and not self._cancellable.done():
            self._preempting = True
            self._cancellable.cancel()

    # ------------------------------------------------------------------ actions

    async def carry_out(self, action: Action) -> None:
        frame = self.snap.frame
        by = self.planned_by()
        frame.agenda.pop(0)
        frame.steps += 1
        self.snap.step += 1
        recovery.progress_made(self)
        if isinstance(action, Reply):
            self.append_history({"role": "assistant", "content": action.text, **by})
        elif isinstance(action, Spawn):
            self.agent_for(Frame(agent=action.agent))
            child_id = f"{frame.frame_id}.{frame.steps}"
            self.snap.stack.append(Frame(agent=action.agent, input=to_plain(action.input),
                                         frame_id=child_id))
            self.append_history({"role": "system", "event": "spawn", "agent": action.agent,
                                 "depth": len(self.snap.stack) - 1})
        elif isinstance(action, Wait):
            due = timers.due_time(action.timeout, f"timeout of a Wait for {action.event_type!r}")
            frame.wait = {"event_type": action.event_type, "due_at": due,
                          "timeout": action.timeout}
            if due is not None:  # the one id its timeout fires under (E6)
                frame.wait["timer"] = f"timer:{frame.frame_id}:{frame.steps}"
            self.set_status(Status.WAITING)
            await recovery.ask_check_wait(self)  # it may already have happened (R16)
        elif isinstance(action, Finish | Fail):
            self.pop_frame(action, by)
        self._unsaved_steps += 1
        if self._unsaved_steps >= self.settings.checkpoint_every_steps or \
                self.snap.status is not Status.RUNNING:
            await self.commit()

    def pop_frame(self, action: Finish | Fail, by: dict[str, Any]) -> None:
        done = self.snap.stack.pop()
        failed = isinstance(action, Fail)
        outcome = action.reason if isinstance(action, Fail) else to_plain(action.result)
        self.append_history({"role": "system", "event": "fail" if failed else "finish",
                             "agent": done.agent, "content": outcome, **by})
        if self.snap.stack:
            parent = self.snap.frame
            parent.child_result = None if failed else outcome
            parent.child_error = outcome if failed else None
            return
        self.snap.stack.append(done)
        if failed:
            self.snap.error = str(outcome)
            self.set_status(Status.FAILED)
        else:
            self.snap.result = outcome
            self.set_status(Status.COMPLETED)
        recovery.clean_up_resources(self)

    # ------------------------------------------------------------------ tool calls

    async def call_tool(self, action: ToolCall) -> None:
        """One attempt of a tool call, behind a resume point (R10)."""
        tool = self.harness.tools.get(action.name)
        if tool is None:
            await recovery.hand_to_person(
                self, f"tool {action.name!r} is no longer registered (code changed since the"
                " step was planned, E8)", strategy="needs_human")
            return
        call = self.snap.call
        if call is None and not degrade.allows(self, action.name):
            await self.commit()
            return
        if call is None:
            call = await self.open_call(action)
            if call is None:
                return
        call.attempt += 1
        call.status = "started"
        call.retry_at = None
        self.record_idempotency(call, "started")
        if call.attempt == 1:
            self.append_history({"role": "assistant", "tool_call": {
                "name": call.tool, "args": call.args, "key": call.key},
                "tool_version": tool.version, **self.planned_by()})
        await self.commit()
        failpoint("after_resume_point")
        started = time.monotonic()
        try:
            raw = await self.invoke(tool, call)
        except Preempted:
            call.status = "planned"
            call.attempt -= 1
            self.record_idempotency(call, "failed", error="interrupted by a P0 event")
            return
        except (ToolTimeout, OutcomeUnknown) as error:
            if tool.side_effect:
                await recovery.outcome_unknown(self, tool, call, error)
            else:
                await recovery.tool_failed(self, tool, call, error)
            return
        except Exception as error:  # a tool may fail in any way; all of it is recorded
            await recovery.tool_failed(self, tool, call, error)
            return
        failpoint("after_tool_before_commit")
        try:
            result = to_plain(raw, self.settings.max_result_bytes, f"result of tool {tool.name}")
        except InvalidInput as error:
            await recovery.unusable_result(self, tool, call, raw, error)
            return
        quick = time.monotonic() - started < self.settings.defer_results_under
        await self.finish_call(call, result, defer=tool.idempotent and quick)

    async def open_call(self, action: ToolCall) -> CallState | None:
        """Create the call's state, answering from the idempotency table when it already ran."""
        frame = self.snap.frame
        args = to_plain(dict(action.args))
        digest = args_hash(action.name, args)
        key = idempotency_key(self.snap.task_id, frame.frame_id, frame.steps, self.snap.key_salt)
        record = await self.store.get_idempotency(key)
        if record and (record.tool, record.args_hash) != (action.name, digest):
            self.log_recovery("idempotency_mismatch", detail=(
                f"key {key} was used by {record.tool} with other arguments; this is a different"
                " call, so it gets its own key and is not answered from the record (E3)"))
            key = f"{key}:{digest[:12]}"
            record = await self.store.get_idempotency(key)
        call = CallState(key=key, tool=action.name, args=args, args_hash=digest)
        self.snap.call = call
        if record and record.status == "succeeded":
            self.log_recovery("reuse_result", detail=f"{action.name} already succeeded under {key}")
            self.append_history({"role": "assistant", "tool_call": {
                "name": call.tool, "args": call.args, "key": call.key}})
            await self.finish_call(call, record.result, from_record=True)
            return None
        if record and record.status == "started":
            call.status = "started"
            call.attempt = record.attempts
            await recovery.resolve_in_doubt(self)
            return None
        return call

    async def invoke(self, tool: Tool, call: CallState) -> Any:
        ctx = ToolContext(self.snap.task_id, tool.name, call.key, call.attempt, self.claim.fence)
        work = self._with_timeout(tool, ctx, call.args)
        try:
            with self.harness.telemetry.span("tether.tool", **{
                    "tether.tool": tool.name, "tether.key": call.key, "tether.attempt": call.attempt}):
                return await (self.cancellable(work) if tool.interruptible else work)
        finally:
            self.snap.resources.extend(ctx.resources)  # also from failed attempts: cleaned up too

    @staticmethod
    async def _with_timeout(tool: Tool, ctx: ToolContext, args: dict[str, Any]) -> Any:
        try:
            if tool.timeout is None:  # most tools: no timer to arm on every call
                return await tool.fn(ctx, **args)
            async with asyncio.timeout(tool.timeout):
                return await tool.fn(ctx, **args)
        except TimeoutError:
            raise ToolTimeout(f"tool {tool.name} timed out after {tool.timeout}s") from None

    async def finish_call(self, call: CallState, result: Any, from_record: bool = False,
                          defer: bool = False) -> None:
        """Record a call's result and move on; with *defer*, ride along with the next commit.

        Deferring is only offered for a quick idempotent call: if the process
        dies first, the call runs again with the same key, which costs less than
        the fsync saved (see ``Settings.defer_results_under``).
        """
        frame = self.snap.frame
        if not from_record:
            self.record_idempotency(call, "succeeded", result=result)
        self.append_history({"role": "tool", "name": call.tool, "key": call.key,
                             "content": result})
        frame.last_tool_result = result
        frame.last_tool_error = None
        frame.agenda.pop(0)
        frame.steps += 1
        self.snap.step += 1
        self.snap.call = None
        recovery.progress_made(self)
        if not defer:
            await self.commit()

    def record_idempotency(self, call: CallState, status: str, result: Any = None,
                           error: str | None = None) -> None:
        self._idempotency.append(IdempotencyRecord(
            call.key, self.snap.task_id, call.tool, call.args_hash, status, result, error,
            call.attempt))

    # ------------------------------------------------------------------ state changes

    def mark_progress(self) -> None:
        """The next commit moves the task forward (the store's crash counter starts again)."""
        self._progress = True

    def put_first(self, action: Action, frame: Frame | None = None,
                  agent: Agent | None = None) -> None:
        """Run *action* before the frame's recorded work, keeping that work (the to-do list).

        A call that is open but not in flight (cancelled by a P0, or waiting
        out a retry) is parked inside its own agenda entry with its key and
        attempt count, and picked up again when that entry comes round.
        """
        frame = frame or self.snap.frame
        call = self.snap.call
        if call is not None and frame is self.snap.frame and frame.agenda:
            frame.agenda[0]["open_call"] = dataclasses.asdict(call)
            self.snap.call = None
        frame.agenda.insert(0, self.recorded(action, agent) if agent else action_to_dict(action))

    def set_status(self, status: Status) -> None:
        check_transition(self.snap.task_id, self.snap.status, status)
        self.snap.status = status

    def append_history(self, entry: dict[str, Any]) -> None:
        entry.setdefault("at", time.time())
        self.snap.history_len += 1
        epoch = self.snap.history_segments[-1][0]
        self._rows.append(HistoryRow(epoch, self.snap.history_len, to_plain(entry)))
        self.history.append(entry)

    def log_recovery(self, strategy: str, event_id: int | None = None, detail: str = "") -> None:
        record = recovery.log_record(self, strategy, event_id, detail)
        self._log.append(record)
        self.harness.counters[f"recovery:{strategy}"] += 1
        self.harness.telemetry.recovery(record)

    def forget_uncommitted(self) -> None:
        """A rollback replaced the state: events applied since the last commit go back to the
        inbox (they are still pending in the store) and their dialog rows are dropped. Records
        of what tools did are kept: the outside world does not roll back."""
        requeue = {e for e, _ in self._events_done} - self.applied_levers
        self.applied -= requeue
        self._events_done = [(e, d) for e, d in self._events_done if e not in requeue]
        self._rows = []

    def done_event(self, event_id: int, disposition: str) -> None:
        self.applied.add(event_id)
        self._events_done.append((event_id, disposition))

    @property
    def dirty(self) -> bool:
        return bool(self._rows or self._events_done or self._idempotency or self._log
                    or self._unsaved_steps)

    async def flush(self) -> None:
        """Commit what is buffered. A parked task whose head did not change only gets its wake
        time back (the claim took it), without a new version crowding out rollback points."""
        if self.dirty:
            await self.commit()
        elif self.snap.status is not Status.RUNNING and not self._committed:
            snap = self.snap
            reason = snap.error if snap.status in (Status.NEEDS_HUMAN, Status.FAILED) else None
            await self.store.set_status(self.claim, snap.status, reason, self._wake_at())

    async def commit(self) -> None:
        """Write the head and everything buffered since the last commit, atomically."""
        snap = self.snap
        reason = snap.error if snap.status in (Status.NEEDS_HUMAN, Status.FAILED) else None
        head, large = blobs.layered(snap.dumps(), self.settings.blob_threshold)
        checkpoint = Checkpoint(
            head=head, blobs=large, status=snap.status, history=self._rows,
            events_done=self._events_done, idempotency=self._idempotency,
            recovery_log=self._log, wake_at=self._wake_at(), reason=reason,
            progress=self._progress)
        try:
            self.version = await self.store.commit(
                self.claim, checkpoint, self.settings.keep_versions,
                time.time() + self.settings.lease_seconds)
        except LeaseLost:
            self.harness.log.warning("task %s: lease lost, stopping", snap.task_id)
            raise
        failpoint("after_checkpoint")
        self._rows, self._events_done, self._idempotency, self._log = [], [], [], []
        self._unsaved_steps = 0
        self._committed = True
        self._progress = False
        recovery.emit_log_records(checkpoint.recovery_log, self.version)

    def _wake_at(self) -> float | None:
        return timers.wake_time(self.snap)

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
import time
from collections import Counter
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from tether import blobs, dialog
from tether.agent import Agent, TaskView
from tether.engine import budget, calls, degrade, limits, recovery, timers
from tether.engine.admission import Admission, HeldBack
from tether.engine.answers import planned_actions
from tether.engine.dialog_rows import DialogRows
from tether.engine.events import apply_event
from tether.engine.host import RunnerHost
from tether.engine.loading import newest_readable
from tether.engine.preemption import Preempted, Preemptible
from tether.engine.records import KnownRecords
from tether.engine.task import hand_to_person, pop_frame, put_first, recorded
from tether.engine.uncommitted import CallStart, Uncommitted
from tether.errors import (
    InboxMoved,
    InvalidInput,
    LeaseLost,
    OutcomeUnknown,
    RateLimited,
    ResultUnusable,
    ToolTimeout,
    UnknownAgent,
)
from tether.failpoints import failpoint
from tether.model import (
    Action,
    AgendaEntry,
    CallState,
    CallStatus,
    Continue,
    Event,
    EventStatus,
    Fail,
    Finish,
    Frame,
    IdempotencyRecord,
    OutcomeStatus,
    Priority,
    Reply,
    Snapshot,
    Spawn,
    Status,
    ToolCall,
    Wait,
    action_to_dict,
    check_transition,
    new_id,
    storable_text,
    to_plain,
)
from tether.protocol import CONTROL_EVENTS
from tether.resources import ResourceKinds
from tether.settings import Settings
from tether.store import Claim, HistoryRow, StoredEvent
from tether.strategies import Strategy
from tether.tools import Tool, ToolContext

T = TypeVar("T")


class Runner:
    """Runs one claimed task until it parks, finishes or loses its lease.

    It is the :class:`~tether.engine.task.RunningTask` the engine's helpers work on, and the
    only place that commits: after the restart, after each event applied and after each
    step, whenever something asked for it (:meth:`request_commit`), and at the resume point
    before each tool call.
    """

    def __init__(self, host: RunnerHost, claim: Claim, snap: Snapshot, version: int,
                 history: DialogRows) -> None:
        self.host = host
        self.store = host.store
        self.reads = KnownRecords(self.store, claim.task_id)
        self.settings: Settings = host.settings
        self.tools: Mapping[str, Tool] = host.tools
        self.resource_kinds: ResourceKinds = host.resource_kinds
        self.counters: Counter[str] = host.counters
        self.claim = claim
        self.snap = snap
        self.version = version
        self.history = history
        self.wake = asyncio.Event()
        self.applied: set[int] = set()
        self.applied_levers: set[int] = set()
        self.fired: set[str] = set()
        self._stopping = False
        self.preemptible = Preemptible()
        self.admission = Admission(self.store, host.limits, host.slot_freed)
        self.urgency = int(Priority.P2)
        """The most urgent event applied while this runner held the task: a call it then
        makes goes before less urgent ones held back by the same limit."""
        self.pending = Uncommitted()
        self._committed = False
        self._commit_asked = False
        self._inbox_seen: frozenset[int] | None = None
        """The pending events' ids at the last read of the inbox (None: not read yet)."""
        self._inbox_at_commit: list[StoredEvent] | None = None
        """The pending events as the last commit read them right after writing (in its round
        trip): the next tick's read, unless something was stored for the task since."""
        self._planned = False
        """The last step planned (and did nothing else): the next may start a call."""

    def _read_at_resume_point(self) -> bool:
        """Whether this tick leaves the inbox to the next call's resume point: right after a
        plan whose first action is a tool call, with nothing stored by this process since."""
        planned, self._planned = self._planned, False
        frame = self.snap.frame
        return (planned and self._inbox_seen is not None and not self.wake.is_set()
                and self.snap.call is None and bool(frame.agenda)
                and frame.agenda[0].kind == "tool_call")

    # ------------------------------------------------------------------ loading

    @classmethod
    async def load(cls, host: RunnerHost, claim: Claim) -> Runner:
        """Load the newest readable snapshot, falling back past corrupt versions."""
        store = host.store
        version, snap, skipped, history = await newest_readable(store, claim.task_id,
                                                                with_dialog=True)
        if skipped:
            await recovery.branch_history(store, snap)
        runner = cls(host, claim, snap, version, history)
        for reason in skipped:
            runner.log_recovery(Strategy.FALLBACK_VERSION, detail=reason)
        return runner

    @property
    def worker_degraded(self) -> dict[str, Any] | None:
        return self.host.degraded

    async def view(self, scratch: dict[str, Any] | None = None,
                   frame: Frame | None = None) -> TaskView:
        frame = frame or self.snap.frame
        scratch = copy.deepcopy(frame.scratch) if scratch is None else scratch
        return TaskView(self.snap, await self.history.rows(), scratch, frame)

    def agent_for(self, frame: Frame) -> Agent:
        try:
            return self.host.agents[frame.agent]
        except KeyError:
            raise UnknownAgent(
                f"agent {frame.agent!r} named by task {self.snap.task_id} is not registered"
            ) from None

    # ------------------------------------------------------------------ main loop

    async def run(self) -> Status:
        """Tick until the task parks (waiting, paused, needs_human) or ends."""
        await self.restore()
        try:
            return await self._run()
        finally:
            await self.admission.let_task_go(self.snap)

    async def _run(self) -> Status:
        root = self.host.agents.get(self.snap.agent)
        with timers.deadline_alarm(self.snap.deadline_at, self.notify):
            while not self._stopping:
                self.preemptible.looked()
                await timers.fire_due(self)
                await self.tick()
                if self.snap.status is not Status.RUNNING:
                    break
                if self.admission.held_back is not None or not await self.admission.hold_task(
                        self.snap, self.claim.fence, root.task_limits if root else (),
                        self.urgency):
                    await self.flush()  # what it planned is kept while it waits
                    if await self.admission.wait_here(self.wake, self.settings.slot_wait):
                        continue
                    return await self.park(*self.admission.parked())
                due = self._retry_due()
                if due is not None and due - time.time() >= self.settings.lease_seconds:
                    return await self.park(due)
                if due is not None and due > time.time():
                    await self.sleep_until(due)
                    continue
                await self.step()
                if self.snap.status.is_terminal and not self.dirty:
                    break  # it ended, committed: a lever sent meanwhile stays pending and due
        if self._stopping and self.snap.status is Status.RUNNING:
            self.log_recovery(Strategy.RELEASED, detail="the worker is shutting down; the task was"
                              " released cleanly at a step boundary (no recovery counted)")
        await self.flush()
        return self.snap.status

    async def restore(self) -> None:
        """Start a pending task (visible as running at once, R2) or recover a crashed one."""
        if self.snap.status is Status.PENDING:
            self.set_status(Status.RUNNING)
            if not self.claim.started:  # a claim that started it wrote this already
                await self.store.set_status(self.claim, Status.RUNNING, None)
        await recovery.restore(self)
        await self._commit_if_asked()

    async def apply_levers(self) -> Status:
        """Apply what is in the inbox without running a step (a lever on a task no worker
        holds is applied at once by whoever pulled it)."""
        await self.restore()
        await self.tick()
        await self.flush()
        return self.snap.status

    async def hand_over(self, reason: str, traceback: str | None = None) -> None:
        """Park the task for a person right away (it failed in a way no recovery covers)."""
        hand_to_person(self, reason, traceback=traceback)
        await self._commit_if_asked()

    async def park(self, due: float, reason: str | None = None) -> Status:
        """A long back-off, or a limit holding the task back: commit, and leave the due time
        to whichever worker is alive then (E6), instead of holding the lease and memory while
        nothing can happen."""
        await self.flush()
        await self.store.set_status(self.claim, Status.RUNNING, reason, wake_at=due)
        return self.snap.status

    def _retry_due(self) -> float | None:
        call = self.snap.call
        if call is not None and call.retry_at:
            return call.retry_at
        return self.snap.recovery.retry_at

    async def tick(self) -> None:
        """Drain the inbox: apply pending events, most urgent first (R5). Right after a plan
        whose next action is a tool call, the inbox is not read here: the call's resume point
        is written only if nothing arrived unread since the last read (``inbox_seen``), so a
        message sent while the model answered still reaches the task before the call starts,
        and a quick step costs one read of the inbox instead of two."""
        degrade.follow_worker(self)
        if self._read_at_resume_point():
            return
        pending, self._inbox_at_commit = self._inbox_at_commit, None
        if pending is None or self.wake.is_set():
            self.wake.clear()
            pending = await self.store.pending_events(self.snap.task_id)
        self._inbox_seen = frozenset(e.event.id for e in pending if e.event.id is not None)
        for stored in pending:
            if stored.event.id not in self.applied:
                with self.host.telemetry.span("tether.event", **{
                        "tether.event_id": stored.event.id, "tether.event_type": stored.event.type,
                        "tether.priority": stored.priority}):
                    await self._apply(stored)
                await self._commit_if_asked()

    async def _apply(self, stored: StoredEvent) -> None:
        event_id = stored.event.id
        assert event_id is not None
        disposition = await apply_event(self, stored)
        if disposition is None:  # it stays pending, for a later tick
            return
        self.urgency = min(self.urgency, stored.priority)
        if stored.event.type in CONTROL_EVENTS:
            self.applied_levers.add(event_id)  # a later rollback in this tick keeps it applied
        self.done_event(event_id, disposition)

    async def step(self) -> None:
        """Carry out the frame's next recorded action, planning one first if there is none."""
        with self.host.telemetry.span("tether.step", **{"tether.step": self.snap.step}):
            await self._step()
        if not self._plan_rides_with_call():
            await self._commit_if_asked()

    def _plan_rides_with_call(self) -> bool:
        """Whether the plan just made is left for its first call's resume point to commit.

        A model answer whose first action is a call that can start at once is written in
        one commit with that call's resume point, so a tool call costs one commit, and the
        answer is still in the store before anything of it runs. A call that may wait first
        (a limit's slot) gets the answer committed on its own: a kill while it waits must
        not cost the completion. If the resume point is refused (a message arrived), the
        answer is committed with the events the loop then applies. Any other answer (a
        final one too) is committed at once: riding with the task's end would save a commit
        per task, but a kill between the two would cost a completion a real model bills."""
        frame = self.snap.frame
        if not (self._planned and self._commit_asked and self._inbox_seen is not None
                and self.snap.call is None and frame.agenda
                and frame.agenda[0].kind == "tool_call"):
            return False
        tool = self.tools.get(str(frame.agenda[0].action["name"]))
        return tool is not None and not tool.limits

    async def _step(self) -> None:
        frame = self.snap.frame
        if self.snap.call is None and frame.agenda and frame.agenda[0].open_call is not None:
            self.snap.call, frame.agenda[0].open_call = frame.agenda[0].open_call, None
        if self.snap.call is not None:
            pending = frame.agenda[0].to_action()
            assert isinstance(pending, ToolCall), "an open call must head its frame's agenda"
            await self.call_tool(pending)
            return
        if not frame.agenda and frame.wait:
            self.set_status(Status.WAITING)  # an interjection ran; the armed wait resumes
            self.request_commit()
            return
        if not frame.agenda:
            if recovery.over_step_limit(self) or limits.over_completion_limit(self):
                return
            await self.history.rows()  # read here: a store error is not a failed plan
            try:
                planned, scratch = await self.plan()
            except (Preempted, HeldBack):
                return
            except Exception as error:  # a model call may fail in any way: bounded recovery
                recovery.plan_failed(self, error)
                return
            self.snap.recovery.retry_at = None
            frame.scratch = scratch
            frame.agenda.extend(planned)
            if self.agent_for(frame).commit_plans:
                self.request_commit()  # the plan was paid for: never ask for it again
            self._planned = True
            return  # the loop drains the inbox before acting: what arrived meanwhile goes first
        action = await self._prepared(frame)
        if action is None:
            return
        failpoint("before_plan_recorded")
        if isinstance(action, ToolCall):
            await self.call_tool(action)
        else:
            await self.carry_out(action)

    async def plan(self) -> tuple[list[AgendaEntry], dict[str, Any]]:
        """The agent's next actions (one answer), as the agenda records them, and the agent's
        new scratch."""
        scratch = copy.deepcopy(self.snap.frame.scratch)
        agent = self.agent_for(self.snap.frame)
        view = await self.view(scratch)
        try:
            async with self.admission.plan_slot(self.snap, self.claim.fence, agent.limits,
                                                self.urgency, lambda: limits.tokens_of(view)):
                with self.host.telemetry.span("tether.plan", **{"tether.agent": agent.name}):
                    answer = await self.cancellable(agent.plan(view))
        finally:
            limits.record_completions(self, view)  # paid for, whatever the plan did next
        return [recorded(action, agent) for action in planned_actions(agent.name, answer)], scratch

    async def _prepared(self, frame: Frame) -> Action | None:
        """The agenda's next action as it runs now: an agent may adjust an action of an
        earlier answer with what happened since (:meth:`tether.Agent.prepare`); the adjusted
        action is recorded in its place before it runs. None: the agent failed (a bounded
        recovery, as for a plan that failed)."""
        entry = frame.agenda[0]
        action = entry.to_action()
        agent = self.agent_for(frame)
        if type(agent).prepare is Agent.prepare:
            return action
        view = await self.view(frame=frame)  # a store error here is not the agent's failure
        try:
            prepared = await agent.prepare(view, action)
        except Exception as error:  # agent code may raise anything
            recovery.plan_failed(self, error)
            return None
        if not isinstance(prepared, type(action)):
            recovery.plan_failed(self, InvalidInput(
                f"agent {agent.name!r}: prepare() must return a {type(action).__name__},"
                f" not {type(prepared).__name__}"))
            return None
        entry.action = action_to_dict(prepared)
        return prepared

    def planned_by(self) -> dict[str, Any]:
        """Which code planned the action at the head of the agenda, for its dialog row."""
        agenda = self.snap.frame.agenda
        by = agenda[0].planned_by if agenda else None
        return {"planned_by": by} if by else {}

    async def sleep_until(self, due: float) -> None:
        """Sleep until *due* or until an event arrives, whichever is first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout=max(0.0, due - time.time()))

    # ------------------------------------------------------------------ preemption

    def cancellable(self, work: Awaitable[T]) -> Awaitable[T]:
        """Run *work* so that a P0 event can cancel it at once (E1)."""
        return self.preemptible.run(work, self._keep_cut_off)

    def _keep_cut_off(self, partial: str) -> None:
        self.append_history(dialog.reply(partial, cut_off=True))

    def stop(self) -> None:
        """Finish the step in flight, commit, and return (a graceful stop, E5).

        A plan (model call) or interruptible tool in flight is cancelled at once, as a P0
        would: it is redone by the next worker, and nothing about it is in doubt. A
        side-effecting call is always let finish.
        """
        self._stopping = True
        self.wake.set()
        self.preemptible.cut()

    def safe_to_release(self) -> bool:
        """Whether this task can be handed over cleanly though its step was cut off: true
        unless a side-effecting call may be in flight (that one is left to crash recovery,
        which asks its reconcile hook)."""
        call = self.snap.call
        if call is None or call.status != CallStatus.STARTED:
            return True
        tool = self.tools.get(call.tool)
        return tool is not None and not tool.side_effect

    def unseen(self, pending: list[StoredEvent]) -> list[StoredEvent]:
        """Pending events this runner has not applied yet (applied ones wait for a commit)."""
        return [e for e in pending if e.event.id not in self.applied]

    def notify(self, priority: int) -> None:
        """Called when an event for this task is stored; P0 cancels interruptible work."""
        self.wake.set()
        if priority == 0:
            self.preemptible.cut()

    # ------------------------------------------------------------------ actions

    async def carry_out(self, action: Action) -> None:
        frame = self.snap.frame
        by = self.planned_by()
        frame.agenda.pop(0)
        frame.steps += 1
        self.snap.step += 1
        budget.progress_made(self)
        if isinstance(action, Reply):
            self.append_history(dialog.reply(action.text, **by))
        elif isinstance(action, Spawn):
            self.agent_for(Frame(agent=action.agent))
            child_id = f"{frame.frame_id}.{frame.steps}"
            self.snap.stack.append(Frame(agent=action.agent, input=to_plain(action.input),
                                         frame_id=child_id))
            self.append_history(dialog.system("spawn", agent=action.agent,
                                              depth=len(self.snap.stack) - 1))
        elif isinstance(action, Wait):
            due = timers.due_time(action.timeout, f"timeout of a Wait for {action.event_type!r}")
            frame.wait = {"event_type": action.event_type, "due_at": due,
                          "timeout": action.timeout, "id": new_id()}  # what answers name
            if due is not None:  # the one id its timeout fires under (E6)
                frame.wait["timer"] = f"timer:{frame.frame_id}:{frame.steps}"
            self.set_status(Status.WAITING)
            await recovery.ask_check_wait(self)  # it may already have happened (R16)
        elif isinstance(action, Finish | Fail):
            self.pop_frame(action, by)
        elif isinstance(action, Continue):
            if action.note:
                self.append_history(dialog.system("continue", note=action.note, **by))
            return  # committed with the plan that returned it; the next plan's commit keeps this
        self.pending.steps += 1
        if self.pending.steps >= self.settings.checkpoint_every_steps or \
                self.snap.status is not Status.RUNNING:
            self.request_commit()

    def pop_frame(self, action: Finish | Fail, by: dict[str, Any]) -> None:
        pop_frame(self, action, by)

    # ------------------------------------------------------------------ tool calls

    async def call_tool(self, action: ToolCall) -> None:
        """One attempt of a tool call, behind a resume point (R10)."""
        tool = self.tools.get(action.name)
        if tool is None:
            hand_to_person(self, f"tool {action.name!r} is no longer registered (code changed"
                           " since the step was planned)")
            return
        call = self.snap.call
        before = CallStart.before(self.snap, self.pending, self.history)
        if call is None and not degrade.allows(self, action.name):
            self.request_commit()
            return
        if call is None:
            call = await calls.open_call(self, action)
            if call is None or (tool.side_effect and await limits.repeated_side_effect(self, call)):
                return
        elif call.status == CallStatus.STARTED:  # it may have run: settled, never started again
            await calls.resolve_in_doubt(self)
            self.request_commit()
            return
        if tool.limits and not await self.admission.admit(self.snap, self.claim.fence,
                                                          tool.limits, call.key, self.urgency):
            return
        call.attempt += 1
        call.status = CallStatus.STARTED
        call.retry_at = None
        self.record_idempotency(call, OutcomeStatus.STARTED)
        if call.attempt == 1:
            self.append_history(dialog.call(call.tool, call.args, call.key,
                                            tool_version=tool.version, **self.planned_by()))
        try:  # the resume point: a crash from here on leaves the call in doubt
            await self.commit(inbox_seen=self._inbox_seen)
        except InboxMoved:  # written only if nothing arrived unread: nothing was, nothing ran
            before.undo(self.snap, self.pending, self.history)
            return  # the loop reads the inbox, and the next step decides again
        failpoint("after_resume_point")
        started = time.monotonic()
        try:
            raw = await self.invoke(tool, call)
        except (Preempted, RateLimited) as cut:
            call.status = CallStatus.PLANNED
            call.attempt -= 1
            self.record_idempotency(call, OutcomeStatus.FAILED, error=str(cut) or "interrupted"
                                    " by a P0 event")
            if isinstance(cut, RateLimited):
                call.retry_at = await self.admission.block(self.snap, tool.limits,
                                                           cut.retry_after)
            return
        except ResultUnusable as error:  # it ran: recorded as done, never run again
            await calls.unusable_result(self, tool, call, error.value, error)
            return
        except (ToolTimeout, OutcomeUnknown) as error:
            if tool.side_effect:
                await calls.outcome_unknown(self, tool, call, error)
            else:
                await calls.tool_failed(self, tool, call, error)
            return
        except Exception as error:  # a tool may fail in any way; all of it is recorded
            await calls.tool_failed(self, tool, call, error)
            return
        failpoint("after_tool_before_commit")
        try:
            result = to_plain(raw, self.settings.max_result_bytes, f"result of tool {tool.name}")
        except InvalidInput as error:
            await calls.unusable_result(self, tool, call, raw, error)
            return
        quick = time.monotonic() - started < self.settings.defer_results_under
        self.finish_call(call, result, defer=tool.idempotent and quick)

    async def invoke(self, tool: Tool, call: CallState) -> Any:
        ctx = ToolContext(self.snap.task_id, tool.name, call.key, call.attempt, self.claim.fence,
                          admitted_at=self.admission.admitted_at if tool.limits else None)
        work = tool.run(ctx, call.args)
        try:
            with self.host.telemetry.span("tether.tool", **{
                    "tether.tool": tool.name, "tether.key": call.key, "tether.attempt": call.attempt}):
                return await (self.cancellable(work) if tool.interruptible else work)
        finally:
            self.snap.resources.extend(ctx.resources)  # also from failed attempts: cleaned up too
            if tool.limits:
                await self.admission.release(self.snap, tool.limits, call.key, ctx.tokens)

    def finish_call(self, call: CallState, result: Any, from_record: bool = False,
                    defer: bool = False) -> None:
        calls.finish_call(self, call, result, from_record, defer)

    def record_idempotency(self, call: CallState, status: OutcomeStatus, result: Any = None,
                           error: str | None = None) -> None:
        self.reads.recorded(call.key)
        self.pending.idempotency.append(IdempotencyRecord(
            call.key, self.snap.task_id, call.tool, call.args_hash, status, result,
            storable_text(error), call.attempt))

    # ------------------------------------------------------------------ state changes

    def mark_progress(self) -> None:
        """The next commit moves the task forward (the store's crash counter starts again)."""
        self.pending.progress = True

    def put_first(self, action: Action, frame: Frame | None = None,
                  agent: Agent | None = None) -> None:
        put_first(self, action, frame, agent)

    def set_status(self, status: Status) -> None:
        check_transition(self.snap.task_id, self.snap.status, status)
        self.snap.status = status

    def supersedes(self, event_type: str) -> bool:
        return self.host.inbox.protocol.supersedes(event_type)

    def append_history(self, entry: dict[str, Any]) -> None:
        entry.setdefault("at", time.time())
        self.snap.history_len += 1
        epoch = self.snap.history_segments[-1][0]
        self.pending.rows.append(HistoryRow(epoch, self.snap.history_len, to_plain(entry)))
        self.history.append(entry)

    def log_recovery(self, strategy: Strategy, event_id: int | None = None,
                     detail: str = "", traceback: str | None = None) -> None:
        record = recovery.log_record(self, strategy, event_id, detail, traceback)
        self.pending.log.append(record)
        self.counters[f"recovery:{strategy}"] += 1
        self.host.telemetry.recovery(record)

    def forget_uncommitted(self) -> None:
        """A rollback replaced the state: events applied since the last commit go back to the
        inbox (they are still pending in the store) and their dialog rows are dropped. Records
        of what tools did are kept: the outside world does not roll back."""
        requeue = {e for e, _ in self.pending.events_done} - self.applied_levers
        self.applied -= requeue
        self.pending.events_done = [(e, d) for e, d in self.pending.events_done
                                    if e not in requeue]
        self.pending.rows = []

    def replace_state(self, snap: Snapshot, history: list[dict[str, Any]]) -> None:
        self.forget_uncommitted()
        self.snap = snap
        self.history.replace(history)

    def captured_head(self, event_id: int, version: int) -> bytes | None:
        return self.host.captured_head(event_id, version)

    async def fire(self, event: Event) -> None:
        """Store a timer's event once per run (its ``source_event_id`` dedups across runs)."""
        assert event.source_event_id is not None
        if event.source_event_id in self.fired:
            return
        receipt, _ = await self.host.inbox.emit(event)
        self._inbox_at_commit = None  # stored without a notification: the next tick reads
        self.fired.add(event.source_event_id)
        if receipt.outcome == "duplicate":
            self.host.log.info("task %s: %s had already fired (event %d)", event.task_id,
                               event.source_event_id, receipt.event_id)

    def request_commit(self) -> None:
        self._commit_asked = True

    async def _commit_if_asked(self) -> None:
        """The one place a commit asked for by a step, an event or a restart is made."""
        if self._commit_asked:
            await self.commit()

    def done_event(self, event_id: int, disposition: EventStatus) -> None:
        self.applied.add(event_id)
        self.pending.events_done.append((event_id, disposition))

    @property
    def dirty(self) -> bool:
        return bool(self.pending)

    async def flush(self) -> None:
        """Commit what is buffered or was asked for (a paid plan whose call parked first). A
        parked task whose head did not change only gets its wake time back (the claim took
        it), without a new version crowding out rollback points."""
        if self.dirty or self._commit_asked:
            await self.commit()
        elif self.snap.status is not Status.RUNNING and not self._committed:
            snap = self.snap
            reason = storable_text(snap.error) if snap.status in (Status.NEEDS_HUMAN, Status.FAILED) \
            else None
            await self.store.set_status(self.claim, snap.status, reason, self._wake_at())

    async def commit(self, inbox_seen: frozenset[int] | None = None) -> None:
        """Write the head and everything buffered since the last commit, atomically; with
        *inbox_seen*, only if no pending event is outside it (else InboxMoved, nothing
        written)."""
        snap = self.snap
        reason = storable_text(snap.error) if snap.status in (Status.NEEDS_HUMAN, Status.FAILED) \
            else None
        head, large = blobs.layered(snap.dumps(), self.settings.blob_threshold)
        checkpoint = self.pending.checkpoint(head, large, snap.status, self._wake_at(), reason,
                                             inbox_seen)
        try:
            self.version, self._inbox_at_commit = await self.store.commit_reading(
                self.claim, checkpoint, self.settings.keep_versions,
                time.time() + self.settings.lease_seconds)
        except LeaseLost:
            self.host.log.warning("task %s: lease lost, stopping", snap.task_id)
            raise
        failpoint("after_checkpoint")
        self.pending = Uncommitted()
        self._committed = True
        self._commit_asked = False
        recovery.emit_log_records(checkpoint.recovery_log, self.version)

    def _wake_at(self) -> float | None:
        return timers.wake_time(self.snap)


"""The harness: the control shell around agents (R17).

It registers agents and tools, accepts tasks and events, runs workers, and
gives people the levers: resume, roll back, cancel, export. It never decides
what a task should do next; agents propose and the runner applies.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

from tether import blobs, schedules
from tether.agent import Agent
from tether.bundle import dumps_bundle, export_bundle
from tether.engine.calls import (
    DECISIONS,
    Decision,
    awaiting_decision,
    code_differs,
    etag,
    in_doubt_message,
    observation,
    settled_by_record,
)
from tether.engine.forking import ForkPlan
from tether.engine.forking import fork as fork_task
from tether.engine.holders import new_worker_id
from tether.engine.housekeeping import Swept, sweep
from tether.engine.inbox import Inbox
from tether.engine.limits import held_repeat
from tether.engine.loading import newest_readable
from tether.engine.runner import Runner
from tether.engine.timers import Moment, due_time
from tether.engine.worker import Worker, run_claimed
from tether.errors import (
    CallInFlight,
    ConfigurationError,
    IllegalTransition,
    InDoubtCall,
    InvalidInput,
    ReservedEventType,
    ScheduleNotFound,
    StaleDecision,
    TaskNotFound,
    TetherError,
    UnknownAgent,
)
from tether.lifespans import Lifespans
from tether.model import (
    CallStatus,
    EmitReceipt,
    Event,
    Frame,
    Priority,
    Snapshot,
    Status,
    TaskRecord,
    check_count,
    check_task_id,
    new_id,
)
from tether.model import to_plain as _to_plain
from tether.protocol import RESERVED_EVENTS, InterruptionProtocol, Rule
from tether.reading import TaskReader
from tether.resources import ResourceKind, ResourceKinds
from tether.settings import Settings
from tether.store import ScheduleRecord, Store, open_store
from tether.telemetry import Telemetry
from tether.throttling import Limit, make_limit
from tether.tools import RetryPolicy, Tool, ToolFn

KEEP_INPUT: Any = object()
"""The default of :meth:`Harness.resume`'s *input*: the task keeps the input it has."""
CAPTURED_HEADS = 64
"""Rollback targets this process keeps in memory for its own workers (oldest dropped first)."""
Notifier = Callable[[dict[str, Any]], Awaitable[None] | None]
A = TypeVar("A", bound=Agent)
L = TypeVar("L", bound=Callable[..., Any])


@dataclass(frozen=True)
class TaskInfo:
    """A task as a person sees it: index row plus the newest snapshot."""

    record: TaskRecord
    version: int
    snapshot: Snapshot
    damaged: tuple[str, ...] = ()
    """Newer versions that could not be read (shown instead: the newest readable one)."""
    etag: str = dataclasses.field(init=False)
    """A token of this view, taken when it was read: pass it to :meth:`Harness.decide` to
    have the decision refused if the task is no longer as shown (see
    :func:`tether.engine.calls.etag`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "etag", etag(self.record, self.version, self.snapshot))


class Harness:
    """Owns the store, the registries and the levers. One per application."""

    def __init__(
        self,
        store: str | Store | None = None,
        *,
        settings: Settings | None = None,
        protocol: InterruptionProtocol | dict[str, Rule | Priority | int] | None = None,
        notifier: Notifier | None = None,
        bundle_dir: str | Path | None = None,
        worker_id: str | None = None,
        cache: str | None = None,
        tracer_provider: Any = None,
    ) -> None:
        self.settings = settings or Settings()
        self._cache_arg = cache if cache is not None else os.environ.get("TETHER_CACHE")
        self.protocol = protocol if isinstance(protocol, InterruptionProtocol) \
            else InterruptionProtocol(protocol)
        self._store_arg = store
        self._store: Store | None = None
        self.notifier = notifier
        self.bundle_dir = Path(bundle_dir) if bundle_dir else None
        self._given_worker_id = worker_id
        self._made_worker_id = (os.getpid(), new_worker_id())
        self.agents: dict[str, Agent] = {}
        self.tools: dict[str, Tool] = {}
        self.limits: dict[str, Limit] = {}
        self.resource_kinds = ResourceKinds()
        self.runners: dict[str, Runner] = {}
        self.telemetry = Telemetry(tracer_provider)
        """Traces, if an OpenTelemetry tracer provider was given (never the global one)."""
        self.work_arrived = asyncio.Event()
        """Set when this process stores a task or an event, so its own idle worker looks at
        once instead of at the next poll (other processes learn it from the store)."""
        self.counters: Counter[str] = Counter()
        """What this process did (steps, recoveries by strategy, events by outcome): the
        counters behind ``/metrics``."""
        self.degraded: dict[str, Any] | None = None
        """Worker-wide degradation: every task this harness runs follows its fallback (R3)."""
        self.log = logging.getLogger("tether")
        self._captured: dict[int, tuple[int, bytes]] = {}
        self._lifespans = Lifespans(self, self.log)

    @property
    def store(self) -> Store:
        """The store, opened on first use (so a module-level harness costs nothing to import)."""
        if self._store is None:
            arg = self._store_arg
            self._store = arg if arg is not None and not isinstance(arg, str) \
                else open_store(arg, self.settings, cache=self._cache_arg)
        return self._store

    @property
    def store_url(self) -> str | None:
        """The URL the store was named by (None when a store object was passed in)."""
        arg = self._store_arg
        return arg if isinstance(arg, str) or arg is None else None

    def use_store(self, store: str | Store) -> None:
        """Point this harness at another store (the CLI's ``--store``) before it opens one."""
        if self._store is not None:
            raise ConfigurationError("the harness has already opened its store; choose the store"
                                     " before the first task, event or read")
        self._store_arg = store

    @property
    def reads(self) -> TaskReader:
        """Read-only access for people (listings, versions, events, logs): what the API, the
        console and the CLI use instead of the raw store."""
        return TaskReader(self.store)

    @property
    def inbox(self) -> Inbox:
        return Inbox(self.store, self.protocol, self.settings, self.counters)

    # ------------------------------------------------------------------ registration

    @overload
    def tool(self, fn: ToolFn, /) -> Tool: ...
    @overload
    def tool(self, *, name: str | None = None, side_effect: bool = False,
             idempotent: bool = False, timeout: float | None = None,
             retry: RetryPolicy | None = None, interruptible: bool = False,
             version: str = "1", limits: Sequence[str] = (),
             repeatable: bool = False) -> Callable[[ToolFn], Tool]: ...
    def tool(self, fn: ToolFn | None = None, /, *, name: str | None = None,  # type: ignore[misc]
             side_effect: bool = False, idempotent: bool = False, timeout: float | None = None,
             retry: RetryPolicy | None = None, interruptible: bool = False,
             version: str = "1", limits: Sequence[str] = (),
             repeatable: bool = False) -> Tool | Callable[[ToolFn], Tool]:
        """Register a tool ``fn(ctx, **args)``, an ``async def`` or a plain ``def`` (run in a
        thread); see :class:`tether.tools.Tool`."""

        def register(fn: ToolFn) -> Tool:
            tool = Tool(fn, name=name or fn.__name__, side_effect=side_effect,
                        idempotent=idempotent, timeout=timeout, retry=retry or RetryPolicy(),
                        interruptible=interruptible, version=version, limits=limits,
                        repeatable=repeatable)
            return self.add_tool(tool)

        return register(fn) if fn is not None else register

    def add_tool(self, tool: Tool) -> Tool:
        """Register a tool built elsewhere (an integration's, from a :class:`ToolPolicy`)."""
        if tool.name in self.tools:
            raise ConfigurationError(f"a tool named {tool.name!r} is already registered")
        self.tools[tool.name] = tool
        return tool

    def limit(self, name: str, *, concurrency: int | None = None,
              per_minute: int | None = None, per_second: int | None = None,
              rate: tuple[int, float] | None = None,
              key: Callable[[Any], object] | None = None,
              tokens_per_minute: int | None = None,
              tokens: tuple[int, float] | None = None) -> Limit:
        """Define a named limit shared by every worker: *concurrency* at once, and/or
        *per_minute* / *per_second* / *rate* = (count, seconds) admissions in any window,
        and/or *tokens_per_minute* / *tokens* = (budget, seconds) (calls admitted while
        those of the window used fewer tokens);
        with *key* (a function of the task's input), one such limit per value (a tenant).
        Tools name it in ``limits=``, agents in their ``limits`` attribute."""
        if name in self.limits:
            raise ConfigurationError(f"a limit named {name!r} is already defined")
        self.limits[name] = make_limit(name, concurrency=concurrency, per_minute=per_minute,
                                       per_second=per_second, rate=rate, key=key,
                                       tokens_per_minute=tokens_per_minute, tokens=tokens)
        return self.limits[name]

    def agent(self, name: str) -> Callable[[type[A]], type[A]]:
        """Register an agent class (instantiated with no arguments) under *name*."""

        def register(cls: type[A]) -> type[A]:
            self.add_agent(name, cls())
            return cls

        return register

    def add_agent(self, name: str, agent: Agent) -> None:
        """Register an agent instance (one built with arguments, say a model client)."""
        if name in self.agents:
            raise ConfigurationError(f"an agent named {name!r} is already registered")
        if not inspect.iscoroutinefunction(getattr(agent, "plan", None)):
            raise ConfigurationError(f"agent {name!r} needs an async plan(task) method")
        agent.name = name
        for tool in agent.own_tools():
            self.add_tool(tool)
        self.agents[name] = agent

    async def running_tasks(self, limit: int) -> list[TaskRecord]:
        """Tasks marked running, wherever they run (for a worker run until idle)."""
        return await self.store.list_tasks(Status.RUNNING, limit)

    async def leased_tasks(self, limit: int) -> list[TaskRecord]:
        """Unfinished tasks under a worker's lease, running or claimed and not yet running
        (for the takeover of a dead worker's tasks)."""
        return await self.store.leased_tasks(limit)

    def resource_kind(self, name: str, exists: Callable[[str], bool],
                      cleanup: Callable[[str], None]) -> None:
        """Teach the harness to check and clean up one more kind of external resource."""
        self.resource_kinds.register(name, ResourceKind(exists, cleanup))

    def lifespan(self, fn: L, /) -> L:
        """Register an app lifespan: an async generator function of the harness that yields
        once, like FastAPI's and Starlette's. What comes before the ``yield`` runs before any
        worker of this process claims a task, what comes after runs once they have stopped
        (drained, on SIGTERM too)::

            @harness.lifespan
            async def mcp_tools(h: tt.Harness) -> AsyncIterator[None]:
                async with payments:     # an MCPTools, an HTTP client, a DB pool...
                    yield

        The same function decorated with ``contextlib.asynccontextmanager`` is taken too.
        Several lifespans are entered in the order they were registered and left in reverse.
        ``tether worker``, ``tether serve --with-worker``, :meth:`run_until_idle` and
        :meth:`serve` enter them (see :meth:`lifespan_context`); commands that only pull a
        lever or read do not. Returns *fn* unchanged."""
        self._lifespans.register(fn)
        return fn

    @property
    def lifespans(self) -> tuple[str, ...]:
        """The names of the registered lifespans (``module.function``), in the order they are
        entered."""
        return self._lifespans.names

    @property
    def lifespan_entered(self) -> bool:
        """Whether this harness's lifespans are entered now."""
        return self._lifespans.entered

    def lifespan_context(self) -> AbstractAsyncContextManager[None]:
        """Enter this harness's lifespans for the block (``async with h.lifespan_context():``).

        Entering is counted per harness: the first to enter runs every lifespan's enter, a
        block entered while they are open shares them, and the last to leave runs their exit.
        So :meth:`run_until_idle` inside such a block enters nothing more, and two calls of
        it outside one each enter and leave. A lifespan that raises on enter leaves the ones
        entered before it (in reverse) and raises :class:`~tether.errors.LifespanFailed`
        naming it: the block does not run. One that raises on exit is logged with its
        traceback; the others are still left, then ``LifespanFailed`` is raised. The
        lifespans run in one asyncio task of their own, entered and left there (anyio task
        groups, as the MCP SDK uses, need that), so a contextvar one sets is not seen by
        the workers: hand them what they need on an object."""
        return self._lifespans.context()

    # ------------------------------------------------------------------ tasks and events

    async def submit(self, agent: str, input: Any = None, task_id: str | None = None, *,
                     deadline: Moment | None = None, not_before: Moment | None = None,
                     max_steps: int | None = None) -> str:
        """Create a task run by *agent*; it starts when a worker claims it.

        *not_before* schedules the start; *deadline* is when the whole task must be done
        (both: seconds or a timedelta from now, or an aware datetime, at most ten years
        ahead). A deadline that passes fires ``task_timeout``, which stops the task as
        failed (E6). *max_steps* overrides ``Settings.max_steps`` for this task.
        """
        if max_steps is not None:
            check_count(max_steps, "max_steps")
        if agent not in self.agents:
            known = ", ".join(sorted(self.agents)) or "none"
            raise UnknownAgent(f"no agent {agent!r} is registered (known: {known})")
        if input is None and self.agents[agent].input_required:
            raise InvalidInput(f"agent {agent!r} needs an input (a prompt or the data it works"
                               " on); nothing was stored")
        task_id = new_id() if task_id is None else check_task_id(task_id)
        plain = _to_plain(input, self.settings.max_payload_bytes, "task input")
        now = time.time()
        start = due_time(not_before, "not_before", now)
        snap = Snapshot(task_id=task_id, agent=agent, input=plain, created_at=now,
                        stack=[Frame(agent=agent, input=plain)],
                        deadline_at=due_time(deadline, "deadline", now), max_steps=max_steps)
        record = TaskRecord(task_id, agent, Status.PENDING, now, now, 1)
        head, large = blobs.layered(snap.dumps(), self.settings.blob_threshold)
        await self.store.create_task(record, head, wake_at=start, blobs=large)
        self.work_arrived.set()
        return task_id

    async def emit(self, event: Event) -> EmitReceipt:
        """Store an event durably and tell a local runner; returns once it is stored (R19).

        Levers (cancel, resume, rollback, decide) and the harness's own timers are refused
        here: they have methods of their own, so whoever may send events (a webhook, a
        stream) cannot steer a task."""
        if event.type in RESERVED_EVENTS:
            raise ReservedEventType(
                f"event type {event.type!r} is a lever, not a message: use the harness's"
                " resume/rollback/cancel/decide methods, the CLI, the console or the API's"
                " dedicated routes")
        return await self._deliver(event)

    async def _deliver(self, event: Event) -> EmitReceipt:
        receipt, priority = await self.inbox.emit(event)
        runner = self.runners.get(event.task_id)
        if runner is not None and receipt.accepted:
            runner.notify(int(priority))
        elif receipt.accepted:
            self.work_arrived.set()
        return receipt

    async def resume(self, task_id: str, message: str | None = None,
                     frame_patch: dict[str, Any] | None = None,
                     source_event_id: str | None = None, *, by: str | None = None,
                     input: Any = KEEP_INPUT, earlier_result: bool = False,
                     etag: str | None = None) -> EmitReceipt:
        """Resume a paused, parked or failed task, optionally with a message, a frame patch,
        or a corrected *input* (the task's input is replaced; the old one stays in the
        dialog, and the agent plans again from where the task stopped, with its idempotency
        keys, so what already happened is not repeated).

        Refused (:class:`InDoubtCall`) while a side-effecting call's outcome is unknown, in
        any status (a failed task's too): a person must say what happened with
        :meth:`decide`, or it could be repeated blindly. A call running under a live
        worker's lease is not in doubt: the resume goes to that worker.

        A task holding a repeat of a side effect that already succeeded (the same tool, the
        same arguments) runs it when resumed; with *earlier_result* it does not run, and the
        agent is answered with the earlier identical call's result instead (refused with
        :class:`IllegalTransition` when the task holds no such repeat).

        A caller that showed the task to a person first (the console, a client of the API,
        ``tether show``) passes the :attr:`TaskInfo.etag` of that view: the resume is refused
        (:class:`StaleDecision`) if the task is no longer as shown, and dropped (recorded as
        ``resume_ignored``) if it moved on between this call and a worker applying it, so a
        person's "carry on" about one stop never runs what a later stop holds (a repeated
        refund, say).
        """
        info = await self.get(task_id)
        reason = f": {info.record.reason}" if info.record.reason else ""
        _refuse_if_not_as_shown(info, etag, reason, "resume")
        if earlier_result:
            await self._check_held_repeat(info, message, frame_patch)
        call = await awaiting_decision(self.store, info.snapshot, self.tools)
        if call is not None and info.snapshot.status not in FINAL \
                and info.record.runner() is None:
            raise InDoubtCall(in_doubt_message(task_id, call))
        payload: dict[str, Any] = {"message": message, "frame_patch": frame_patch,
                                   "by": _who(by)}
        if earlier_result:
            payload["earlier_result"] = True
        if etag is not None:  # applied only to the version the person saw
            payload["version"] = info.version
        if input is not KEEP_INPUT:
            payload["input"] = _to_plain(input, self.settings.max_payload_bytes, "input")
        return await self._control(Event("resume", task_id, payload,
                                         source_event_id=source_event_id))

    async def _check_held_repeat(self, info: TaskInfo, message: str | None,
                                 frame_patch: dict[str, Any] | None) -> None:
        if message or frame_patch:
            raise InvalidInput("answering the held call with the earlier result and a message"
                               " (or patch) that has the agent plan again without it are two"
                               " answers: choose one")
        task_id = info.record.task_id
        if held_repeat(info.snapshot, await self.history(task_id)) is None:
            raise IllegalTransition(f"task {task_id} holds no repeat of a call that already"
                                    " succeeded, so there is no earlier result to answer it"
                                    " with (resume it without that option)")

    async def decide(self, task_id: str, outcome: str, result: Any = None, *,
                     by: str | None = None, key: str | None = None,
                     attempt: int | None = None, etag: str | None = None) -> EmitReceipt:
        """Settle a call whose outcome is unknown, on a person's word, and carry on.

        *outcome* is ``happened`` (its *result* is recorded as the call's, nothing is run),
        ``not_happened`` (it runs now, with the same idempotency key) or ``skip`` (it is
        dropped; the agent sees it was skipped). The decision and *by* go into the dialog
        and the recovery log.

        A decision is about what the store says now: the call under its key, at its
        attempt, on its dialog branch. It is refused (:class:`CallInFlight`) while the call
        runs under a live lease, and dropped as stale (recorded, never applied) if the call
        has moved on by the time a worker applies it. A caller that showed the call to a
        person first (the console, a client of the API) passes the *key* and *attempt* it
        showed, or better the :attr:`TaskInfo.etag` of the view it showed: if the store's
        call is another by now, or the task is no longer as shown (its worker died since the
        person saw the call running, it was resumed, rolled back), the decision is refused
        (:class:`StaleDecision`) instead of being applied to a state the person never saw.
        """
        if outcome not in DECISIONS:
            raise InvalidInput(f"outcome must be one of {', '.join(DECISIONS)}, not {outcome!r}")
        if result is not None and outcome != Decision.HAPPENED:
            raise InvalidInput(f"a result goes with 'happened' only, not with {outcome!r}")
        info = await self.get(task_id)
        snap, call = info.snapshot, info.snapshot.call
        if call is None or call.status != CallStatus.STARTED or snap.status in FINAL:
            raise IllegalTransition(f"task {task_id} has no call whose outcome is unknown;"
                                    " there is nothing to decide (resume it instead)")
        seen = observation(snap)
        if (key is not None and key != seen["key"]) or \
                (attempt is not None and attempt != seen["attempt"]):
            raise StaleDecision(f"task {task_id}: the call in doubt is now {call.tool}"
                                f" key={call.key} attempt {call.attempt}, not the one shown"
                                f" (key={key} attempt {attempt}); look at it again")
        _refuse_if_not_as_shown(info, etag, f", its call {call.tool} key={call.key} attempt"
                                f" {call.attempt}{' running' if info.record.runner() else ''}",
                                "decide")
        live = info.record.runner()
        if live is not None:
            raise CallInFlight(
                f"task {task_id}: {call.tool} key={call.key} is running now, under the lease"
                f" of worker {live}; its outcome is not in doubt, so there is nothing to"
                " decide. Wait for it to finish; if that worker died, a worker recovers the"
                " task once the lease runs out and asks a person only if the outcome is"
                " really unknown")
        if settled_by_record(call, await self.store.get_idempotency(call.key)):
            raise IllegalTransition(f"task {task_id}: {call.tool} key={call.key} has a record of"
                                    " its outcome; it is answered from that record when the"
                                    " task runs, so there is nothing to decide (resume it)")
        payload = {"outcome": outcome, "by": _who(by), **seen,
                   "version": info.version,
                   "result": _to_plain(result, self.settings.max_payload_bytes, "result")}
        return await self._control(Event("decide", task_id, payload))

    async def rollback(self, task_id: str, version: int,
                       redo_side_effects: bool = False, *, by: str | None = None) -> EmitReceipt:
        """Roll a task back to a kept version (R14). Side effects are not redone unless asked (E4).

        The event names the version only; the worker applying it loads that version from the
        store. A worker in this process is also handed the head read now, so commits that
        prune the version before it is applied cannot make the rollback fail.
        """
        await ensure_task(self.store, check_task_id(task_id))
        check_count(version, "version")
        _, head = await self.store.load_head(task_id, version)  # large values stay referenced
        Snapshot.loads(await blobs.resolve(self.store, head, task_id, version), task_id,
                       version)  # a damaged version is refused here, by name
        payload = {"version": version, "redo_side_effects": redo_side_effects, "by": _who(by)}
        event = Event("rollback", task_id, payload)
        return await self._control(event, captured=(version, head))

    async def fork(self, task_id: str, version: int | None = None, *,
                   new_task_id: str | None = None, redo_side_effects: bool = False,
                   paused: bool = False, by: str | None = None) -> str:
        """A new task from kept *version* (default: the newest) of *task_id*; its id.

        The fork has its own id and idempotency keys and the source's dialog up to that
        version; the source is untouched. A call the source already made is not made again
        unless *redo_side_effects* (see :mod:`tether.engine.forking`). With *paused* it
        waits for a person's resume whatever the version's status."""
        source = await self.store.get_task(check_task_id(task_id))
        version = source.head_version if version is None else check_count(version, "version")
        fork_id = new_id() if new_task_id is None else check_task_id(new_task_id)
        plan = ForkPlan(task_id, version, fork_id, _who(by), redo_side_effects, paused)
        await fork_task(self.store, self.settings, plan, f"fork:{self.worker_id}")
        self.work_arrived.set()
        return fork_id

    async def delete(self, task_id: str, *, by: str | None = None) -> None:
        """Delete a task and everything it stored (snapshots, dialog, events, call records,
        recovery log). Refused (:class:`TaskHeld`, nothing deleted) while a worker holds it:
        cancel a running task first. Large values it alone used go with the next
        housekeeping round (:meth:`housekeep`)."""
        await self.store.delete_task(check_task_id(task_id), time.time())
        self.log.info("task %s deleted by %s", task_id, _who(by))

    async def housekeep(self, collect: bool = True) -> Swept:
        """Delete the finished tasks past their retention (``Settings.retain_*``) and, with
        *collect*, the large values no kept version refers to; workers do this every
        ``housekeeping_interval`` by themselves."""
        return await sweep(self.store, self.settings, self.log, collect)

    # ------------------------------------------------------------------ schedules

    async def schedule(self, name: str, cron: str, agent: str, input: Any = None, *,
                       timezone: str = "UTC", catch_up: int = 0,
                       paused: bool = False) -> ScheduleRecord:
        """Start a task of *agent* with *input* at every time *cron* names, in *timezone*
        (created, or its definition replaced). Runs missed while no worker ran are skipped,
        or the most recent *catch_up* of them start late (see :mod:`tether.schedules`)."""
        schedules.check(name, cron, timezone, catch_up)
        if agent not in self.agents:
            raise UnknownAgent(f"schedule {name}: no agent {agent!r} is registered (known:"
                               f" {', '.join(sorted(self.agents)) or 'none'})")
        if input is None and self.agents[agent].input_required:
            raise InvalidInput(f"schedule {name}: agent {agent!r} needs an input, and each run"
                               " would be refused without one: give the schedule an input")
        now = time.time()
        kept = await self.store.list_schedules(name)
        record = ScheduleRecord(
            name, cron, timezone, agent, _to_plain(input, self.settings.max_payload_bytes,
                                                   "schedule input"), catch_up, paused,
            schedules.next_after(cron, timezone, now),
            kept[0].last_run_at if kept else None, kept[0].created_at if kept else now)
        await self.store.put_schedule(record)
        self.work_arrived.set()
        return record

    async def schedule_named(self, name: str) -> ScheduleRecord:
        found = await self.store.list_schedules(schedules.check_name(name))
        if not found:
            raise ScheduleNotFound(f"no schedule {name!r}; `tether schedule ls` lists them")
        return found[0]

    async def pause_schedule(self, name: str, paused: bool = True) -> ScheduleRecord:
        """Pause a schedule (or resume it: the next run is the next time from now; runs that
        fell while it was paused are not started)."""
        record = await self.schedule_named(name)
        moved = dataclasses.replace(record, paused=paused, next_at=schedules.next_after(
            record.cron, record.timezone, time.time()))
        await self.store.put_schedule(moved)
        return moved

    async def run_schedule_now(self, name: str) -> str:
        """Start one run of the schedule now, outside its times; the run's task id."""
        record = await self.schedule_named(name)
        task_id = schedules.run_id(name, time.time(), now=True)
        await self.start_run(record, task_id)
        return task_id

    async def start_run(self, schedule: ScheduleRecord, task_id: str) -> None:
        await self.submit(schedule.agent, schedule.input, task_id=task_id)

    async def delete_schedule(self, name: str) -> None:
        """Delete a schedule; the tasks it started stay."""
        if not await self.store.delete_schedule(schedules.check_name(name)):
            raise ScheduleNotFound(f"no schedule {name!r}; nothing was deleted")

    def degrade(self, detail: dict[str, Any] | str) -> None:
        """Degrade this whole worker (a model provider is down, say): each task it runs
        switches to its agent's fallback at its next step, and its dialog records it."""
        payload = detail if isinstance(detail, dict) else {"reason": detail}
        self.degraded = _to_plain(payload, self.settings.max_payload_bytes, "degrade detail")
        self._wake_runners()

    def recover(self) -> None:
        """End a worker-wide degradation; tasks paused by it carry on."""
        self.degraded = None
        self._wake_runners()

    def _wake_runners(self) -> None:
        for runner in self.runners.values():
            runner.notify(2)

    async def cancel(self, task_id: str, *, by: str | None = None) -> EmitReceipt:
        await ensure_task(self.store, check_task_id(task_id))
        return await self._control(Event("cancel", task_id, {"by": _who(by)}))

    def slot_freed(self, task_id: str) -> None:
        """A limit's slot was let go for *task_id*: its runner, if it is here, asks again."""
        runner = self.runners.get(task_id)
        if runner is not None:
            runner.admission.slot_freed()

    def captured_head(self, event_id: int, version: int) -> bytes | None:
        """The head a rollback lever of this process read when it was asked, if still held."""
        captured = self._captured.pop(event_id, None)
        return captured[1] if captured is not None and captured[0] == version else None

    async def _control(self, event: Event,
                       captured: tuple[int, bytes] | None = None) -> EmitReceipt:
        """Deliver a control event (to a task the caller has checked exists), and apply it at
        once if no worker holds the task."""
        receipt = await self._deliver(event)
        if captured is not None and receipt.outcome == "stored":
            self._captured[receipt.event_id] = captured
            while len(self._captured) > CAPTURED_HEADS:
                del self._captured[next(iter(self._captured))]
        if event.task_id not in self.runners and not await self._lacks_code(event.task_id):
            claim = await self.store.claim_task(event.task_id, self.worker_id, time.time(),
                                                self.settings.lease_seconds)
            if claim is not None:
                await run_claimed(self, claim, steps=False)
        return receipt

    async def _lacks_code(self, task_id: str) -> list[str]:
        """What this process lacks of a task's code, judged on the task as the store has it
        now, after the lever was stored (an unreadable head is left to the worker that
        claims it, as before)."""
        try:
            snap = (await self.get(task_id)).snapshot
        except TetherError:
            return []
        return self.lacks_code(snap)

    def lacks_code(self, snap: Snapshot) -> list[str]:
        """What of *snap*'s code is missing here (agents of its frames, the tool of its open
        call, or a tool of that name declaring otherwise); empty if this process may apply
        a lever to it at once.

        Only the code judges: a lever applied here may ask an agent whether its wait has
        ended, a reconcile hook what became of a call. A process without that code (a CLI
        or server started without ``--app``, another app) stores the lever for a worker
        that has it, and says so."""
        missing = [f"agent {name!r}" for name in dict.fromkeys(f.agent for f in snap.stack)
                   if name not in self.agents]
        for call in snap.open_calls():
            differs = code_differs(call, self.tools)
            if differs is not None:
                missing.append(differs)
        return missing

    # ------------------------------------------------------------------ running

    async def run_until_idle(self, concurrency: int = 4, timeout: float | None = None,
                             stop: asyncio.Event | None = None) -> None:
        """Run tasks until none has work left (waiting tasks with future timers stay asleep).

        The app's lifespans are entered first unless they are already (see
        :meth:`lifespan_context`), and left after the workers stop; *timeout* covers both."""
        async def run() -> None:
            async with self.lifespan_context():
                await Worker(self, concurrency).run(until_idle=True, stop=stop)

        await asyncio.wait_for(run(), timeout)

    async def serve(self, concurrency: int = 4, stop: asyncio.Event | None = None) -> None:
        """Run as a long-lived worker: claim, run and recover tasks until *stop* is set (in
        the app's lifespans, entered unless they are already: :meth:`lifespan_context`)."""
        async with self.lifespan_context():
            await Worker(self, concurrency).run(until_idle=False, stop=stop, wake_waiting=True)

    async def wake_waiting(self) -> int:
        """Have every waiting task re-checked once (R16): an approval may have come meanwhile."""
        return await self.store.wake_all(Status.WAITING, time.time())

    # ------------------------------------------------------------------ reading

    async def get(self, task_id: str) -> TaskInfo:
        record = await self.store.get_task(check_task_id(task_id))
        version, snapshot, damaged, _ = await newest_readable(self.store, task_id)
        return TaskInfo(record, version, snapshot, tuple(damaged))

    async def history(self, task_id: str) -> list[dict[str, Any]]:
        info = await self.get(task_id)
        rows = await self.store.read_history(task_id, info.snapshot.history_segments)
        return rows[: info.snapshot.history_len]

    async def export(self, task_id: str) -> dict[str, Any]:
        """The handoff bundle of a task (R26)."""
        return await export_bundle(self.store, check_task_id(task_id))

    async def notify(self, task_id: str) -> None:
        """Export the bundle and call the notifier: someone has to look at this task."""
        bundle = await self.export(task_id)
        if self.bundle_dir is not None:
            self.bundle_dir.mkdir(parents=True, exist_ok=True)
            (self.bundle_dir / f"{check_task_id(task_id)}.json").write_bytes(dumps_bundle(bundle))
        if self.notifier is None:
            self.log.warning("task %s needs a person: %r", task_id, bundle["reason"])
            return
        outcome = self.notifier(bundle)
        if inspect.isawaitable(outcome):
            await outcome

    @property
    def worker_id(self) -> str:
        """This worker's id in leases and logs: the one given, or one made in the process
        that runs the worker (a harness made before a fork gets a new id in the child, so
        no other worker can take the parent's exit for this worker's death)."""
        if self._given_worker_id:
            return self._given_worker_id
        pid, _ = self._made_worker_id
        if pid != os.getpid():
            self._made_worker_id = (os.getpid(), new_worker_id())
        return self._made_worker_id[1]

    async def __aenter__(self) -> Harness:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()
            self._store = None



async def ensure_task(store: Store, task_id: str) -> None:
    """Fail early, naming the task, when an operation targets a task that does not exist."""
    try:
        await store.get_task(task_id)
    except TaskNotFound:
        raise TaskNotFound(f"no task {task_id!r}; check the id with `tether ls`") from None


FINAL = frozenset({Status.COMPLETED, Status.CANCELLED})
"""Statuses in which no call can be open any more (a failed task's may be, in doubt)."""


def _refuse_if_not_as_shown(info: TaskInfo, etag: str | None, detail: str, lever: str) -> None:
    """A lever pulled on a view of the task (its *etag*) is refused when the store's task is
    no longer that view: it is never applied to a state the person did not see."""
    if etag is not None and etag != info.etag:
        raise StaleDecision(f"task {info.record.task_id} is no longer as it was shown (it is"
                            f" {info.record.status.value} at version {info.version}{detail});"
                            f" look at it again and {lever} anew")


def _who(by: str | None) -> str:
    """Who pulled a lever, as the dialog and the recovery log record it."""
    if by is None:
        return "python"
    if not isinstance(by, str) or not 0 < len(by) <= 200:
        raise InvalidInput("by must be a short text naming who pulled the lever")
    return by

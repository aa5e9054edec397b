"""A test double of :class:`tether.engine.task.RunningTask`, with no store behind it.

The engine's helpers (recovery, events, timers, degrade) work only on a RunningTask and never
commit. :class:`FakeTask` is the smallest honest implementation of that interface: plain
attributes, and a record of everything a helper asks of it (dialog rows, recovery records,
idempotency records, fired timer events, whether a commit was asked for). Status changes go
through :func:`tether.model.check_transition` as the runner's do; ``finish_call`` and
``put_first`` run the runner's own code (the shared functions of ``tether.engine.task``
and ``tether.engine.calls``), so the double cannot drift from it. :class:`FakeReads` answers the few
store reads a helper may make from dictionaries.

Imported by the engine unit tests as ``engine_double``.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from tether.agent import Agent, TaskView
from tether.engine import calls
from tether.engine.dialog_rows import DialogRows
from tether.engine.task import RunningTask, TaskReads, pop_frame, put_first
from tether.errors import UnknownAgent, VersionNotFound
from tether.model import (
    Action,
    AgendaEntry,
    CallState,
    CallStatus,
    Event,
    Fail,
    Finish,
    Frame,
    IdempotencyRecord,
    OutcomeStatus,
    Reply,
    Snapshot,
    Status,
    ToolCall,
    action_to_dict,
    check_transition,
)
from tether.protocol import InterruptionProtocol
from tether.resources import ResourceKinds
from tether.settings import Settings
from tether.store.base import Claim, StoredEvent
from tether.strategies import Strategy
from tether.tools import RetryPolicy, Tool, ToolContext, args_hash, idempotency_key

TASK = "t1"


class FakeReads:
    """The store reads of :class:`~tether.engine.task.TaskReads`, from plain containers.

    One dialog branch only: ``read_history`` returns ``rows`` whatever the segments say.
    """

    def __init__(self) -> None:
        self.idempotency: dict[str, IdempotencyRecord] = {}
        self.events: list[StoredEvent] = []
        self.rows: list[dict[str, Any]] = []
        self.heads: dict[int, bytes] = {}
        self.blobs: dict[str, bytes] = {}
        self.last_epoch = 0
        self.fail_with: Exception | None = None
        """Raised by every read when set (a store gone away)."""

    def _check(self) -> None:
        if self.fail_with is not None:
            raise self.fail_with

    async def get_idempotency(self, key: str) -> IdempotencyRecord | None:
        self._check()
        return self.idempotency.get(key)

    async def idempotency_keys(self, task_id: str) -> set[str]:
        self._check()
        return {key for key, record in self.idempotency.items() if record.task_id == task_id}

    async def pending_events(self, task_id: str) -> list[StoredEvent]:
        self._check()
        return [e for e in self.events if e.event.task_id == task_id]

    async def read_history(self, task_id: str,
                           segments: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
        self._check()
        return [dict(row) for row in self.rows]

    async def next_epoch(self, task_id: str) -> int:
        self._check()
        self.last_epoch += 1
        return self.last_epoch

    async def load_head(self, task_id: str, version: int | None = None) -> tuple[int, bytes]:
        self._check()
        if version is None and self.heads:
            version = max(self.heads)
        if version is None or version not in self.heads:
            raise VersionNotFound(f"task {task_id}: version {version} is not kept")
        return version, self.heads[version]

    async def load_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        self._check()
        return {d: self.blobs[d] for d in digests if d in self.blobs}


class FakeTask:
    """A RunningTask made of plain attributes, recording what the helpers ask of it."""

    def __init__(self, snap: Snapshot, *, tools: Iterable[Tool] = (),
                 agents: Iterable[Agent] = (), settings: Settings | None = None,
                 claim: Claim | None = None, version: int = 1,
                 history: list[dict[str, Any]] | None = None, reads: FakeReads | None = None,
                 resource_kinds: ResourceKinds | None = None,
                 worker_degraded: dict[str, Any] | None = None) -> None:
        self.snap = snap
        self.version = version
        self.history = DialogRows([] if history is None else history)
        self.claim = claim or Claim(snap.task_id, fence=1, crashed=False)
        self.settings = settings or Settings()
        self.tools: dict[str, Tool] = {tool.name: tool for tool in tools}
        self.agents: dict[str, Agent] = {agent.name: agent for agent in agents}
        self.resource_kinds = resource_kinds or ResourceKinds()
        self.counters: Counter[str] = Counter()
        self.worker_degraded = worker_degraded
        self.protocol = InterruptionProtocol()
        self.fake_reads = reads or FakeReads()
        self.captured: dict[tuple[int, int], bytes] = {}
        # What the helpers asked for:
        self.rows: list[dict[str, Any]] = []
        self.recovery_log: list[tuple[Strategy, int | None, str]] = []
        self.tracebacks: list[str] = []
        self.idempotency: list[IdempotencyRecord] = []
        self.finished: list[tuple[str, Any, bool, bool]] = []
        self.replaced: list[tuple[Snapshot, list[dict[str, Any]]]] = []
        self.fired: list[Event] = []
        self.commit_requested = False
        self.progress = False

    @property
    def reads(self) -> TaskReads:
        return self.fake_reads

    # ------------------------------------------------------------- what helpers read

    def agent_for(self, frame: Frame) -> Agent:
        try:
            return self.agents[frame.agent]
        except KeyError:
            raise UnknownAgent(f"agent {frame.agent!r} named by task {self.snap.task_id}"
                               " is not registered") from None

    async def view(self, scratch: dict[str, Any] | None = None,
                   frame: Frame | None = None) -> TaskView:
        frame = frame or self.snap.frame
        scratch = copy.deepcopy(frame.scratch) if scratch is None else scratch
        return TaskView(self.snap, await self.history.rows(), scratch, frame)

    def captured_head(self, event_id: int, version: int) -> bytes | None:
        return self.captured.get((event_id, version))

    # ------------------------------------------------------------- what helpers change

    def set_status(self, status: Status) -> None:
        check_transition(self.snap.task_id, self.snap.status, status)
        self.snap.status = status

    def supersedes(self, event_type: str) -> bool:
        return self.protocol.supersedes(event_type)

    def append_history(self, entry: dict[str, Any]) -> None:
        self.snap.history_len += 1
        self.history.append(entry)
        self.rows.append(entry)

    def log_recovery(self, strategy: Strategy, event_id: int | None = None,
                     detail: str = "", traceback: str | None = None) -> None:
        self.recovery_log.append((strategy, event_id, detail))
        if traceback:
            self.tracebacks.append(traceback)

    def record_idempotency(self, call: CallState, status: OutcomeStatus, result: Any = None,
                           error: str | None = None) -> None:
        self.idempotency.append(IdempotencyRecord(
            call.key, self.snap.task_id, call.tool, call.args_hash, status, result, error,
            call.attempt))

    def put_first(self, action: Action, frame: Frame | None = None,
                  agent: Agent | None = None) -> None:
        put_first(self, action, frame, agent)

    def pop_frame(self, action: Finish | Fail, by: dict[str, Any]) -> None:
        pop_frame(self, action, by)

    def finish_call(self, call: CallState, result: Any, from_record: bool = False,
                    defer: bool = False) -> None:
        """The runner's own code (:func:`tether.engine.calls.finish_call`), seen by the test."""
        self.finished.append((call.key, result, from_record, defer))
        calls.finish_call(self, call, result, from_record, defer)

    def replace_state(self, snap: Snapshot, history: list[dict[str, Any]]) -> None:
        self.replaced.append((snap, history))
        self.snap = snap
        self.history.replace(history)

    async def fire(self, event: Event) -> None:
        self.fired.append(event)

    def mark_progress(self) -> None:
        self.progress = True

    def request_commit(self) -> None:
        self.commit_requested = True

    # ------------------------------------------------------------- for assertions

    @property
    def strategies(self) -> list[Strategy]:
        return [strategy for strategy, _, _ in self.recovery_log]


def _is_a_running_task(task: FakeTask) -> RunningTask:
    """mypy checks here that FakeTask satisfies the RunningTask protocol."""
    return task


# ----------------------------------------------------------------- building blocks


class ScriptedAgent(Agent):
    """An agent whose ``on_event`` and ``check_wait`` give fixed answers and record what they
    were asked. ``answer`` may be anything, to test what the engine does with a non-action."""

    def __init__(self, name: str = "main", answer: Any = None, *,
                 raises: Exception | None = None, found: Any = None,
                 found_raises: Exception | None = None,
                 scratch: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.answer = answer
        self.raises = raises
        self.found = found
        self.found_raises = found_raises
        self.scratch = dict(scratch or {})
        self.events: list[Event] = []
        self.waits: list[dict[str, Any]] = []

    async def plan(self, task: TaskView) -> Action:
        raise AssertionError("the engine's helpers never plan")

    async def on_event(self, task: TaskView, event: Event) -> Action | None:
        self.events.append(event)
        task.scratch.update(self.scratch)
        if self.raises is not None:
            raise self.raises
        answer: Action | None = self.answer
        return answer

    async def check_wait(self, task: TaskView, wait: Mapping[str, Any]) -> Any | None:
        self.waits.append(dict(wait))
        if self.found_raises is not None:
            raise self.found_raises
        return self.found


def make_tool(name: str = "pay", *, side_effect: bool = False,
              retry: RetryPolicy | None = None, runs: list[dict[str, Any]] | None = None) -> Tool:
    """A tool that records each run in *runs* (recovery must never run a tool itself)."""
    seen = runs if runs is not None else []

    async def fn(ctx: ToolContext, **args: Any) -> Any:
        seen.append(dict(args))
        return {"ran": args}

    return Tool(fn, name=name, side_effect=side_effect, idempotent=not side_effect, timeout=None,
                retry=retry or RetryPolicy(), interruptible=False)


def make_snap(status: Status = Status.RUNNING, *, agent: str = "main",
              agenda: Iterable[Action] = (), step: int = 0) -> Snapshot:
    """A one-frame task (frame id ``f0``) with *agenda* as its recorded work."""
    frame = Frame(agent=agent, frame_id="f0",
                  agenda=[AgendaEntry(action_to_dict(action)) for action in agenda])
    return Snapshot(task_id=TASK, agent=agent, input=None, status=status, step=step,
                    stack=[frame])


def open_call(snap: Snapshot, tool: str = "pay", args: Mapping[str, Any] | None = None,
              status: CallStatus = CallStatus.STARTED, attempt: int = 1) -> CallState:
    """Put a call to *tool* at the head of the top frame's agenda and make it the open call."""
    plain = dict(args or {"amount": 5})
    frame = snap.frame
    frame.agenda.insert(0, AgendaEntry(action_to_dict(ToolCall(tool, plain))))
    call = CallState(key=idempotency_key(snap.task_id, frame.frame_id, frame.steps,
                                         snap.key_salt),
                     tool=tool, args=plain, args_hash=args_hash(tool, plain), status=status,
                     attempt=attempt)
    snap.call = call
    return call


def record_for(call: CallState, status: OutcomeStatus, result: Any = None,
               args_hash_: str | None = None) -> IdempotencyRecord:
    """What the idempotency table would hold for *call*."""
    return IdempotencyRecord(call.key, TASK, call.tool, args_hash_ or call.args_hash, status,
                             result, None, call.attempt)


def stored(event_type: str, payload: Any = None, *, priority: int = 1, event_id: int = 7,
           created_at: float | None = None) -> StoredEvent:
    """A pending event as the store hands it to the runner."""
    event = Event(event_type, TASK, payload, priority=priority, id=event_id)
    if created_at is not None:
        event.created_at = created_at
    return StoredEvent(event, priority, "pending", None)


def waiting_task(agent: ScriptedAgent, due_at: float | None = None) -> FakeTask:
    snap = make_snap(Status.WAITING)
    snap.frame.wait = {"event_type": "approval", "due_at": due_at, "timeout": None}
    if due_at is not None:
        snap.frame.wait["timer"] = "timer:f0:0"
    return FakeTask(snap, agents=[agent])


def in_doubt_task(*, side_effect: bool = True, reads: FakeReads | None = None,
                  tools: list[Tool] | None = None, status: Status = Status.RUNNING,
                  **kwargs: Any) -> FakeTask:
    """A task whose open call (``pay``, amount 5) was started and never answered; a reply
    is recorded after it."""
    snap = make_snap(status, agenda=[Reply("after")])
    open_call(snap)
    tool_list = [make_tool(side_effect=side_effect)] if tools is None else tools
    return FakeTask(snap, tools=tool_list, reads=reads, agents=[ScriptedAgent()], **kwargs)


def with_reconcile(hook: Any) -> Tool:
    tool = make_tool(side_effect=True)
    tool.reconcile(hook)
    return tool


def lever(event_type: str, payload: Any, event_id: int = 9) -> Event:
    return Event(event_type, TASK, payload, id=event_id)

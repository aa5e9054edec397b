"""What every model agent shares, so each adapter keeps only what is its framework's (R1,
R10, R12, R17, E1).

:class:`ModelAgent` is the base of :class:`tether.agents.ChatAgent` and of the framework
adapters (:mod:`tether.integrations.pydantic_ai`, :mod:`tether.integrations.openai_agents`,
and the next ones). It holds the contract they all keep:

- **One model request is one committed plan** (``commit_plans``): a worker killed after the
  answer never pays for it again. The plan returns the whole answer (every call of it); the
  engine holds it, and a newer message sets the rest aside (:mod:`tether.engine.answers`).
- **The same request path** (:meth:`ModelAgent.request`): the in-process retries of
  transient errors under ``retry=`` (a 429 shared through the agent's named limits), the
  time it took, and a P0 turned into :class:`tether.agent.CutOff` with the text streamed so
  far, which the runner keeps marked cut off.
- **Streaming when the model can** (``stream=None``: :meth:`ModelAgent.can_stream` says;
  ``True``/``False`` forces it). A plain request is cut by a P0 too, with no text to keep.
- **The same approval wait**: a call that needs a person's approval is planned as a
  ``Wait("approval")`` and the call, whose ``approval`` argument is :data:`PENDING`;
  :meth:`ModelAgent.prepare` puts the answer into it when it runs.
- **Incremental history** (:meth:`ModelAgent.kept`): a running task's framework history
  is kept between plans and fed only the rows added since; it is decoded from every row
  after a load, a rollback or a fork.
- **The same reconcile contract** (:func:`hook_takes_call`): a hook takes the tool's own
  arguments or the model's call, read from its signature and checked when the agent is
  made; what it returns is checked by the adapter when it returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

from tether.agent import Agent, CutOff, DialogPosition, TaskView
from tether.agents.model_calls import RetryPolicy, with_retries
from tether.errors import ConfigurationError
from tether.model import Action, ToolCall, Wait
from tether.tools import (
    ReconcileFn,
    Tool,
    ToolContext,
    ToolPolicy,
    check_hook,
    hook_misfit,
    hook_name,
)

T = TypeVar("T")
D = TypeVar("D", bound="Decoded")

PENDING = "pending"
"""A queued call's approval before the ``approval`` event came."""
DIALOGS_KEPT = 256
"""Tasks whose history an agent keeps decoded in memory; the oldest is dropped beyond it."""


class Decoded(Protocol):
    """A framework's history as decoded from a task's rows, fed as they come."""

    position: DialogPosition | None
    opening: str
    """The task's input as it opened the history: a replaced input means decoding again."""

    def feed(self, rows: Iterable[Mapping[str, Any]]) -> None: ...


class ModelAgent(Agent):
    """The base of every model agent (see the module docstring)."""

    commit_plans = True
    person_may: ClassVar[frozenset[str]] = frozenset()
    """What a person's approval may carry beside yes or no, for frameworks that can apply
    it: ``"args"`` (the call's arguments, edited) and ``"respond"`` (an answer given in the
    tool's place). A decision carrying anything else is never run as if approved as is."""

    def __init__(self, *, retry: RetryPolicy | None, stream: bool | None, version: str) -> None:
        self.retry = retry or RetryPolicy()
        self.stream = stream
        self.version = version
        self.cannot_stream = False
        """Learned: the model refused a streamed request, so plain ones are sent from now on."""
        self.dialogs: dict[str, Any] = {}
        """Each running task's decoded history, kept between its plans (at most
        :data:`DIALOGS_KEPT`)."""

    # ------------------------------------------------------------------ requests

    def can_stream(self) -> bool:
        """Whether the model streams; an adapter whose framework can tell overrides it."""
        return True

    def streams(self) -> bool:
        if self.stream is not None:
            return self.stream
        return not self.cannot_stream and self.can_stream()

    def learn_cannot_stream(self, error: BaseException) -> bool:
        """Called when a streamed request failed with *error*, which an adapter has read as
        "this model does not stream": with ``stream=None`` it sends plain requests from now
        on (True: ask again at once, plainly); a forced ``stream=True`` keeps the error."""
        if self.stream is not None or self.cannot_stream:
            return False
        self.cannot_stream = True
        return True

    def learn_streams_nothing(self) -> None:
        """Called when a streamed request was answered without a single piece streamed (a
        framework may quietly ask a model that cannot stream plainly): with ``stream=None``
        it sends plain requests from now on, sparing the streaming machinery's cost."""
        if self.stream is None:
            self.cannot_stream = True

    async def request(self, once: Callable[[], Awaitable[T]], what: str,
                      partial: Callable[[], str] = str) -> tuple[T, float]:
        """One model request through the retries, and the seconds it took; a P0 (or a
        graceful stop) cancelling it raises CutOff with what *partial* says was streamed."""
        started = time.monotonic()
        try:
            answer = await with_retries(once, self.retry, what, shared=bool(self.limits))
        except asyncio.CancelledError:
            raise CutOff(partial()) from None
        return answer, time.monotonic() - started

    # ------------------------------------------------------------------ history

    def kept(self, task: TaskView, fresh: Callable[[], D], opening: str) -> D:
        """The task's decoded history: the one kept from its last plan here, fed only the rows
        added since; decoded from every row when this process has none for the task, or its
        rows are not the ones decoded (a load, a rollback, a fork), or its input was
        replaced (*opening* differs)."""
        dialog: D | None = self.dialogs.pop(task.task_id, None)
        new = None
        if dialog is not None and dialog.position is not None and dialog.opening == opening:
            new = task.history.since(dialog.position)
        if dialog is None or new is None:
            if dialog is not None:
                self.forget(dialog)
            dialog, new = fresh(), task.history
        dialog.feed(new)
        dialog.position = task.history.position()
        self.dialogs[task.task_id] = dialog  # the newest last
        while len(self.dialogs) > DIALOGS_KEPT:
            self.forget(self.dialogs.pop(next(iter(self.dialogs))))
        return dialog

    def forget(self, decoded: Any) -> None:
        """A decoded history is dropped (decoded again, or the oldest kept): an adapter that
        holds something for it (an open framework run) lets it go here."""

    # ------------------------------------------------------------------ the framework's tools

    @staticmethod
    def checked_policies(tools: Mapping[str, ToolPolicy] | None, known: Iterable[str],
                         owner: str) -> dict[str, ToolPolicy]:
        """*tools* (``tools=``), each naming a tool *owner* has: one that names no such tool
        is refused now, listing the tools there are."""
        policies = dict(tools or {})
        names = sorted(known)
        unknown = sorted(set(policies) - set(names))
        if unknown:
            raise ConfigurationError(f"tools= names {', '.join(unknown)}, which {owner} does"
                                     f" not have (it has: {', '.join(names)})")
        return policies

    def framework_tool(self, name: str, run: Callable[..., Awaitable[Any]], policy: ToolPolicy,
                       reconcile: ReconcileFn | None) -> Tool:
        """The tether tool ``<agent>.<name>`` that runs a framework's tool through *run*."""
        return framework_tool(f"{self.name}.{name}", run, policy, reconcile)

    # ------------------------------------------------------------------ approvals

    async def prepare(self, task: TaskView, action: Action) -> Action:
        """A call that waited for approval carries the person's answer when it runs."""
        return with_approval(action, task, self.person_may)


def framework_tool(name: str, run: Callable[..., Awaitable[Any]], policy: ToolPolicy,
                   reconcile: ReconcileFn | None) -> Tool:
    """The tether tool *name* that runs a framework's tool through *run*, with *policy*'s
    flags and *reconcile* (the policy's hook, wrapped by the adapter)."""
    tool = dataclasses.replace(policy, reconcile=None).tool(run, name)
    if reconcile is not None:
        tool.reconcile(reconcile)
    return tool


def approval_wait(timeout: float | None) -> Wait:
    """The wait planned before a call that needs a person's approval."""
    return Wait("approval", timeout=timeout)


def with_approval(action: Action, task: TaskView,
                  person_may: frozenset[str] = frozenset()) -> Action:
    """A call that waited for approval, carrying the answer: the payload of the ``approval``
    event that ended the wait (``true``/``false``, or ``{"approved": ..., "reason": ...}``,
    with ``"args": {...}`` for a person who edited the call's arguments, or ``"respond":
    "..."`` for one who answered in the tool's place, where *person_may* names them); a
    wait that timed out is a denial. An edit or an answer the agent cannot apply is a
    denial that says so: the call is never run as the model asked when the person asked
    for something else."""
    if not isinstance(action, ToolCall) or action.args.get("approval") != PENDING:
        return action
    event = dict(task.last_event or {})
    payload = event.get("payload")
    if event.get("timeout"):
        decision = {"approved": False, "reason": "No one approved the call in time."}
    elif isinstance(payload, dict):
        decision = {"approved": payload.get("approved") is True,  # "false" approves nothing
                    "reason": payload.get("reason")}
        changes = [k for k in PERSON_CHANGES if k in payload]
        if any(k not in person_may for k in changes):
            decision = {"approved": False, "reason": CANNOT_APPLY}
        else:
            decision.update({k: payload[k] for k in changes})
    else:
        decision = {"approved": payload is True, "reason": None}
    return ToolCall(action.name, {**action.args, "approval": decision})


PERSON_CHANGES = ("args", "respond")
"""What an approval may carry beside yes or no (see :attr:`ModelAgent.person_may`)."""
CANNOT_APPLY = ("The call was not run: the person's decision edited its arguments or answered"
                " in its place, which this agent cannot apply; it must be approved or"
                " rejected as it is.")


def hook_takes_call(tool: str, hook: ReconcileFn, schema: Mapping[str, Any],
                    call: Sequence[str], call_text: str) -> tuple[bool, dict[str, Any]]:
    """Check a framework tool's reconcile hook now, against the tool's JSON-schema
    parameters (*schema*) or the model's call (the names *call*, shown as *call_text*):
    whether it takes the call, and the tool's parameters. A hook that fits neither is
    refused, naming the tool and both signatures."""
    properties: dict[str, Any] = dict(schema.get("properties") or {})
    required = [n for n in schema.get("required") or () if n in properties]
    optional = [n for n in properties if n not in required]
    own = f"`async def hook(ctx, {_parameters(properties, required)})` (the tool's arguments)"
    takes_call = hook_misfit(hook, required, optional) is not None \
        and hook_misfit(hook, call) is None
    check_hook(hook, tool, f"{own} or `{call_text}` (the model's call)",
               *((call, ()) if takes_call else (required, optional)))
    return takes_call, properties


ARGS_CALL = ("call_id", "args")
"""What a framework's tether call carries when it passes the model's arguments as a dict."""


def args_reconciler(framework: str, name: str, hook: ReconcileFn, schema: Mapping[str, Any],
                    answer: Callable[[Any, str, ToolContext], Any]) -> ReconcileFn:
    """*hook* of the *framework* tool *name*, whose tether call carries the model's call id
    and arguments (:data:`ARGS_CALL`): checked now against the tool's parameters (*schema*)
    or the call, and given what its signature takes; a value it found is made the call's
    answer by *answer* (value, call id, context)."""
    takes_call, properties = hook_takes_call(name, hook, schema, ARGS_CALL,
                                             "async def hook(ctx, call_id: str, args: dict)")

    async def reconcile(ctx: ToolContext, call_id: str, args: dict[str, Any],
                        approval: dict[str, Any] | None = None) -> Any:
        if takes_call:
            found = await hook(ctx, call_id=call_id, args=args)
        else:
            found = await hook(ctx, **{k: v for k, v in args.items() if k in properties})
        return None if found is None else answer(found, call_id, ctx)

    reconcile.__doc__ = f"The reconcile hook {hook_name(hook)} of {framework} tool {name}."
    return reconcile


def _parameters(properties: Mapping[str, Any], required: Sequence[str]) -> str:
    """A tool's JSON-schema parameters as Python parameters, for messages."""
    types = {"string": "str", "integer": "int", "number": "float", "boolean": "bool",
             "array": "list", "object": "dict"}
    shown = []
    for name, prop in properties.items():
        kind = types.get(str(prop.get("type"))) if isinstance(prop, dict) else None
        text = f"{name}: {kind}" if kind else name
        if name not in required:
            text += f" = {prop.get('default')!r}" if isinstance(prop, dict) else " = None"
        shown.append(text)
    return ", ".join(shown)

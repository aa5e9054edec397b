"""Tools: registration, retry policy, idempotency keys and failure fingerprints (R10, R15, R22).

A tool declares what a crash in the middle of it means. ``side_effect=True``
says the outside world may have changed: such a call is never repeated
blindly; after a crash its ``reconcile`` hook is asked what happened, and
without one the task goes to a person. ``idempotent=True`` (the default for
tools without side effects) says running it again with the same key is safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import inspect
import random
import re
import traceback
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tether.errors import ConfigurationError, NotRetryable, ToolTimeout
from tether.model import Cleanup, Resource

ToolFn = Callable[..., Awaitable[Any]]
ReconcileFn = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and jitter.

    ``not_retryable`` errors (and :class:`tether.NotRetryable`) give up at once:
    retrying a validation error only burns time and money.
    """

    max_attempts: int = 3
    backoff: float = 0.2
    max_backoff: float = 30.0
    jitter: float = 0.25
    not_retryable: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError("RetryPolicy.max_attempts must be at least 1")
        if self.backoff < 0 or self.max_backoff < 0 or not 0 <= self.jitter <= 1:
            raise ConfigurationError("RetryPolicy: backoff >= 0 and 0 <= jitter <= 1")

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        if isinstance(error, (NotRetryable, *self.not_retryable)):
            return False
        return attempt < self.max_attempts

    def delay(self, attempt: int) -> float:
        """Seconds before attempt ``attempt + 1``; jitter spreads retries of many tasks."""
        base = min(self.max_backoff, self.backoff * (2 ** max(0, attempt - 1)))
        return float(base * (1 - self.jitter * random.random()))


@dataclass
class ToolContext:
    """What a running tool may know and do besides its arguments."""

    task_id: str
    tool: str
    idempotency_key: str
    attempt: int
    fence: int = 0
    """The lease's fencing token, larger for every worker that takes the task over (R13).
    Fencing protects tether's store; a provider that ignores idempotency keys can protect
    itself the same way: record the largest token seen per key (in ``reconcile`` too) and
    refuse a call that brings a smaller one. That stops a worker paused past its lease (a
    zombie) from acting after another worker took the call over."""
    resources: list[Resource] = field(default_factory=list)
    admitted_at: float | None = None
    """When the call was admitted under the limits its tool declares (None without limits):
    the time a rate limit counts it at, in this worker's clock."""
    tokens: int = 0
    """Set it to the tokens the call used (a model call made inside a tool): a limit of the
    tool's with a token budget counts them."""

    def add_resource(self, kind: str, ref: str, cleanup: str = "on_finish") -> None:
        """Register something outside the snapshot (a temp file, a handle) to check and clean up."""
        if cleanup not in tuple(Cleanup):
            raise ConfigurationError(
                f"cleanup must be on_finish, on_success or keep, got {cleanup!r}"
            )
        self.resources.append(Resource(kind=kind, ref=ref, cleanup=Cleanup(cleanup)))


class Tool:
    """A registered tool. Calling it directly calls the underlying function."""

    def __init__(
        self,
        fn: ToolFn,
        *,
        name: str,
        side_effect: bool,
        idempotent: bool,
        timeout: float | None,
        retry: RetryPolicy,
        interruptible: bool,
        version: str = "1",
        limits: Sequence[str] = (),
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise ConfigurationError(f"tool {name!r} must be an async function")
        if side_effect and idempotent:
            raise ConfigurationError(
                f"tool {name!r}: choose side_effect=True or idempotent=True, not both; a side"
                " effect the service deduplicates by key is idempotent=True"
            )
        if side_effect and interruptible:
            raise ConfigurationError(
                f"tool {name!r}: a side-effecting tool cannot be interruptible: a P0 event"
                " waits for it to return so its outcome is recorded"
            )
        if timeout is not None and timeout <= 0:
            raise ConfigurationError(f"tool {name!r}: timeout must be positive")
        self.fn = fn
        self.name = name
        self.version = str(version)
        """Recorded with every call in the dialog (E8): which code ran it."""
        self.side_effect = side_effect
        self.idempotent = idempotent or not side_effect
        self.timeout = timeout
        self.retry = retry
        self.interruptible = interruptible
        self.limits = tuple(limits)
        """Named limits (``Harness.limit``) each call is admitted under, held while it runs."""
        self.reconcile_fn: ReconcileFn | None = None
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def reconcile(self, fn: ReconcileFn) -> ReconcileFn:
        """Register the hook asked after a crash left this call's outcome unknown.

        It gets the same arguments as the tool and returns the call's result if
        the effect happened, or ``None`` if it never did (then the call runs).
        """
        if not inspect.iscoroutinefunction(fn):
            raise ConfigurationError(f"reconcile hook of tool {self.name!r} must be async")
        self.reconcile_fn = fn
        return fn

    async def __call__(self, ctx: ToolContext, **kwargs: Any) -> Any:
        return await self.fn(ctx, **kwargs)

    async def run(self, ctx: ToolContext, args: dict[str, Any]) -> Any:
        """One attempt, within the tool's timeout (ToolTimeout when it runs out)."""
        try:
            if self.timeout is None:  # most tools: no timer to arm on every call
                return await self.fn(ctx, **args)
            async with asyncio.timeout(self.timeout):
                return await self.fn(ctx, **args)
        except TimeoutError:
            raise ToolTimeout(f"tool {self.name} timed out after {self.timeout}s") from None

    def __repr__(self) -> str:
        kind = "side_effect" if self.side_effect else "idempotent"
        return f"<Tool {self.name} {kind}>"


@dataclass(frozen=True)
class ToolPolicy:
    """How tether treats a tool it did not define itself (a framework agent's tool, an MCP
    server's): what a crash in the middle of it means, and how it is retried. The default
    is the safe one: a tool nothing is known about is taken to have a side effect, so a
    crash mid-call is never followed by a blind repeat."""

    side_effect: bool = True
    idempotent: bool = False
    """A repeat is harmless (a read, or a service that deduplicates by the idempotency key):
    then it is not a side effect for tether's purposes."""
    timeout: float | None = None
    retry: RetryPolicy | None = None
    reconcile: ReconcileFn | None = None
    """Asked after a crash left a side-effecting call's outcome unknown (see Tool.reconcile)."""
    version: str = "1"

    def tool(self, fn: ToolFn, name: str) -> Tool:
        """A tether tool calling *fn* under this policy."""
        tool = Tool(fn, name=name, side_effect=self.side_effect and not self.idempotent,
                    idempotent=self.idempotent, timeout=self.timeout,
                    retry=self.retry or RetryPolicy(), interruptible=False, version=self.version)
        if self.reconcile is not None:
            tool.reconcile(self.reconcile)
        return tool


_running: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar(
    "tether_running_call", default=None)


def current_call() -> ToolContext:
    """The tether call a framework's tool is running in (a PydanticAI or Agents SDK tool,
    which gets its framework's context, not tether's): its idempotency key, task id and
    attempt. Pass the key to the service that carries out the side effect."""
    call = _running.get()
    if call is None:
        raise ConfigurationError("current_call() is only known inside a tool that tether runs")
    return call


@contextlib.contextmanager
def running(ctx: ToolContext) -> Iterator[None]:
    """Make *ctx* the :func:`current_call` while an integration runs a framework's tool."""
    token = _running.set(ctx)
    try:
        yield
    finally:
        _running.reset(token)


KEY_IN_META = "tether.dev/idempotency-key"
"""Where a call's idempotency key travels in an MCP request's ``_meta``, so a server that
deduplicates by it does (``tether.integrations.mcp``, and MCP toolsets on PydanticAI agents)."""

CALL_IDS = frozenset({"tool_call_id", "call_id"})
"""Arguments a framework integration adds to name the model's call: not part of what the
call does, so the same call planned twice compares equal without them."""


def what_it_does(args: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments without the framework's call ids (see :data:`CALL_IDS`)."""
    return {name: value for name, value in args.items() if name not in CALL_IDS}


def args_hash(tool: str, args: Any) -> str:
    """A stable hash of a call's tool and arguments: the identity an idempotency record checks (E3)."""
    data = orjson.dumps([tool, args], option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hashlib.sha256(data).hexdigest()[:32]


def idempotency_key(task_id: str, frame_id: str, step: int, salt: str = "") -> str:
    """The key of the call planned at *step* of a frame: same across retries and recoveries.

    Built from position, never from the attempt number (a retry must reuse the
    key so the service it calls can deduplicate).
    """
    return f"{task_id}:{frame_id}:{step}{salt}"


_VOLATILE = re.compile(r"0x[0-9a-f]+|[0-9a-f]{8,}|\d+", re.IGNORECASE)


def failure_fingerprint(tool: str, error: BaseException | str) -> str:
    """Identify a failure so the same one seen again stops the retrying (R22).

    Numbers and hex ids are masked, so "timeout after 30.2s (req 8f3a...)" and
    "timeout after 30.9s (req 77b1...)" count as one failure.
    """
    text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else error
    normalised = _VOLATILE.sub("#", text)[:500]
    digest = hashlib.sha256(f"{tool}|{normalised}".encode()).hexdigest()[:12]
    return f"{tool}:{digest}"


TRACEBACK_CHARS = 4000
"""The most of a traceback kept with a failure: its end, where the error was raised."""


def traceback_text(error: BaseException) -> str:
    """*error* with its traceback, as a person debugging it reads it (files, lines, the
    code), cut to its last :data:`TRACEBACK_CHARS` characters."""
    text = "".join(traceback.format_exception(error)).rstrip()
    if len(text) <= TRACEBACK_CHARS:
        return text
    return "... (earlier frames left out)\n" + text[-TRACEBACK_CHARS:]


def describe_error(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__

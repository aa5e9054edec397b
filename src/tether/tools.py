"""Tools: registration, retry policy, idempotency keys and failure fingerprints (R10, R15, R22).

A tool declares what a crash in the middle of it means. ``side_effect=True``
says the outside world may have changed: such a call is never repeated
blindly; after a crash its ``reconcile`` hook is asked what happened, and
without one the task goes to a person. ``idempotent=True`` (the default for
tools without side effects) says running it again with the same key is safe.

A tool is an ``async def`` or a plain ``def``. A plain one runs in a thread of its own,
under the same key, timeout and retry rules; a thread cannot be cancelled, so such a tool
is never interruptible, and one that runs past its timeout may still be running (see
:meth:`Tool.run`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import hashlib
import inspect
import logging
import random
import re
import threading
import traceback
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from tether.errors import ConfigurationError, NotRetryable, OutcomeUnknown, ToolTimeout
from tether.model import Cleanup, Resource

ToolFn = Callable[..., Any]
"""A tool's function, ``fn(ctx, **args)``: an ``async def``, or a plain ``def`` that tether
runs in a thread."""
ReconcileFn = Callable[..., Awaitable[Any]]
HookFn = TypeVar("HookFn", bound=Callable[..., Any])

log = logging.getLogger("tether.tools")

ABANDONED_KEPT = 1024
"""Threads of side-effecting sync calls whose attempt ended before they did (a timeout, a
cut-off), kept per tool by key so the next attempt of that key takes their outcome instead
of running the tool a second time; the oldest are forgotten beyond this many."""


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
    """A registered tool. Calling it directly calls the underlying function.

    *fn* is an ``async def`` or a plain ``def``; a plain one runs in a thread (see
    :meth:`run`). *repeatable* says a side-effecting call may be made again with the same
    arguments in one task (a status ping, a message that may go twice): without it, a call
    identical to one that already succeeded is held for a person (``max_identical_side_effects``).
    """

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
        repeatable: bool = False,
    ) -> None:
        if not callable(fn):
            raise ConfigurationError(f"tool {name!r} must be a function (`async def` or `def`),"
                                     f" not {type(fn).__name__}")
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
        if interruptible and not is_async(fn):
            raise ConfigurationError(
                f"tool {name!r} is a plain function (`def`), which tether runs in a thread of"
                " its own, and a thread cannot be cancelled: a sync tool cannot be"
                " interruptible (a P0 event lands when it returns). Make it `async def` to"
                " have a P0 event cut it off, or drop interruptible=True"
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
        self.repeatable = repeatable
        """An identical side-effecting call (same arguments) may run again in one task."""
        self.limits = tuple(limits)
        """Named limits (``Harness.limit``) each call is admitted under, held while it runs."""
        self.reconcile_fn: ReconcileFn | None = None
        self._abandoned: dict[str, concurrent.futures.Future[Any]] = {}
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    @property
    def fn(self) -> ToolFn:
        return self._fn

    @fn.setter
    def fn(self, fn: ToolFn) -> None:
        self._fn = fn
        self.sync = not is_async(fn)
        """A plain ``def``: each call runs in a thread of its own."""

    def reconcile(self, fn: HookFn) -> HookFn:
        """Register the hook asked after a crash left this call's outcome unknown.

        It gets the same arguments as the tool and returns the call's result if
        the effect happened, or ``None`` if it never did (then the call runs). It is
        checked here, not at crash time: a function that can be called as
        ``hook(ctx, **args)`` for every call of the tool (see :func:`check_hook`). An
        ``async def`` is awaited; a plain ``def`` runs in a thread, like a sync tool.
        """
        required, optional, any_keyword = keyword_arguments(self.fn)
        arguments = _arguments_text(self.fn)
        check_hook(fn, self.name, f"`async def hook{arguments}` (or a plain `def hook{arguments}`,"
                   " run in a thread)", required, optional, any_keyword=any_keyword, sync_ok=True)
        self.reconcile_fn = fn if is_async(fn) else in_thread(fn, f"reconcile hook of {self.name}")
        return fn

    async def __call__(self, ctx: ToolContext, **kwargs: Any) -> Any:
        if self.sync:
            return await asyncio.wrap_future(_start_thread(self.fn, (ctx,), kwargs, self.name))
        return await self.fn(ctx, **kwargs)

    async def run(self, ctx: ToolContext, args: dict[str, Any]) -> Any:
        """One attempt, within the tool's timeout (ToolTimeout when it runs out).

        A sync tool runs in a thread of its own (a daemon thread, so one that never returns
        cannot keep the process from exiting), with the caller's context variables. The
        timeout ends the attempt, not the thread: past it the call is reported exactly as an
        async tool's (``ToolTimeout``; for a side effect, outcome unknown: its reconcile hook
        or a person), while the thread may still be running. So that a later attempt of the
        same side-effecting call (its hook or a person said it never happened) cannot run it
        a second time beside it, that attempt takes the earlier thread's outcome: it waits
        for the thread still running, or uses the result it returned since. Only an error
        raised by that thread lets the tool run again.
        """
        try:
            if self.sync:
                return await self._run_in_thread(ctx, args)
            if self.timeout is None:  # most tools: no timer to arm on every call
                return await self.fn(ctx, **args)
            async with asyncio.timeout(self.timeout):
                return await self.fn(ctx, **args)
        except TimeoutError:
            raise ToolTimeout(f"tool {self.name} timed out after {self.timeout}s") from None

    async def _run_in_thread(self, ctx: ToolContext, args: dict[str, Any]) -> Any:
        key = ctx.idempotency_key
        work = self._abandoned.pop(key, None)
        if work is not None and work.done() and work.exception() is not None:
            work = None  # the earlier attempt failed, and knows it: this one may run
        if work is None:
            work = _start_thread(self.fn, (ctx,), args, f"{self.name} {key}")
        else:
            log.warning("tool %s key %s: an earlier attempt's thread ran past the attempt's end;"
                        " this attempt takes its outcome instead of running the tool again",
                        self.name, key)
        try:
            if self.timeout is None:
                return await asyncio.wrap_future(work)
            async with asyncio.timeout(self.timeout):
                return await asyncio.wrap_future(work)
        except (TimeoutError, asyncio.CancelledError):
            if not self.idempotent:  # it may still change the world: the next attempt waits
                self._abandoned[key] = work
                while len(self._abandoned) > ABANDONED_KEPT:
                    del self._abandoned[next(iter(self._abandoned))]
            if not work.done():
                log.warning("tool %s key %s: the attempt ended (%s) while its thread still runs;"
                            " a thread cannot be stopped", self.name, key,
                            f"timeout {self.timeout}s" if self.timeout else "cut off")
            raise

    def __repr__(self) -> str:
        kind = "side_effect" if self.side_effect else "idempotent"
        return f"<Tool {self.name} {kind}{' sync' if self.sync else ''}>"


def is_async(fn: Any) -> bool:
    """Whether calling *fn* gives a coroutine to await: an ``async def`` (or a partial of one),
    or an object whose ``__call__`` is one. Anything else is called in a thread."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None))  # noqa: B004 (an object with an async __call__)


def in_thread(fn: Callable[..., Any], label: str) -> Callable[..., Awaitable[Any]]:
    """*fn* as an async function: each call runs it in a thread of its own (see
    :func:`_start_thread`); *label* names it in the thread's name and in errors."""

    @functools.wraps(fn)
    async def threaded(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.wrap_future(_start_thread(fn, args, kwargs, label))

    return threaded


def _start_thread(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
                  label: str) -> concurrent.futures.Future[Any]:
    """Run ``fn(*args, **kwargs)`` in a new daemon thread, with a copy of the caller's context
    variables (the running span, :func:`current_call`); the future has its outcome.

    A thread of its own, not a pool's: a call that never returns holds no slot other calls
    wait for, and a daemon thread does not keep the process from exiting (a pool's threads
    are joined at exit). The future is running from the start, so cancelling a wait on it
    (a timeout) never cancels it: it always gets the thread's outcome."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    future.set_running_or_notify_cancel()
    context = contextvars.copy_context()

    def work() -> None:
        try:
            result = context.run(fn, *args, **kwargs)
            if inspect.isawaitable(result):
                close = getattr(result, "close", None)
                if callable(close):
                    close()  # never awaited: nothing of it ran
                raise NotRetryable(f"{label}: a plain function returned"
                                   f" {type(result).__name__}, something to await, which a"
                                   " thread cannot; declare it `async def` so tether awaits it")
        except Exception as error:
            future.set_exception(error)
        except BaseException as error:  # SystemExit, KeyboardInterrupt: stopped part-way
            future.set_exception(OutcomeUnknown(f"{label} was stopped in its thread by"
                                                f" {type(error).__name__}"))
        else:
            future.set_result(result)

    threading.Thread(target=work, name=f"tether: {label}", daemon=True).start()
    return future


# ---------------------------------------------------------------------- checking hooks

_KEYWORDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def keyword_arguments(fn: Callable[..., Any]) -> tuple[list[str], list[str], bool]:
    """What a call of *fn* as ``fn(ctx, **args)`` may pass: the arguments every call has
    (no default), the ones it may have, and whether any other keyword may come
    (``**kwargs``). The first parameter is the context."""
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError):  # no signature to read (a builtin): anything may come
        return [], [], True
    required = [p.name for p in params if p.kind in _KEYWORDS and p.default is p.empty]
    optional = [p.name for p in params if p.kind in _KEYWORDS and p.default is not p.empty]
    return required, optional, any(p.kind is p.VAR_KEYWORD for p in params)


def hook_misfit(hook: Callable[..., Any], required: Sequence[str], optional: Sequence[str] = (),
                *, any_keyword: bool = False) -> str | None:
    """Why *hook* cannot be called as ``hook(ctx, **args)`` for every call that passes all of
    *required*, any of *optional* (and, with *any_keyword*, any other keyword); None when it
    can. Two trial bindings decide it: with every argument, and with the required ones only
    (a call in between binds whenever both do)."""
    try:
        signature = inspect.signature(hook)
    except (TypeError, ValueError):  # nothing to read: it cannot be judged before it runs
        return None
    params = list(signature.parameters.values())
    if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                            inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            inspect.Parameter.VAR_POSITIONAL):
        return "it takes no context as its first, positional argument"
    if any_keyword and not any(p.kind is p.VAR_KEYWORD for p in params):
        return "the tool takes any keyword (**kwargs), so the hook must take **kwargs too"
    every = [*required, *optional]
    for names, which in ((every, "every argument the tool takes"),
                         (required, "only the arguments every call has")):
        try:
            signature.bind(object(), **dict.fromkeys(names))
        except TypeError as error:
            listed = f" ({', '.join(names)})" if names else " (none)"
            return f"called with {which}{listed}, it fails: {error}"
    return None


def check_hook(hook: Any, tool: str, expected: str, required: Sequence[str],
               optional: Sequence[str] = (), *, any_keyword: bool = False,
               role: str = "reconcile hook", sync_ok: bool = False) -> None:
    """Refuse, when it is registered, a hook that tether could not call the way it will:
    ``hook(ctx, **args)``, awaited, for every call of *tool*. The error names the tool, the
    signature tether expects (*expected*, as written in the message) and the one given (a
    sync function is named as such: tether's hooks are awaited). With *sync_ok* a plain
    function is accepted too (the caller runs it in a thread, :func:`in_thread`); its
    arguments are checked the same way."""
    name = hook_name(hook)
    if not callable(hook):
        raise ConfigurationError(f"{role} of tool {tool!r} must be"
                                 f" {'a function' if sync_ok else 'an async function'}"
                                 f" ({expected}); {type(hook).__name__} {hook!r:.60} was given")
    if not sync_ok and not inspect.iscoroutinefunction(hook):
        raise ConfigurationError(f"{role} {name} of tool {tool!r} must be an async function"
                                 f" ({expected}); a sync function was given:"
                                 f" `{signature_text(hook)}`; tether awaits its hooks, so make"
                                 " it `async def`")
    why = hook_misfit(hook, required, optional, any_keyword=any_keyword)
    if why is not None:
        raise ConfigurationError(f"{role} {name} of tool {tool!r} cannot be called the way"
                                 f" tether calls it ({why}): tether expects {expected}; it was"
                                 f" given `{signature_text(hook)}`")


def signature_text(fn: Callable[..., Any]) -> str:
    """``async def name(params)``, as *fn* was written (for messages about hooks)."""
    kind = "async def" if inspect.iscoroutinefunction(fn) else "def"
    return f"{kind} {getattr(fn, '__name__', type(fn).__name__)}{_arguments_text(fn)}"


class _AsWritten(str):
    """An annotation kept as text (``from __future__ import annotations``), shown unquoted."""

    def __repr__(self) -> str:
        return str(self)


def _arguments_text(fn: Callable[..., Any]) -> str:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return "(...)"
    params = [p.replace(annotation=_AsWritten(p.annotation)) if isinstance(p.annotation, str)
              else p for p in signature.parameters.values()]
    return str(signature.replace(parameters=params, return_annotation=inspect.Signature.empty))


def hook_name(hook: Any) -> str:
    """A hook's name as messages quote it (``Class.method``; a nested function by its name)."""
    name = getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None)
    return repr(str(name or type(hook).__name__).rpartition("<locals>.")[2])


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
    repeatable: bool = False
    """The same side-effecting call (same arguments) may be made again in one task without a
    person (see :class:`Tool`)."""

    def tool(self, fn: ToolFn, name: str) -> Tool:
        """A tether tool calling *fn* under this policy."""
        tool = Tool(fn, name=name, side_effect=self.side_effect and not self.idempotent,
                    idempotent=self.idempotent, timeout=self.timeout,
                    retry=self.retry or RetryPolicy(), interruptible=False, version=self.version,
                    repeatable=self.repeatable)
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

CALL_IDS = frozenset({"tool_call_id", "call_id", "interrupt_id"})
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

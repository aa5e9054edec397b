"""An application's lifespans: what the CLI worker and ``serve`` enter before the workers run
and leave after they drain (MCP sessions, HTTP clients, database pools; issue 27).

``@harness.lifespan`` registers an async generator function of the harness that yields once.
Entering is counted per harness, so nested users (``serve`` with a worker, a test's own
``async with``) share one entry. Every lifespan is entered and left in one asyncio task of its
own, as anyio task groups and MCP sessions require, whichever task asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from tether.errors import ConfigurationError, LifespanFailed
from tether.tools import describe_error

LifespanOpener = Callable[[Any], AbstractAsyncContextManager[Any]]
"""What a registered lifespan is made into: called with the harness, it gives the context."""


class Lifespans:
    """A harness's app lifespans, and the count of those inside them (see
    :meth:`tether.Harness.lifespan_context`). *harness* is what each lifespan is given;
    *log* says what raised."""

    def __init__(self, harness: object, log: logging.Logger) -> None:
        self._harness = harness
        self._log = log
        self._registered: list[tuple[str, LifespanOpener, object]] = []
        self._users = 0
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self._owner: tuple[asyncio.Task[None], asyncio.Event] | None = None

    def register(self, fn: object) -> None:
        opener, name = _lifespan_opener(fn)
        if any(given is fn for _, _, given in self._registered):
            raise ConfigurationError(f"lifespan {name!r} is already registered")
        if self._owner is not None:
            raise ConfigurationError(
                f"lifespan {name!r} is registered while this harness's lifespans are entered"
                " (a worker runs): register every lifespan before the workers start")
        self._registered.append((name, opener, fn))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self._registered)

    @property
    def entered(self) -> bool:
        return self._owner is not None

    def _the_lock(self) -> asyncio.Lock:
        """One lock per event loop (a module-level harness may serve several in turn)."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:
            self._lock = (loop, asyncio.Lock())
        return self._lock[1]

    @asynccontextmanager
    async def context(self) -> AsyncIterator[None]:
        async with self._the_lock():
            if self._users == 0 and self._registered:
                await self._start()
            self._users += 1
        try:
            yield
        except BaseException:  # the workers' own error stays the one raised
            with contextlib.suppress(LifespanFailed):  # logged, and said by the log only
                await self._leave()
            raise
        await self._leave()

    async def _leave(self) -> None:
        async with self._the_lock():
            self._users -= 1
            if self._users == 0 and self._owner is not None:
                owner, release = self._owner
                self._owner = None
                release.set()
                await asyncio.shield(owner)  # raises LifespanFailed if an exit raised

    async def _start(self) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        release = asyncio.Event()
        owner = asyncio.create_task(self._own(ready, release), name="tether lifespans")
        try:
            await ready
        except BaseException as error:  # an enter raised, or this caller was cancelled
            if isinstance(error, asyncio.CancelledError):
                owner.cancel()  # stop an enter in flight; the entered ones are still left
            with contextlib.suppress(BaseException):  # exits that raised are logged already
                await owner
            raise
        self._owner = (owner, release)

    async def _own(self, ready: asyncio.Future[None], release: asyncio.Event) -> None:
        """Enter every lifespan, wait to be released, leave them: all in this one task."""
        entered: list[tuple[str, AbstractAsyncContextManager[Any]]] = []
        try:
            for name, opener, _ in self._registered:
                try:
                    manager = opener(self._harness)
                    await manager.__aenter__()
                except Exception as error:
                    self._log.error("lifespan %r raised on enter", name, exc_info=error)
                    failed = LifespanFailed(
                        f"lifespan {name!r} raised on enter ({describe_error(error)}): the"
                        " workers did not start and no task was claimed")
                    failed.__cause__ = error
                    if not ready.done():
                        ready.set_exception(failed)
                    return
                entered.append((name, manager))
            if not ready.done():
                ready.set_result(None)
            await release.wait()
        finally:
            await self._leave_all(entered)

    async def _leave_all(self, entered: list[tuple[str, AbstractAsyncContextManager[Any]]]) -> None:
        """Leave *entered* in reverse, each whatever the others did; then raise
        LifespanFailed naming every one that raised."""
        failures: list[tuple[str, Exception]] = []
        for name, manager in reversed(entered):
            try:
                await manager.__aexit__(None, None, None)
            except Exception as error:
                self._log.error("lifespan %r raised on exit", name, exc_info=error)
                failures.append((name, error))
        if failures:
            said = "; ".join(f"lifespan {name!r} raised on exit ({describe_error(error)})"
                             for name, error in failures)
            raise LifespanFailed(f"{said}, after the workers had stopped") from failures[0][1]


def _lifespan_opener(fn: object) -> tuple[LifespanOpener, str]:
    """What ``@harness.lifespan`` takes, checked when it is registered: an async generator
    function of the harness (or one made into a context manager already); its name."""
    target = inspect.unwrap(fn) if callable(fn) else fn
    name = _lifespan_name(target)
    shape = ("@harness.lifespan takes an async generator function of the harness that yields"
             " once (async def life(h): <start>; yield; <stop>)")
    if not callable(fn):
        what = "an async context manager" if hasattr(fn, "__aenter__") else "not a function"
        hint = ("; enter it from one: @h.lifespan async def life(h): async with it: yield"
                if hasattr(fn, "__aenter__") else "")
        raise ConfigurationError(f"{shape}; got {_given(fn)}, {what}{hint}")
    if not inspect.isasyncgenfunction(target):
        what = ("a coroutine function (async def without a yield): add the yield between"
                " starting and stopping" if inspect.iscoroutinefunction(target) else
                "a generator function: make it async def" if inspect.isgeneratorfunction(target)
                else "neither an async generator function nor one wrapped by"
                " contextlib.asynccontextmanager")
        raise ConfigurationError(f"{shape}; got {name!r}, {what}")
    signature = inspect.signature(fn)
    try:
        signature.bind(object())
    except TypeError:
        takes = signature.replace(return_annotation=inspect.Signature.empty)
        raise ConfigurationError(f"{shape}; {name!r} takes {takes}: it must take one argument,"
                                 " the harness") from None
    if inspect.isasyncgenfunction(fn):
        return asynccontextmanager(fn), name
    return fn, name  # made by asynccontextmanager (or alike): it returns the context manager


def _lifespan_name(fn: object) -> str:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(qualname, str):
        return _given(fn)
    qualname = qualname.replace(".<locals>", "")
    return f"{module}.{qualname}" if module else qualname


def _given(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."

"""``@harness.lifespan`` in one process: what it takes, when it is entered and left, and what
a lifespan that raises does (R17: the harness starts and cleans up around the agents).

The processes that run it (``tether worker``, ``tether serve --with-worker``) are tested in
``tests/integration/test_cli_lifespan.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import tether as tt

pytestmark = pytest.mark.timeout(60)


class Calls(tt.Agent):
    async def plan(self, task: tt.TaskView) -> tt.Action:
        if task.last_tool_result is None:
            return tt.ToolCall("record", {})
        return tt.Finish("done")


def app(log: list[str]) -> tt.Harness:
    h = tt.Harness("memory://")

    @h.tool(side_effect=True)
    async def record(ctx: tt.ToolContext) -> str:
        log.append(f"call {ctx.task_id}")
        return "recorded"

    h.add_agent("calls", Calls())
    return h


def named(log: list[str], name: str, *, fail: str = "") -> Any:
    async def life(h: tt.Harness) -> AsyncIterator[None]:
        if fail == "enter":
            raise RuntimeError(f"{name} cannot start")
        log.append(f"enter {name}")
        yield
        log.append(f"exit {name}")
        if fail == "exit":
            raise RuntimeError(f"{name} cannot stop")

    life.__qualname__ = life.__name__ = name
    return life


# ---------------------------------------------------------------------- what it takes


async def _coroutine(h: tt.Harness) -> None:
    return None


def _generator(h: tt.Harness) -> Iterator[None]:
    yield


async def _no_argument() -> AsyncIterator[None]:
    yield


class _Manager:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None

    def __repr__(self) -> str:
        return "<_Manager>"


@pytest.mark.parametrize(("given", "said"), [
    (_coroutine, "got 'test_lifespan._coroutine', a coroutine function (async def without a"
                 " yield)"),
    (_generator, "got 'test_lifespan._generator', a generator function: make it async def"),
    (_no_argument, "'test_lifespan._no_argument' takes (): it must take one argument, the"
                   " harness"),
    (_Manager(), "got <_Manager>, an async context manager; enter it from one"),
    ("life", "got 'life', not a function"),
    (len, "got 'builtins.len', neither an async generator function nor one wrapped by"
          " contextlib.asynccontextmanager"),
])
def test_r17_a_lifespan_of_the_wrong_shape_is_refused_when_registered(given: Any, said: str) -> None:
    """R17: ``@harness.lifespan`` takes an async generator function of the harness; anything
    else is a ConfigurationError at registration, naming what was given and what it is."""
    h = tt.Harness("memory://")
    with pytest.raises(tt.ConfigurationError) as refused:
        h.lifespan(given)
    assert "@harness.lifespan takes an async generator function of the harness" in str(refused.value)
    assert said in str(refused.value)
    assert h.lifespans == ()


def test_r17_the_same_lifespan_twice_is_refused() -> None:
    h = tt.Harness("memory://")
    life = named([], "life")
    assert h.lifespan(life) is life  # the decorator gives the function back
    with pytest.raises(tt.ConfigurationError) as refused:
        h.lifespan(life)
    assert str(refused.value) == "lifespan 'test_lifespan.life' is already registered"


async def test_r17_lifespans_are_entered_in_order_and_left_in_reverse_around_the_run() -> None:
    """R17: ``run_until_idle`` enters the lifespans (a plain async generator function and one
    made by ``contextlib.asynccontextmanager``) before the first call and leaves them, in
    reverse, after the last."""
    log: list[str] = []
    h = app(log)
    h.lifespan(named(log, "first"))

    @h.lifespan
    @contextlib.asynccontextmanager
    async def second(h: tt.Harness) -> AsyncIterator[None]:
        log.append("enter second")
        try:
            yield
        finally:
            log.append("exit second")

    assert h.lifespans == ("test_lifespan.first",
                           "test_lifespan.test_r17_lifespans_are_entered_in_order_and_left_in"
                           "_reverse_around_the_run.second")
    task_id = await h.submit("calls")
    await h.run_until_idle()
    assert log == ["enter first", "enter second", f"call {task_id}", "exit second", "exit first"]
    assert not h.lifespan_entered
    await h.close()


# ---------------------------------------------------------------------- when it is entered


async def test_r17_entering_is_counted_per_harness() -> None:
    """R17: inside ``lifespan_context()`` the workers share the one entry; outside it, each
    ``run_until_idle`` enters and leaves on its own."""
    log: list[str] = []
    h = app(log)
    h.lifespan(named(log, "life"))
    async with h.lifespan_context():
        assert h.lifespan_entered
        await h.run_until_idle()
        async with h.lifespan_context():
            await h.run_until_idle()
        assert h.lifespan_entered  # the inner block left, the outer one holds them
        assert log == ["enter life"]
    assert log == ["enter life", "exit life"]
    assert not h.lifespan_entered
    await h.run_until_idle()
    await h.run_until_idle()
    assert log == ["enter life", "exit life"] * 3
    await h.close()


async def test_r17_a_harness_without_lifespans_enters_nothing() -> None:
    log: list[str] = []
    h = app(log)
    async with h.lifespan_context():
        assert not h.lifespan_entered
        await h.submit("calls", task_id="t1")
        await h.run_until_idle()
    assert log == ["call t1"]
    await h.close()


async def test_r17_registering_a_lifespan_while_they_are_entered_is_refused() -> None:
    h = tt.Harness("memory://")
    h.lifespan(named([], "life"))
    async with h.lifespan_context():
        with pytest.raises(tt.ConfigurationError, match="register every lifespan before the"
                                                        " workers start"):
            h.lifespan(named([], "late"))
    assert h.lifespans == ("test_lifespan.life",)


async def test_r17_a_lifespan_is_left_in_the_task_that_entered_it() -> None:
    """R17: the lifespans are entered and left in one task of their own, so one holding an
    anyio task group (as the MCP SDK's transports do) may be left by whichever user of the
    harness leaves last, in another task than the first user's."""
    anyio = pytest.importorskip("anyio")
    log: list[str] = []
    h = tt.Harness("memory://")

    @h.lifespan
    async def grouped(h: tt.Harness) -> AsyncIterator[None]:
        async with anyio.create_task_group():
            log.append("enter")
            yield
        log.append("exit")

    first_in, second_in, first_out = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with h.lifespan_context():
            first_in.set()
            await second_in.wait()
        first_out.set()

    async def second() -> None:
        await first_in.wait()
        async with h.lifespan_context():
            second_in.set()
            await first_out.wait()  # the first user has left: this one leaves last

    await asyncio.gather(first(), second())
    assert log == ["enter", "exit"]
    assert not h.lifespan_entered


# ---------------------------------------------------------------------- a lifespan that raises


async def test_r17_a_lifespan_that_raises_on_enter_leaves_the_others_and_claims_nothing() -> None:
    """R17: a lifespan that raises on enter: those entered before it are left, in reverse, the
    ones after it are never entered, no task is claimed, and ``LifespanFailed`` names it
    (the error itself is its cause)."""
    log: list[str] = []
    h = app(log)
    for life in (named(log, "a"), named(log, "b"), named(log, "broken", fail="enter"),
                 named(log, "never")):
        h.lifespan(life)
    task_id = await h.submit("calls")
    with pytest.raises(tt.LifespanFailed) as failed:
        await h.run_until_idle()
    assert str(failed.value) == ("lifespan 'test_lifespan.broken' raised on enter (RuntimeError:"
                                 " broken cannot start): the workers did not start and no task"
                                 " was claimed")
    assert isinstance(failed.value.__cause__, RuntimeError)
    assert log == ["enter a", "enter b", "exit b", "exit a"]
    record = (await h.get(task_id)).record
    assert record.status is tt.Status.PENDING and record.lease_owner is None
    assert not h.lifespan_entered
    await h.close()


async def test_r17_a_lifespan_that_raises_on_exit_does_not_keep_the_others_from_leaving(
        caplog: pytest.LogCaptureFixture) -> None:
    """R17: lifespans that raise on exit are each logged with their traceback; every other
    one is still left; then ``LifespanFailed`` names all that raised."""
    log: list[str] = []
    h = app(log)
    for life in (named(log, "a", fail="exit"), named(log, "b"), named(log, "c", fail="exit")):
        h.lifespan(life)
    task_id = await h.submit("calls")
    with pytest.raises(tt.LifespanFailed) as failed:
        await h.run_until_idle()
    assert str(failed.value) == (
        "lifespan 'test_lifespan.c' raised on exit (RuntimeError: c cannot stop); lifespan"
        " 'test_lifespan.a' raised on exit (RuntimeError: a cannot stop), after the workers had"
        " stopped")
    assert log == ["enter a", "enter b", "enter c", f"call {task_id}", "exit c", "exit b",
                   "exit a"]
    logged = [r for r in caplog.records if "raised on exit" in r.getMessage()]
    assert [r.exc_info is not None for r in logged] == [True, True]
    assert (await h.get(task_id)).record.status is tt.Status.COMPLETED
    await h.close()


async def test_r17_a_run_cancelled_while_a_lifespan_enters_leaves_those_entered() -> None:
    """R17: a run cancelled (by its caller, or by ``run_until_idle``'s *timeout*, which
    covers the lifespans too) while a lifespan's enter hangs: that enter is cancelled, the
    lifespans entered before it are left, and nothing stays entered."""
    log: list[str] = []
    h = app(log)
    h.lifespan(named(log, "a"))
    reached = asyncio.Event()

    @h.lifespan
    async def stuck(h: tt.Harness) -> AsyncIterator[None]:
        reached.set()
        try:
            await asyncio.Event().wait()  # never set
        except asyncio.CancelledError:
            log.append("stuck cancelled")
            raise
        yield

    run = asyncio.create_task(h.run_until_idle(timeout=3600))
    await reached.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert log == ["enter a", "stuck cancelled", "exit a"]
    assert not h.lifespan_entered
    await h.close()


async def test_r17_an_error_of_the_block_is_not_hidden_by_a_lifespan_that_raises_on_exit(
        caplog: pytest.LogCaptureFixture) -> None:
    """R17: when the workers stop on an error of their own (a damaged store, say), that error
    is the one raised; a lifespan that also raises on exit is logged, and still left."""
    log: list[str] = []
    h = tt.Harness("memory://")
    h.lifespan(named(log, "a", fail="exit"))
    with pytest.raises(ValueError, match="the workers' own error"):
        async with h.lifespan_context():
            raise ValueError("the workers' own error")
    assert log == ["enter a", "exit a"]
    assert any("'test_lifespan.a' raised on exit" in r.getMessage() for r in caplog.records)
    assert not h.lifespan_entered

"""Sync tools: a plain ``def`` runs in a thread of its own, under the same key, timeout and
retry rules as an ``async def`` (R10, R12, R17, E1).

These tests drive :class:`tether.tools.Tool` directly; the end-to-end ones, on a real
harness and store, are in tests/acceptance/test_r01_r10_r17_sync_tools.py. Nothing here
waits for a wall-clock threshold: a blocked tool waits on a ``threading.Event`` the test
sets, and every wait is bounded only so that a bug fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
import threading
from typing import Any

import pytest

from tether.errors import ConfigurationError, NotRetryable, OutcomeUnknown, ToolTimeout
from tether.tools import RetryPolicy, Tool, ToolContext, ToolPolicy, current_call, running

pytestmark = pytest.mark.timeout(30)

BOUND = 10.0
"""How long a blocked tool waits for the test at most (a failing test ends, never hangs)."""


def sync_tool(fn: Any, **overrides: Any) -> Tool:
    options: dict[str, Any] = {"name": "t", "side_effect": False, "idempotent": True,
                               "timeout": None, "retry": RetryPolicy(), "interruptible": False}
    options.update(overrides)
    return Tool(fn, **options)


def ctx(key: str = "task:f0:0", attempt: int = 1) -> ToolContext:
    return ToolContext("task", "t", key, attempt)


class Blocked:
    """A sync tool body that says when it started and waits until the test releases it."""

    def __init__(self, result: Any = "done", raises: Exception | None = None) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.runs: list[str] = []
        self.result = result
        self.raises = raises

    def __call__(self, ctx: ToolContext, **args: Any) -> Any:
        self.runs.append(ctx.idempotency_key)
        self.started.set()
        assert self.release.wait(BOUND), "the test never released the tool"
        if self.raises is not None:
            raise self.raises
        return self.result


async def started(blocked: Blocked) -> None:
    """Wait, without blocking the loop, until the blocked tool's thread is in it."""
    assert await asyncio.to_thread(blocked.started.wait, BOUND)


# --------------------------------------------------------------------------- registration


def test_r17_a_plain_def_is_a_tool_and_says_it_runs_in_a_thread() -> None:
    """R17: a plain ``def`` is accepted (it used to be refused); the tool says it is sync."""
    def lookup(ctx: ToolContext, order: str) -> str:
        return order

    tool = sync_tool(lookup, name="lookup")
    assert tool.sync and tool.fn is lookup and tool.__wrapped__ is lookup
    assert "sync" in repr(tool)

    async def fetch(ctx: ToolContext) -> None:
        return None

    assert not sync_tool(fetch).sync


@pytest.mark.parametrize("side_effect", [False, True])
def test_e1_a_sync_tool_cannot_be_interruptible_and_the_error_says_why(side_effect: bool) -> None:
    """E1/R4: a P0 cuts an interruptible tool by cancelling it; a thread cannot be cancelled,
    so ``interruptible=True`` on a plain ``def`` is refused at registration, saying so."""
    def fetch(ctx: ToolContext) -> None:
        return None

    with pytest.raises(ConfigurationError) as refused:
        sync_tool(fetch, name="fetch", interruptible=True, side_effect=side_effect,
                  idempotent=not side_effect)
    text = str(refused.value)
    assert "'fetch'" in text
    if not side_effect:  # (a side effect is refused first, for its own reason)
        assert "thread cannot be cancelled" in text and "async def" in text


def test_r10_repeatable_is_declared_on_the_tool_and_on_a_policy() -> None:
    """R10/R12: a side effect that may legitimately be made twice says so when registered;
    the default is not repeatable, and a ToolPolicy carries the flag to an integration's tool."""
    def ping(ctx: ToolContext) -> None:
        return None

    assert not sync_tool(ping, side_effect=True, idempotent=False).repeatable
    assert sync_tool(ping, side_effect=True, idempotent=False, repeatable=True).repeatable
    assert ToolPolicy(repeatable=True).tool(ping, "ping").repeatable
    assert not ToolPolicy().tool(ping, "ping").repeatable


# --------------------------------------------------------------------------- running


async def test_r10_a_sync_tool_runs_in_another_thread_with_its_key_and_the_callers_context(
        ) -> None:
    """R10/R17: the tool gets its context (the idempotency key) in a daemon thread that is
    not the event loop's, with the caller's context variables (the running span,
    ``current_call``)."""
    seen: dict[str, Any] = {}
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")

    def refund(ctx: ToolContext, order: str) -> str:
        thread = threading.current_thread()
        seen.update(key=ctx.idempotency_key, thread=thread.ident, daemon=thread.daemon,
                    marker=marker.get(), current=current_call().idempotency_key)
        return f"refunded {order}"

    tool = sync_tool(refund, side_effect=True, idempotent=False)
    marker.set("from the caller")
    call = ctx("task:f0:3")
    with running(call):
        assert await tool.run(call, {"order": "A1"}) == "refunded A1"
        assert seen == {"key": "task:f0:3", "thread": seen["thread"], "daemon": True,
                        "marker": "from the caller", "current": "task:f0:3"}
        assert seen["thread"] != threading.get_ident()
        assert await tool(call, order="B2") == "refunded B2"  # calling it directly, too


async def test_r12_a_sync_tool_past_its_timeout_is_reported_exactly_as_an_async_one() -> None:
    """R12: the attempt ends at the timeout with the same ToolTimeout (and message) as an
    async tool's; the thread is not stopped (it cannot be) and finishes when released."""
    blocked = Blocked()
    tool = sync_tool(blocked, name="slow", timeout=0.05)

    async def slow(ctx: ToolContext) -> None:
        await asyncio.Event().wait()

    async_tool = sync_tool(slow, name="slow", timeout=0.05)
    with pytest.raises(ToolTimeout) as sync_error:
        await tool.run(ctx(), {})
    with pytest.raises(ToolTimeout) as async_error:
        await async_tool.run(ctx(), {})
    assert str(sync_error.value) == str(async_error.value) == "tool slow timed out after 0.05s"
    assert blocked.started.is_set() and not blocked.release.is_set()  # still in the tool
    blocked.release.set()


async def test_r10_a_later_attempt_of_a_side_effect_takes_the_still_running_threads_outcome(
        caplog: pytest.LogCaptureFixture) -> None:
    """R10: a side-effecting sync call that timed out may still be running. The next attempt
    of that key (its hook or a person said it never happened) waits for that thread instead
    of starting a second one beside it: the tool body runs once, and its result is the call's."""
    blocked = Blocked(result="paid once")
    tool = sync_tool(blocked, name="refund", side_effect=True, idempotent=False, timeout=0.05)
    with pytest.raises(ToolTimeout):
        await tool.run(ctx("k1"), {})
    retry = asyncio.ensure_future(sync_tool_run_without_timeout(tool, "k1"))
    await wait_for_log(caplog, "takes its outcome instead of running the tool again")
    blocked.release.set()
    assert await retry == "paid once"
    assert blocked.runs == ["k1"]  # one thread, one payment


async def sync_tool_run_without_timeout(tool: Tool, key: str) -> Any:
    tool.timeout = None  # the retry waits as long as the thread takes
    return await tool.run(ctx(key, attempt=2), {})


async def wait_for_log(caplog: pytest.LogCaptureFixture, text: str) -> None:
    caplog.set_level(logging.WARNING, logger="tether.tools")
    for _ in range(int(BOUND / 0.005)):
        if any(text in record.getMessage() for record in caplog.records):
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never logged: {text}")


async def test_r10_a_later_attempt_uses_the_result_a_late_thread_returned_since() -> None:
    """R10: the thread of a timed-out side-effecting attempt finished before the next attempt
    came: that attempt answers with the late thread's result, and the tool does not run again."""
    blocked = Blocked(result="paid late")
    tool = sync_tool(blocked, name="refund", side_effect=True, idempotent=False, timeout=0.05)
    with pytest.raises(ToolTimeout):
        await tool.run(ctx("late1"), {})
    tool.timeout = None  # the later attempts are not raced against a clock
    blocked.release.set()
    await asyncio.to_thread(thread_named("tether: refund late1").join, BOUND)  # it has returned
    assert await tool.run(ctx("late1", attempt=2), {}) == "paid late"
    assert blocked.runs == ["late1"]
    assert await tool.run(ctx("k2"), {}) == "paid late"  # another key is another call
    assert blocked.runs == ["late1", "k2"]


async def test_r10_a_late_thread_that_failed_lets_the_tool_run_again() -> None:
    """R10: a late thread that raised knows its call failed: the next attempt runs the tool."""
    blocked = Blocked(raises=RuntimeError("the bank said no"))
    tool = sync_tool(blocked, name="refund", side_effect=True, idempotent=False, timeout=0.05)
    with pytest.raises(ToolTimeout):
        await tool.run(ctx("failed1"), {})
    tool.timeout = None  # the later attempts are not raced against a clock
    blocked.release.set()
    await asyncio.to_thread(thread_named("tether: refund failed1").join, BOUND)  # it has raised
    blocked.raises = None
    assert await tool.run(ctx("failed1", attempt=2), {}) == "done"
    assert blocked.runs == ["failed1", "failed1"]


def thread_named(name: str) -> threading.Thread:
    """A sync call's thread, by the name tether gives it (``tether: <tool> <key>``)."""
    found = [thread for thread in threading.enumerate() if thread.name == name]
    assert len(found) == 1, [thread.name for thread in threading.enumerate()]
    return found[0]


async def test_r10_an_idempotent_sync_tool_past_its_timeout_simply_runs_again() -> None:
    """R10: running an idempotent call again is safe, so its retry starts a thread of its own
    (a hung thread does not hold the retry back)."""
    blocked = Blocked()
    tool = sync_tool(blocked, name="fetch", timeout=0.05)
    with pytest.raises(ToolTimeout):
        await tool.run(ctx("k1"), {})
    second = asyncio.ensure_future(sync_tool_run_without_timeout(tool, "k1"))
    for _ in range(int(BOUND / 0.005)):  # the second thread is in the tool too
        if len(blocked.runs) == 2:
            break
        await asyncio.sleep(0.005)
    blocked.release.set()
    assert await second == "done"
    assert blocked.runs == ["k1", "k1"]


async def test_r10_errors_from_a_sync_tool_reach_the_retry_rules_unchanged() -> None:
    """R10/R22: what the tool raises is what the runner sees (NotRetryable stops retries);
    a thread stopped by SystemExit is an outcome unknown, not a success."""
    def refuses(ctx: ToolContext) -> None:
        raise NotRetryable("bad order")

    def exits(ctx: ToolContext) -> None:
        sys.exit(3)

    with pytest.raises(NotRetryable, match="bad order"):
        await sync_tool(refuses).run(ctx(), {})
    with pytest.raises(OutcomeUnknown, match="stopped in its thread by SystemExit"):
        await sync_tool(exits, name="exits").run(ctx(), {})


async def test_r17_a_plain_function_that_returns_a_coroutine_is_told_to_be_async() -> None:
    """R17: a ``def`` that returns something to await (a decorated coroutine) cannot be
    awaited in a thread; the call fails for good, saying to declare it ``async def``, and the
    coroutine is closed (nothing of it ran)."""
    ran: list[str] = []

    async def body() -> None:
        ran.append("ran")

    def wrapped(ctx: ToolContext) -> Any:
        return body()

    with pytest.raises(NotRetryable, match="declare it `async def`"):
        await sync_tool(wrapped, name="wrapped").run(ctx(), {})
    assert ran == []


# --------------------------------------------------------------------------- reconcile hooks


async def test_r10_a_sync_reconcile_hook_is_accepted_and_runs_in_a_thread() -> None:
    """R10: a plain ``def`` reconcile hook is accepted (a sync tool's natural companion) and
    awaited in a thread, like a sync tool."""
    def refund(ctx: ToolContext, order: str, amount: int = 1) -> str:
        return "paid"

    threads: list[int | None] = []

    def found(ctx: ToolContext, order: str, amount: int = 1) -> dict[str, Any]:
        threads.append(threading.get_ident())
        return {"order": order, "key": ctx.idempotency_key}

    tool = sync_tool(refund, name="refund", side_effect=True, idempotent=False)
    assert tool.reconcile(found) is found
    assert tool.reconcile_fn is not None and tool.reconcile_fn is not found
    assert await tool.reconcile_fn(ctx("k9"), order="A1") == {"order": "A1", "key": "k9"}
    assert threads and threads[0] != threading.get_ident()


def test_r10_a_sync_reconcile_hook_is_checked_like_an_async_one() -> None:
    """R10: a sync hook that cannot take every call of the tool is refused at registration,
    with the same message an async one gets (naming the tool, what tether calls and what was
    given)."""
    def refund(ctx: ToolContext, order: str, amount: int = 1) -> str:
        return "paid"

    def missing_amount(ctx: ToolContext, order: str) -> None:
        return None

    tool = sync_tool(refund, name="refund", side_effect=True, idempotent=False)
    with pytest.raises(ConfigurationError) as refused:
        tool.reconcile(missing_amount)
    text = str(refused.value)
    assert "tool 'refund'" in text and "got an unexpected keyword argument 'amount'" in text
    assert "given `def missing_amount(ctx: ToolContext, order: str)`" in text
    assert tool.reconcile_fn is None

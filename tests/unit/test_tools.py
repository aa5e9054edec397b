"""Tools: idempotency keys, args hashes, failure fingerprints, retries, registration (R10, R22, E1, E3)."""

from __future__ import annotations

from typing import Any

import pytest

from tether.errors import ConfigurationError, NotRetryable, ToolTimeout
from tether.tools import (
    RetryPolicy,
    Tool,
    ToolContext,
    ToolPolicy,
    args_hash,
    failure_fingerprint,
    idempotency_key,
)


async def _noop(ctx: ToolContext, **kwargs: Any) -> Any:
    return {"got": kwargs, "key": ctx.idempotency_key}


def _tool(fn: Any = _noop, **overrides: Any) -> Tool:
    options: dict[str, Any] = {"name": "t", "side_effect": False, "idempotent": True, "timeout": None,
                               "retry": RetryPolicy(), "interruptible": False}
    options.update(overrides)
    return Tool(fn, **options)


# --------------------------------------------------------------------------- idempotency keys


def test_idempotency_key_is_position_not_attempt() -> None:
    """R10: the key names the call's position; every retry and recovery reuses it."""
    key = idempotency_key("task1", "frameA", 3)
    assert key == idempotency_key("task1", "frameA", 3)
    assert "task1" in key and "frameA" in key
    assert key != idempotency_key("task1", "frameA", 4)
    assert key != idempotency_key("task1", "frameB", 3)
    assert key != idempotency_key("task2", "frameA", 3)


def test_idempotency_key_salt_makes_a_new_call() -> None:
    """E4: an explicit redo after rollback salts the key, so the call is not the recorded one."""
    plain = idempotency_key("task1", "frameA", 3)
    salted = idempotency_key("task1", "frameA", 3, "~redo1")
    assert salted != plain and salted.startswith(plain)


def test_args_hash_ignores_key_order() -> None:
    """E3: the same arguments in another order are the same call."""
    first = args_hash("refund", {"order": "o-1", "amount": 10, "meta": {"a": 1, "b": [1, 2]}})
    second = args_hash("refund", {"meta": {"b": [1, 2], "a": 1}, "amount": 10, "order": "o-1"})
    assert first == second
    assert len(first) == 32 and all(c in "0123456789abcdef" for c in first)


def test_args_hash_differs_for_other_args_or_tool() -> None:
    """E3: another amount, or another tool, is a different call."""
    base = args_hash("refund", {"order": "o-1", "amount": 10})
    assert base != args_hash("refund", {"order": "o-1", "amount": 11})
    assert base != args_hash("refund", {"order": "o-2", "amount": 10})
    assert base != args_hash("charge", {"order": "o-1", "amount": 10})
    assert args_hash("t", {"items": [1, 2]}) != args_hash("t", {"items": [2, 1]})


# --------------------------------------------------------------------------- fingerprints


def test_fingerprint_masks_numbers_and_hex_ids() -> None:
    """R22: the same failure with other timings and request ids is one failure."""
    first = failure_fingerprint("fetch", "timeout after 30.2s (req 8f3a9b2c1d4e)")
    second = failure_fingerprint("fetch", "timeout after 30.9s (req 77b1aa09ee3f)")
    assert first == second
    assert failure_fingerprint("fetch", "bad pointer 0xDEADBEEF") == \
        failure_fingerprint("fetch", "bad pointer 0x1f")
    assert first.startswith("fetch:")


def test_fingerprint_separates_different_failures() -> None:
    """R22: a different message, tool or error type is a different failure."""
    base = failure_fingerprint("fetch", "timeout after 30s")
    assert base != failure_fingerprint("fetch", "connection refused")
    assert base != failure_fingerprint("upload", "timeout after 30s")
    assert failure_fingerprint("fetch", ValueError("bad 1")) == \
        failure_fingerprint("fetch", ValueError("bad 2"))
    assert failure_fingerprint("fetch", ValueError("bad")) != \
        failure_fingerprint("fetch", ToolTimeout("bad"))


# --------------------------------------------------------------------------- retries


def test_retry_delay_grows_exponentially_without_jitter() -> None:
    """R12, R15: bounded retries back off exponentially."""
    policy = RetryPolicy(backoff=0.5, max_backoff=100.0, jitter=0.0)
    assert [policy.delay(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]


def test_retry_delay_respects_max_backoff() -> None:
    """R15: the back-off is capped."""
    policy = RetryPolicy(backoff=1.0, max_backoff=5.0, jitter=0.0)
    assert policy.delay(3) == 4.0
    assert policy.delay(4) == 5.0
    assert policy.delay(50) == 5.0


def test_retry_delay_jitter_stays_within_bounds() -> None:
    """R15: jitter only shortens the delay, by at most the jitter fraction."""
    policy = RetryPolicy(backoff=2.0, max_backoff=10.0, jitter=0.25)
    delays = [policy.delay(2) for _ in range(200)]
    assert all(3.0 <= d <= 4.0 for d in delays)
    assert len(set(delays)) > 1


def test_should_retry_is_bounded_by_max_attempts() -> None:
    """R12: retries stop after max_attempts."""
    policy = RetryPolicy(max_attempts=3)
    error = RuntimeError("flaky")
    assert [policy.should_retry(error, n) for n in (1, 2, 3, 4)] == [True, True, False, False]


def test_not_retryable_stops_retries_at_once() -> None:
    """R15: NotRetryable (or a declared not_retryable type) gives up on the first failure."""
    policy = RetryPolicy(max_attempts=10, not_retryable=(ValueError,))
    assert policy.should_retry(NotRetryable("invalid card"), 1) is False
    assert policy.should_retry(ValueError("bad input"), 1) is False
    assert policy.should_retry(UnicodeError("subclass of ValueError"), 1) is False
    assert policy.should_retry(RuntimeError("flaky"), 1) is True


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"backoff": -1.0}, {"max_backoff": -1.0},
                                    {"jitter": 1.5}, {"jitter": -0.1}])
def test_retry_policy_validation(kwargs: dict[str, Any]) -> None:
    """R12: a nonsensical retry policy is a configuration error."""
    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)


# --------------------------------------------------------------------------- registration


def test_side_effect_tool_cannot_be_interruptible() -> None:
    """E1: a side-effecting call in flight is never cancelled, so it cannot be interruptible."""
    with pytest.raises(ConfigurationError, match="refund"):
        _tool(name="refund", side_effect=True, idempotent=False, interruptible=True)


def test_side_effect_tool_cannot_also_be_idempotent() -> None:
    """R10: a tool is either side-effecting (never repeated blindly) or idempotent, not both."""
    with pytest.raises(ConfigurationError, match="refund"):
        _tool(name="refund", side_effect=True, idempotent=True)


def test_tool_must_be_a_function() -> None:
    """R17: a tool is an async function or a plain one (run in a thread, see
    test_tools_sync.py); anything else is refused when registered, naming the tool."""
    with pytest.raises(ConfigurationError, match="'not_a_tool' must be a function"):
        _tool("refund", name="not_a_tool")


@pytest.mark.parametrize("timeout", [0.0, -1.0])
def test_tool_timeout_must_be_positive(timeout: float) -> None:
    """R12: a tool timeout of zero or less is a configuration error."""
    with pytest.raises(ConfigurationError, match="timeout"):
        _tool(timeout=timeout)


def test_read_only_tool_is_idempotent_and_side_effect_tool_is_not() -> None:
    """R10: a tool without side effects is safe to re-run; a side-effecting one is not."""
    assert _tool(idempotent=False).idempotent is True
    refund = _tool(name="refund", side_effect=True, idempotent=False)
    assert refund.idempotent is False and refund.side_effect is True
    assert "side_effect" in repr(refund)


async def _refund(ctx: ToolContext, order: str, amount: int = 1) -> str:
    return f"refunded {amount} on {order}"


def test_r10_reconcile_hook_must_be_a_function() -> None:
    """R10: the reconcile hook is awaited like the tool (a plain one runs in a thread, see
    test_tools_sync.py); something that cannot be called is refused when it is registered,
    saying what tether calls."""
    tool = _tool(_refund, name="refund", side_effect=True, idempotent=False)

    with pytest.raises(ConfigurationError, match="refund") as refused:
        tool.reconcile("not a hook")
    assert "must be a function (`async def hook(ctx: ToolContext, order: str," in str(
        refused.value)
    assert tool.reconcile_fn is None

    async def hook(ctx: ToolContext, order: str, amount: int = 1) -> None:
        return None

    assert tool.reconcile(hook) is hook
    assert tool.reconcile_fn is hook


async def _missing_amount(ctx: ToolContext, order: str) -> Any:
    return None


async def _needs_more(ctx: ToolContext, order: str, amount: int, note: str) -> Any:
    return None


async def _amount_required(ctx: ToolContext, order: str, amount: int) -> Any:
    return None


async def _no_context(*, order: str, amount: int = 1) -> Any:
    return None


async def _framework_call(ctx: ToolContext, tool_call_id: str, args: dict[str, Any]) -> Any:
    return None


@pytest.mark.parametrize(("hook", "why"), [
    (_missing_amount, "got an unexpected keyword argument 'amount'"),
    (_needs_more, "missing a required argument: 'note'"),
    (_amount_required, "only the arguments every call has (order), it fails: missing a"
                       " required argument: 'amount'"),
    (_no_context, "it takes no context as its first, positional argument"),
    (_framework_call, "missing a required argument: 'tool_call_id'"),
])
def test_r10_a_reconcile_hook_tether_cannot_call_is_refused_when_it_is_registered(
        hook: Any, why: str) -> None:
    """R10 (issue 26): tether calls a hook as ``hook(ctx, **args)`` with the tool's
    arguments; one that cannot take every call of the tool is refused at registration (not
    found at crash time), naming the tool, the signature expected and the one given."""
    tool = _tool(_refund, name="refund", side_effect=True, idempotent=False)
    with pytest.raises(ConfigurationError) as refused:
        tool.reconcile(hook)
    text = str(refused.value)
    assert "tool 'refund'" in text and why in text
    assert "expects `async def hook(ctx: ToolContext, order: str, amount: int = 1)`" in text
    assert f"given `async def {hook.__name__}(" in text
    assert tool.reconcile_fn is None


def test_r10_reconcile_hooks_that_take_every_call_of_the_tool_are_accepted() -> None:
    """R10: a hook with its own defaults, with ``**kwargs``, or with extra optional
    arguments can take every call; a tool with ``**kwargs`` needs a hook with them too."""
    tool = _tool(_refund, name="refund", side_effect=True, idempotent=False)

    async def defaults(ctx: ToolContext, order: str, amount: int = 5) -> Any:
        return None

    async def anything(ctx: ToolContext, **args: Any) -> Any:
        return None

    async def more(ctx: ToolContext, order: str, amount: int = 1, *, note: str = "") -> Any:
        return None

    for hook in (defaults, anything, more):
        assert tool.reconcile(hook) is hook
    loose = _tool(name="loose", side_effect=True, idempotent=False)  # takes **kwargs
    with pytest.raises(ConfigurationError, match=r"tool 'loose'.*must take \*\*kwargs too"):
        loose.reconcile(defaults)
    assert loose.reconcile(anything) is anything


def test_r10_a_tool_policy_and_the_decorator_check_hooks_too() -> None:
    """R10: ``ToolPolicy(reconcile=...)`` and ``@tool.reconcile`` go through the same check."""
    with pytest.raises(ConfigurationError, match=r"tool 'pay'.*_missing_amount"):
        ToolPolicy(reconcile=_missing_amount).tool(_refund, "pay")
    tool = _tool(_refund, name="refund", side_effect=True, idempotent=False)
    with pytest.raises(ConfigurationError, match="tool 'refund'"):
        @tool.reconcile
        async def _(ctx: ToolContext) -> Any:
            return None


async def test_calling_a_tool_calls_its_function() -> None:
    """R10: a tool gets its context (with the idempotency key) and keyword arguments."""
    ctx = ToolContext(task_id="t1", tool="t", idempotency_key="t1:f:0", attempt=1)
    assert await _tool()(ctx, x=1) == {"got": {"x": 1}, "key": "t1:f:0"}


def test_tool_context_resources_and_cleanup_validation() -> None:
    """R8: resources are registered with a cleanup policy; an unknown policy is refused."""
    ctx = ToolContext(task_id="t1", tool="t", idempotency_key="k", attempt=1)
    ctx.add_resource("file", "/tmp/x", cleanup="keep")
    assert [(r.kind, r.ref, r.cleanup) for r in ctx.resources] == [("file", "/tmp/x", "keep")]
    with pytest.raises(ConfigurationError, match="sometimes"):
        ctx.add_resource("file", "/tmp/y", cleanup="sometimes")
    assert len(ctx.resources) == 1

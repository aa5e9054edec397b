"""R13 (issue 19): named limits that tools and agents declare, held through the store, so
they hold across every worker: concurrency, rate, a key per tenant, a 429 closing a limit
for everyone, and tasks held back visible while they wait. (Several worker processes:
``tests/integration/test_shared_limits_processes.py``.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from _support import fast_settings

import tether as tt


def overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans open at any one time."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans],
                   key=lambda edge: (edge[0], edge[1]))
    best = now = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def provider_app(h: tt.Harness, spans: list[tuple[float, float]], *, limits: tuple[str, ...],
                 hold: float = 0.02, admitted: list[float] | None = None) -> None:
    @h.tool(limits=limits)
    async def ask_provider(ctx: tt.ToolContext, n: int) -> int:
        if admitted is not None and ctx.admitted_at is not None:
            admitted.append(ctx.admitted_at)
        start = time.monotonic()
        await asyncio.sleep(hold)
        spans.append((start, time.monotonic()))
        return n

    @h.agent("asker")
    class Asker(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.last_tool_result is None:
                return tt.ToolCall("ask_provider", {"n": t.input["n"]})
            return tt.Finish(t.last_tool_result)


async def test_a_concurrency_limit_holds_across_tasks_and_every_task_finishes() -> None:
    h = tt.Harness("memory://", settings=fast_settings())
    h.limit("provider", concurrency=2)
    spans: list[tuple[float, float]] = []
    provider_app(h, spans, limits=("provider",))
    ids = [await h.submit("asker", {"n": n}) for n in range(12)]
    await h.run_until_idle(concurrency=8, timeout=30)
    assert len(spans) == 12 and overlap(spans) <= 2
    for n, task_id in enumerate(ids):
        assert (await h.get(task_id)).snapshot.result == n  # nothing starved
    await h.close()


async def test_a_rate_limit_admits_no_more_than_its_count_in_any_window() -> None:
    h = tt.Harness("memory://", settings=fast_settings())
    h.limit("provider", per_second=4)
    spans: list[tuple[float, float]] = []
    admitted: list[float] = []
    provider_app(h, spans, limits=("provider",), hold=0.0, admitted=admitted)
    for n in range(10):
        await h.submit("asker", {"n": n})
    await h.run_until_idle(concurrency=10, timeout=30)
    assert len(admitted) == 10
    admitted.sort()
    for i, at in enumerate(admitted):  # any one-second window holds at most four
        assert sum(1 for other in admitted[i:] if other - at < 1.0) <= 4
    await h.close()


async def test_a_limit_with_a_key_is_one_limit_per_tenant() -> None:
    h = tt.Harness("memory://", settings=fast_settings())
    h.limit("tenant", concurrency=1, key=lambda task_input: task_input["tenant"])
    spans: dict[str, list[tuple[float, float]]] = {"acme": [], "globex": []}

    @h.tool(limits=("tenant",))
    async def work(ctx: tt.ToolContext, tenant: str) -> str:
        start = time.monotonic()
        await asyncio.sleep(0.02)
        spans[tenant].append((start, time.monotonic()))
        return tenant

    @h.agent("tenant_job")
    class Job(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.last_tool_result is None:
                return tt.ToolCall("work", {"tenant": t.input["tenant"]})
            return tt.Finish(t.last_tool_result)

    for n in range(8):
        await h.submit("tenant_job", {"tenant": "acme" if n % 2 else "globex"})
    await h.run_until_idle(concurrency=8, timeout=30)
    assert all(overlap(s) == 1 and len(s) == 4 for s in spans.values())
    await h.close()


async def test_a_429_closes_the_limit_for_everyone_and_the_call_runs_again_unfailed() -> None:
    h = tt.Harness("memory://", settings=fast_settings())
    h.limit("provider", concurrency=5)
    calls: list[tuple[int, float]] = []

    @h.tool(side_effect=True, limits=("provider",))
    async def charge(ctx: tt.ToolContext, n: int) -> int:
        calls.append((n, time.monotonic()))
        if len(calls) == 1:
            raise tt.RateLimited(0.5)
        return n

    @h.agent("charger")
    class Charger(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.last_tool_result is None:
                return tt.ToolCall("charge", {"n": t.input["n"]})
            return tt.Finish(t.last_tool_result)

    first = await h.submit("charger", {"n": 0})
    running = asyncio.create_task(h.run_until_idle(timeout=20))
    for _ in range(500):
        if calls:
            break
        await asyncio.sleep(0.01)
    blocked_at = calls[0][1]  # the first call met the 429
    usage = await h.store.limit_usage(time.time())
    assert usage[0].blocked_until is not None
    second = await h.submit("charger", {"n": 1})
    await running
    assert {(await h.get(t)).snapshot.result for t in (first, second)} == {0, 1}
    assert all(at - blocked_at >= 0.45 for _, at in calls[1:])  # nobody called before then
    info = await h.get(first)
    assert info.snapshot.recovery.attempts == 0  # a 429 is not a failure
    assert [r for r in await h.store.list_idempotency(first) if r.status == "failed"] == []
    await h.close()


async def test_a_task_held_back_waits_in_the_store_and_says_why() -> None:
    h = tt.Harness("memory://", settings=fast_settings())
    h.limit("provider", concurrency=1)
    release = asyncio.Event()

    @h.tool(limits=("provider",))
    async def slow(ctx: tt.ToolContext) -> str:
        await release.wait()
        return "done"

    @h.agent("slow_one")
    class SlowOne(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Finish(t.last_tool_result) if t.last_tool_result else tt.ToolCall("slow", {})

    first = await h.submit("slow_one")
    second = await h.submit("slow_one")
    running = asyncio.create_task(h.run_until_idle(concurrency=2, timeout=30))
    for _ in range(400):  # parking says why, then lets the lease go: two transactions
        record = await h.store.get_task(second)
        if record.reason and "held back" in record.reason and record.lease_owner is None:
            break
        await asyncio.sleep(0.01)
    assert record.reason == "held back by limit provider: 1 of 1 in use"
    assert record.lease_owner is None and record.wake_at is not None  # parked, not in memory
    usage = await h.store.limit_usage(time.time())
    assert [(u.in_use, u.waiting) for u in usage] == [(1, 1)]
    release.set()
    await running
    assert (await h.get(second)).snapshot.result == "done"
    assert (await h.store.get_task(second)).reason is None
    assert (await h.get(first)).record.status is tt.Status.COMPLETED
    await h.close()


async def test_an_agent_s_plans_are_admitted_under_its_limits() -> None:
    h = tt.Harness("memory://", settings=fast_settings())
    h.limit("model", concurrency=1)
    spans: list[tuple[float, float]] = []

    @h.agent("thinker")
    class Thinker(tt.Agent):
        limits = ("model",)

        async def plan(self, t: tt.TaskView) -> tt.Action:
            start = time.monotonic()
            await asyncio.sleep(0.02)
            spans.append((start, time.monotonic()))
            return tt.Finish("thought")

    for _ in range(5):
        await h.submit("thinker")
    await h.run_until_idle(concurrency=5, timeout=30)
    assert len(spans) == 5 and overlap(spans) == 1
    await h.close()


def test_a_limit_is_defined_clearly_or_refused_by_name() -> None:
    h = tt.Harness("memory://")
    h.limit("provider", concurrency=8, per_minute=600)
    with pytest.raises(tt.ConfigurationError, match="already defined"):
        h.limit("provider", concurrency=1)
    with pytest.raises(tt.ConfigurationError, match="limits nothing"):
        h.limit("empty")
    with pytest.raises(tt.ConfigurationError, match="one of per_minute"):
        h.limit("both", per_minute=5, per_second=1)
    with pytest.raises(tt.ConfigurationError, match="letters, digits"):
        h.limit("bad name\n", concurrency=1)
    with pytest.raises(tt.ConfigurationError, match="concurrency must be"):
        h.limit("zero", concurrency=0)


async def test_a_limit_declared_but_not_defined_stops_the_task_with_its_name() -> None:
    h = tt.Harness("memory://", settings=fast_settings())
    spans: list[tuple[float, float]] = []
    provider_app(h, spans, limits=("nowhere",))
    task_id = await h.submit("asker", {"n": 1})
    await h.run_until_idle(timeout=10)
    info: Any = await h.get(task_id)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "limit 'nowhere' is declared but not defined" in info.record.reason
    assert spans == []


async def test_a_model_s_429_closes_the_agent_s_limit_for_every_task(tmp_path: Path) -> None:
    """A ChatAgent with limits: the provider's 429 with Retry-After is not waited out by the
    one task that met it; the limit closes for all, and the plan is made again after."""
    from tether.agents.chat import ChatAgent
    from tether.testing.fake_openai import FakeOpenAI, failure, reply

    with FakeOpenAI() as fake:
        fake.add(failure(429, "slow down", headers={"retry-after": "1"}), reply("Done."))
        h = tt.Harness(f"sqlite:///{tmp_path / 'chat.db'}", settings=fast_settings())
        h.limit("openai", concurrency=4)
        h.add_agent("chat", ChatAgent("fake-model", base_url=fake.url, api_key="none",
                                      limits=("openai",)))
        task_id = await h.submit("chat", "hello")
        running = asyncio.create_task(h.run_until_idle(timeout=30))
        blocked = None
        for _ in range(500):
            usage = await h.store.limit_usage(time.time())
            if usage and usage[0].blocked_until:
                blocked = usage[0].blocked_until
                break
            await asyncio.sleep(0.01)
        assert blocked is not None
        record = await h.store.get_task(task_id)
        await running
        info = await h.get(task_id)
        assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == "Done."
        assert fake.completions == 2
        assert info.snapshot.recovery.attempts == 0
        assert record.reason is None or "held back by limit openai" in record.reason
        await h.close()


async def test_a_task_limit_keyed_by_tenant_runs_two_tasks_per_tenant_at_once() -> None:
    """"2 tasks per tenant at once": the limit is held by the task while it runs (not while
    it waits), keyed by the tenant in its input; every task still finishes."""
    h = tt.Harness("memory://", settings=fast_settings())
    h.limit("per-tenant", concurrency=2, key=lambda task_input: task_input["tenant"])
    began: dict[str, float] = {}
    spans: dict[str, list[tuple[float, float]]] = {"acme": [], "globex": []}

    @h.tool()
    async def step(ctx: tt.ToolContext, tenant: str) -> str:
        await asyncio.sleep(0.01)
        return tenant

    @h.agent("tenant_task")
    class TenantTask(tt.Agent):
        task_limits = ("per-tenant",)

        async def plan(self, t: tt.TaskView) -> tt.Action:
            done = t.scratch.setdefault("done", 0)
            began.setdefault(t.task_id, time.monotonic())
            if done < 3:
                t.scratch["done"] = done + 1
                return tt.ToolCall("step", {"tenant": t.input["tenant"]})
            spans[t.input["tenant"]].append((began[t.task_id], time.monotonic()))
            return tt.Finish(done)

    ids = [await h.submit("tenant_task", {"tenant": "acme" if n % 2 else "globex"})
           for n in range(10)]
    await h.run_until_idle(concurrency=10, timeout=30)
    for tenant, seen in spans.items():  # from a task's first plan to its last
        assert len(seen) == 5 and overlap(seen) <= 2, (tenant, overlap(seen))
    assert {(await h.get(t)).snapshot.result for t in ids} == {3}
    await h.close()


async def test_a_token_budget_admits_plans_while_the_window_s_tokens_are_under_it() -> None:
    """"200,000 tokens a minute", small: plans that report 60 tokens each under a budget of
    100 tokens per second; the third plan of a window waits for the window to move on."""
    h = tt.Harness("memory://", settings=fast_settings())
    h.limit("model-tokens", tokens=(100, 1.0))
    planned: list[float] = []

    @h.agent("spender")
    class Spender(tt.Agent):
        limits = ("model-tokens",)

        async def plan(self, t: tt.TaskView) -> tt.Action:
            planned.append(time.monotonic())
            t.record_completion("m", usage={"prompt_tokens": 50, "completion_tokens": 10})
            return tt.Finish("spent")

    for _ in range(3):
        await h.submit("spender")
    await h.run_until_idle(concurrency=1, timeout=30)
    assert len(planned) == 3
    assert planned[2] - planned[0] >= 0.9  # the third waited for the first's tokens to age
    usage = await h.store.limit_usage(time.time())
    assert usage[0].name == "model-tokens"
    await h.close()

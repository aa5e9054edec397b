"""ChatAgent against a real OpenAI-compatible HTTP server on loopback (R1, R8, R18, R22, E1).

The server is ``tether.testing.fake_openai``: scripted per test, counting completions and
keeping every prompt it receives. The real ``openai`` client talks to it over a socket.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from _support import fast_settings, wait_until

import tether as tt
from tether.agents import ChatAgent, RetryPolicy, SQLiteMemory
from tether.agents.schemas import tool_schema
from tether.testing.fake_openai import FakeOpenAI, call, failure, reply


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def harness(tmp_path: Path, fake: FakeOpenAI, **agent: Any) -> tuple[tt.Harness, list[str]]:
    h = tt.Harness(f"sqlite:///{tmp_path / 'chat.db'}", settings=fast_settings())
    refunded: list[str] = []

    @h.tool(idempotent=True)
    async def lookup(ctx: tt.ToolContext, order: str) -> dict[str, Any]:
        """Look an order up."""
        return {"order": order, "paid": 40}

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, order: str, amount: int,
                     reason: Literal["damaged", "late"] = "damaged") -> str:
        """Refund part of an order.

        Only for orders that were paid."""
        refunded.append(ctx.idempotency_key)
        return f"refunded {amount} on {order}"

    h.add_agent("chat", ChatAgent("fake-model", base_url=fake.url, api_key="none",
                                  tools=[lookup, refund], **agent))
    return h, refunded


def test_r08_tool_schemas_come_from_type_hints(tmp_path: Path, fake: FakeOpenAI) -> None:
    h, _ = harness(tmp_path, fake)
    schema = tool_schema(h.tools["refund"])["function"]
    assert schema["name"] == "refund" and schema["description"] == "Refund part of an order."
    params = schema["parameters"]
    assert params["required"] == ["order", "amount"]
    assert params["properties"]["amount"]["type"] == "integer"
    assert params["properties"]["reason"]["enum"] == ["damaged", "late"]


async def test_r08_parallel_tool_calls_each_get_a_resume_point_and_key(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    """R8, R10: one answer with two tool calls: two calls, two keys, one completion for both;
    the next prompt carries both results, linked to their calls."""
    fake.add(reply(tool_calls=[call("lookup", {"order": "A1"}), call("refund",
                                                                        {"order": "A1", "amount": 5})]),
             reply("Refunded 5 on A1."))
    h, refunded = harness(tmp_path, fake)
    tid = await h.submit("chat", "Refund 5 on order A1")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == "Refunded 5 on A1."
    assert fake.completions == 2 and len(refunded) == 1
    keys = [r.key for r in await h.store.list_idempotency(tid)]
    assert len(set(keys)) == 2
    second = fake.requests[1]["messages"]
    assert [m["tool_call_id"] for m in second if m["role"] == "tool"] == [
        m["tool_calls"][0]["id"] for m in second if m.get("tool_calls")]
    assert {m["tool_call_id"] for m in second if m["role"] == "tool"} == set(keys)
    assert fake.requests[0]["tools"][1]["function"]["name"] == "refund"
    await h.close()


async def test_r22_a_model_failing_the_same_way_goes_to_a_person_with_its_error(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    """R22, R26: the model answers 503 "overloaded" again and again. Each plan tries twice
    in-process (the retry policy); then the runner retries once with back-off; the same
    failure again is not retried: needs_human, and the bundle says what the model said.
    (Five are scripted; the fifth is never requested.)"""
    fake.add(*[failure(503, "model overloaded, try later") for _ in range(5)])
    h, _ = harness(tmp_path, fake, retry=RetryPolicy(attempts=2, base=0.001))
    tid = await h.submit("chat", "hello")
    await h.run_until_idle(timeout=10)
    bundle = await h.export(tid)
    assert bundle["task"]["status"] == "needs_human"
    assert "model overloaded, try later" in bundle["reason"]
    assert fake.completions == 4
    await h.close()


async def test_r18_memory_reaches_the_prompt_but_never_the_snapshot(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    memory = SQLiteMemory()
    await memory.add("Customer ACME always gets refunds to store credit")
    await memory.add("Unrelated: the office plant needs water")
    fake.add(reply("Store credit it is."))
    h, _ = harness(tmp_path, fake, memory=memory)
    tid = await h.submit("chat", "How should ACME be refunded?")
    await h.run_until_idle(timeout=10)
    prompt = str(fake.requests[0]["messages"])
    assert "store credit" in prompt
    for version, _, _ in await h.store.list_versions(tid):
        _, head = await h.store.load_head(tid, version)
        assert b"store credit" not in head
    assert "store credit" not in str(await h.history(tid))
    await h.close()


async def test_e1_a_p0_while_the_answer_streams_cuts_it_off_and_keeps_the_partial_text(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    """E1: the model streams slowly; a user interrupt (P0) cancels the request at once, the text
    so far is in the dialog marked cut off, and the next prompt shows the interruption. The
    latency from emit to the pause being committed is reported over 20 runs (not asserted)."""
    h, _ = harness(tmp_path, fake)
    latencies = []
    for run in range(20):
        fake.add(reply("Let me think about this very carefully " * 20, chunks=200,
                       chunk_delay=0.02))
        tid = await h.submit("chat", f"question {run}")
        worker = asyncio.create_task(h.run_until_idle(timeout=30))
        await wait_until(lambda run=run: fake.completions == run + 1, what="the request")
        await asyncio.sleep(0.1)  # some text has streamed
        emitted = time.perf_counter()
        await h.emit(tt.Event("user_interrupt", tid, "stop, wrong customer"))
        await wait_until(lambda tid=tid: _paused(h, tid), timeout=10, what="the pause")
        latencies.append(time.perf_counter() - emitted)
        await worker
    history = await h.history(tid)
    cut = [r for r in history if r.get("cut_off")]
    assert len(cut) == 1 and cut[0]["content"].startswith("Let me think")
    assert len(cut[0]["content"]) < len("Let me think about this very carefully " * 20)
    fake.add(reply("Understood, stopping."))
    await h.resume(tid, message="go on")
    await h.run_until_idle(timeout=10)
    assert "[cut off" in str(fake.requests[-1]["messages"])
    print(f"\nP0 during streaming: emit -> paused and committed, median"
          f" {statistics.median(latencies) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms"
          f" over {len(latencies)} runs")
    await h.close()


async def _paused(h: tt.Harness, tid: str) -> bool:
    return (await h.store.get_task(tid)).status is tt.Status.PAUSED


async def test_r08_a_long_dialog_is_summarised_for_the_model_and_kept_whole_in_the_store(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    """Context budget: once the dialog outgrows ``context_tokens`` the older turns are
    summarised (one extra completion, recorded in scratch); the store keeps every row."""
    steps = 12
    for n in range(steps):
        fake.add(reply(tool_calls=[call("lookup", {"order": f"O{n}" + "x" * 300})]))
    fake.add(reply("All looked up."))
    fake.route = lambda body: reply("SUMMARY: orders looked up so far") \
        if "tools" not in body else None
    h, _ = harness(tmp_path, fake, context_tokens=600, keep_recent=4, stream=False)
    tid = await h.submit("chat", "Look up the orders")
    await h.run_until_idle(timeout=20)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    summaries = [r for r in fake.requests if "tools" not in r]
    assert len(summaries) >= 1
    scratch = info.snapshot.frame.scratch
    assert scratch["summary"] == "SUMMARY: orders looked up so far" and scratch["summary_upto"] > 0
    last = str(fake.requests[-1]["messages"])
    assert "Summary of earlier turns" in last and "O0xxx" not in last
    history = await h.history(tid)
    assert sum(1 for r in history if r.get("role") == "tool") == steps
    await h.close()

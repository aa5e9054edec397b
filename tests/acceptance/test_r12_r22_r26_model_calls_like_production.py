"""Model calls that behave like production traffic (R12, R22, R26, E1; issue 16).

Each test scripts, on the fake OpenAI-compatible server, one thing a real server does that
the happy path never shows: a stream that stalls, an answer cut at the token limit, a
content filter, broken tool arguments, a 429 with ``Retry-After``, a reset connection, a
prompt larger than the context, a model that loops. The real ``openai`` client talks to
the fake over a socket; the store is a real SQLite file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import fast_settings
from click.testing import CliRunner

import tether as tt
from tether.agents import ChatAgent, RequestOptions, RetryPolicy
from tether.cli.main import main
from tether.errors import ConfigurationError
from tether.testing.fake_openai import FakeOpenAI, Reply, call, failure, raw_call, reply
from tether.web.server import render_metrics

NO_WAIT = RetryPolicy(attempts=3, base=0.001)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


class Sleeps:
    """A retry policy's sleep that records what it was asked to wait, and does not wait."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)


def harness(tmp_path: Path, fake: FakeOpenAI, settings: tt.Settings | None = None,
            **agent: Any) -> tuple[tt.Harness, list[str]]:
    h = tt.Harness(f"sqlite:///{tmp_path / 'chat.db'}", settings=settings or fast_settings())
    refunded: list[str] = []

    @h.tool(idempotent=True)
    async def lookup(ctx: tt.ToolContext, order: str) -> dict[str, Any]:
        """Look an order up."""
        return {"order": order, "paid": 40, "notes": ctx.idempotency_key}

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, order: str, amount: int) -> str:
        """Refund part of an order."""
        refunded.append(ctx.idempotency_key)
        return f"refunded {amount} on {order}"

    agent.setdefault("retry", NO_WAIT)
    h.add_agent("chat", ChatAgent("fake-model", base_url=fake.url, api_key="none",
                                  tools=[lookup, refund], **agent))
    return h, refunded


async def run(h: tt.Harness, text: str = "Refund 5 on order A1") -> tuple[str, tt.TaskInfo]:
    tid = await h.submit("chat", text)
    await h.run_until_idle(timeout=20)
    return tid, await h.get(tid)


def model_rows(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [row for row in history if row.get("role") == "model"]


# ---------------------------------------------------------------------------- timeouts


async def test_e1_a_stream_that_stalls_is_a_timeout_not_a_cut(tmp_path: Path,
                                                              fake: FakeOpenAI) -> None:
    """The stream sends its first words, then stalls past the timeout: that is a
    ModelTimeout, retried in-process; no cut-off row, and no partial text in any reason."""
    partial = "PARTIAL-" * 50
    fake.add(Reply(partial + "rest", chunks=2, hang=5.0), reply("Done."))
    h, _ = harness(tmp_path, fake, timeout=0.4)
    tid, info = await run(h)
    assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == "Done."
    history = await h.history(tid)
    assert not [row for row in history if row.get("cut_off")]
    assert await h.reads.recovery_log(tid) == []  # retried in-process, not a recovery
    assert fake.completions == 2
    await h.close()


async def test_r22_timeouts_that_persist_give_a_short_reason(tmp_path: Path,
                                                             fake: FakeOpenAI) -> None:
    fake.add(*[Reply("PARTIAL-" * 500, chunks=2, hang=5.0) for _ in range(4)])
    h, _ = harness(tmp_path, fake, timeout=0.3, retry=RetryPolicy(attempts=2, base=0.001))
    tid, info = await run(h)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    reason = info.record.reason or ""
    assert "did not finish its answer within 0.3s" in reason and "PARTIAL" not in reason
    assert len(reason) < 600
    assert all("PARTIAL" not in str(r) for r in await h.reads.recovery_log(tid))
    assert fake.completions == 4
    await h.close()


# ---------------------------------------------------------------------------- finish reasons


@pytest.mark.parametrize("stream", [True, False])
async def test_r12_an_answer_cut_at_the_token_limit_is_not_taken_as_final(
        tmp_path: Path, fake: FakeOpenAI, stream: bool) -> None:
    fake.add(reply("The refund policy says", finish_reason="length"),
             reply("The refund policy says: yes."))
    h, _ = harness(tmp_path, fake, stream=stream)
    tid, info = await run(h)
    assert info.snapshot.result == "The refund policy says: yes."
    [retry] = await h.reads.recovery_log(tid)
    assert retry["resume_strategy"] == "retry_plan" and "token limit" in retry["detail"]
    assert [r["finish_reason"] for r in model_rows(await h.history(tid))] == ["length", "stop"]
    await h.close()


async def test_r12_a_tool_call_cut_mid_arguments_is_named_as_cut(tmp_path: Path,
                                                                 fake: FakeOpenAI) -> None:
    cut = reply(tool_calls=[raw_call("refund", '{"order": "A1", "amo')], finish_reason="length")
    fake.add(cut, cut)
    h, refunded = harness(tmp_path, fake, options=RequestOptions(max_tokens=12))
    _, info = await run(h)
    assert info.record.status is tt.Status.NEEDS_HUMAN and refunded == []
    assert "cut at the token limit (max_tokens=12)" in (info.record.reason or "")
    assert "not valid JSON" not in (info.record.reason or "")
    assert fake.requests[0]["max_tokens"] == 12
    await h.close()


async def test_r26_a_content_filter_goes_to_a_person_at_once(tmp_path: Path,
                                                            fake: FakeOpenAI) -> None:
    fake.add(reply("", finish_reason="content_filter"), reply("never asked"))
    h, _ = harness(tmp_path, fake)
    _, info = await run(h)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "content filter" in (info.record.reason or "")
    assert fake.completions == 1
    await h.close()


# ---------------------------------------------------------------------------- tool calls


async def test_r22_broken_arguments_are_told_to_the_model_and_valid_calls_kept(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    """One answer: a valid lookup and a refund whose arguments are not JSON. The lookup
    runs; the model is told what was wrong with the refund, as that call's result; it sends
    the refund again, correctly, and it runs once."""
    fake.add(reply(tool_calls=[call("lookup", {"order": "A1"}),
                               raw_call("refund", '{"order": "A1", amount: 5}', "bad_1")]),
             reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})]),
             reply("Refunded."))
    h, refunded = harness(tmp_path, fake)
    tid, info = await run(h)
    assert info.snapshot.result == "Refunded." and len(refunded) == 1
    second = fake.requests[1]["messages"]
    told = [m for m in second if m["role"] == "tool" and m["tool_call_id"] == "bad_1"]
    assert len(told) == 1 and "not valid JSON" in told[0]["content"]
    asked = [m for m in second if m["role"] == "assistant" and m.get("tool_calls")
             and m["tool_calls"][0]["id"] == "bad_1"]
    # replayed as {} (a server such as llama-server refuses arguments that are not JSON);
    # the result quotes what was sent (tests/acceptance/test_r12_r22_replayed_turns_are_valid.py)
    assert asked and asked[0]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert told[0]["content"].endswith('You sent: {"order": "A1", amount: 5}')
    assert any(m.get("tool_call_id") and "paid" in m["content"] for m in second)  # lookup ran
    assert await h.reads.recovery_log(tid) == []
    await h.close()


async def test_r22_unknown_tools_and_arguments_are_told_and_asked_again_at_once(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    fake.add(reply(tool_calls=[call("refund_order", {"order": "A1"})]),
             reply(tool_calls=[call("refund", {"order": "A1", "amount": 5, "why": "late"})]),
             reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})]),
             reply("Refunded."))
    h, refunded = harness(tmp_path, fake)
    tid, info = await run(h)
    assert info.snapshot.result == "Refunded." and len(refunded) == 1
    second = str(fake.requests[1]["messages"])
    assert "there is no tool named 'refund_order'; the tools are: lookup, refund" in second
    assert "unknown why" in str(fake.requests[2]["messages"])
    rows = model_rows(await h.history(tid))
    assert [bool(r.get("rejected")) for r in rows] == [True, True, False, False]
    await h.close()


async def test_r26_a_model_that_keeps_sending_bad_calls_goes_to_a_person(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    fake.add(*[reply(tool_calls=[raw_call("refund", "{")]) for _ in range(4)])
    h, refunded = harness(tmp_path, fake, corrections=2)
    _, info = await run(h)
    assert info.record.status is tt.Status.NEEDS_HUMAN and refunded == []
    assert "cannot be made in 3 answers in a row" in (info.record.reason or "")
    assert fake.completions == 3
    await h.close()


# ---------------------------------------------------------------------------- transient errors


async def test_r12_a_429_waits_what_retry_after_asks_and_is_not_a_recovery(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    sleeps = Sleeps()
    fake.add(failure(429, "slow down", headers={"retry-after": "7"}),
             failure(503, "overloaded"), reply("Done."))
    h, _ = harness(tmp_path, fake, retry=RetryPolicy(attempts=3, base=0.5, sleep=sleeps))
    tid, info = await run(h)
    assert info.snapshot.result == "Done." and fake.completions == 3
    assert 7.0 <= sleeps.asked[0] <= 7.7  # at least what was asked, a little jitter
    assert 0.25 <= sleeps.asked[1] <= 1.0  # our own back-off, jittered
    assert await h.reads.recovery_log(tid) == []
    await h.close()


async def test_r12_a_reset_connection_is_retried(tmp_path: Path, fake: FakeOpenAI) -> None:
    fake.add(Reply(drop=True), reply("Done."))
    h, _ = harness(tmp_path, fake)
    tid, info = await run(h)
    assert info.snapshot.result == "Done." and await h.reads.recovery_log(tid) == []
    await h.close()


async def test_r22_a_retry_after_longer_than_the_limit_is_left_to_recovery(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    sleeps = Sleeps()
    fake.add(failure(429, "quota", headers={"retry-after": "3600"}), reply("Done."))
    h, _ = harness(tmp_path, fake, retry=RetryPolicy(max_retry_after=60, sleep=sleeps))
    tid, info = await run(h)
    assert info.snapshot.result == "Done." and sleeps.asked == []
    [log] = await h.reads.recovery_log(tid)
    assert "asked to wait 3600s" in log["detail"]
    await h.close()


async def test_r22_a_400_is_not_retried_in_process(tmp_path: Path, fake: FakeOpenAI) -> None:
    fake.add(failure(400, "bad request: unknown field"), failure(400, "bad request: unknown field"))
    h, _ = harness(tmp_path, fake)
    _, info = await run(h)
    assert info.record.status is tt.Status.NEEDS_HUMAN and fake.completions == 2
    assert "HTTP 400: bad request: unknown field" in (info.record.reason or "")
    await h.close()


# ---------------------------------------------------------------------------- options


@pytest.mark.parametrize("stream", [True, False])
async def test_r12_request_options_are_sent_and_tool_choice_always_with_tools(
        tmp_path: Path, fake: FakeOpenAI, stream: bool) -> None:
    fake.add(reply("Done."))
    options = RequestOptions(max_tokens=200, temperature=0.0, parallel_tool_calls=False,
                             seed=7, extra_body={"top_k": 1})
    h, _ = harness(tmp_path, fake, options=options, stream=stream)
    await run(h)
    [body] = fake.requests
    assert body["tool_choice"] == "auto" and len(body["tools"]) == 2
    assert (body["max_tokens"], body["temperature"], body["parallel_tool_calls"],
            body["seed"], body["top_k"]) == (200, 0.0, False, 7, 1)
    assert body.get("stream_options") == ({"include_usage": True} if stream else None)
    await h.close()


@pytest.mark.parametrize("bad", [{"tool_choice": "always"}, {"max_tokens": 0},
                                 {"temperature": 3.0}, {"top_p": 0.0}])
def test_r12_bad_request_options_are_refused_by_name(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match=next(iter(bad))):
        RequestOptions(**bad)


# ---------------------------------------------------------------------------- context


async def test_r08_an_oversized_tool_result_is_clipped_for_the_prompt_and_kept_whole(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    """A 40 KB tool result in a dialog whose context is 2,000 tokens: the prompt carries its
    head and tail with a note; the store keeps all of it."""
    h = tt.Harness(f"sqlite:///{tmp_path / 'big.db'}", settings=fast_settings())

    @h.tool(idempotent=True)
    async def fetch(ctx: tt.ToolContext, page: str) -> str:
        """Fetch a page."""
        return "HEAD" + "x" * 40_000 + "TAIL"

    fake.add(reply(tool_calls=[call("fetch", {"page": "p"})]), reply("Read it."))
    h.add_agent("chat", ChatAgent("fake-model", base_url=fake.url, api_key="none",
                                  tools=[fetch], context_tokens=2_000, retry=NO_WAIT))
    tid, info = await run(h, "Read the page")
    assert info.snapshot.result == "Read it."
    [result] = [m for m in fake.requests[1]["messages"] if m["role"] == "tool"]
    assert result["content"].startswith("HEAD") and result["content"].endswith("TAIL")
    assert len(result["content"]) < 2_500 and "characters left out" in result["content"]
    [stored] = [r for r in await h.history(tid) if r.get("role") == "tool"]
    assert len(stored["content"]) == 40_008
    await h.close()


async def test_r08_a_prompt_too_long_for_the_server_shrinks_and_is_asked_again(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    """The server says (as llama.cpp does) that its context is 512 tokens: the agent lowers
    its budget, summarises older turns and asks again, without a recovery."""
    for n in range(6):
        fake.add(reply(tool_calls=[call("lookup", {"order": f"O{n}" + "y" * 200})]))
    overflow = Reply(status=400, error="the request exceeds the available context size,"
                     " try increasing it (n_prompt_tokens=900, n_ctx=512)")
    fake.add(overflow, reply("All done."))
    fake.route = lambda body: reply("SUMMARY") if "tools" not in body else None
    h, _ = harness(tmp_path, fake, stream=False, keep_recent=2)
    tid, info = await run(h, "Look up six orders")
    assert info.snapshot.result == "All done.", info.record.reason
    assert await h.reads.recovery_log(tid) == []
    *_, too_long, last = [r["messages"] for r in fake.requests if "tools" in r]
    assert "Summary of earlier turns: SUMMARY" in str(last)
    assert len(str(last)) < len(str(too_long))
    await h.close()


# ---------------------------------------------------------------------------- loop bounds


async def test_r12_r26_completions_per_task_are_bounded(tmp_path: Path,
                                                        fake: FakeOpenAI) -> None:
    fake.route = lambda body: reply(tool_calls=[call("lookup", {"order": "again"})])
    h, _ = harness(tmp_path, fake, settings=fast_settings(max_completions=5))
    tid, info = await run(h)
    assert info.record.status is tt.Status.NEEDS_HUMAN and fake.completions == 5
    assert "max_completions=5" in (info.record.reason or "")
    assert [r["resume_strategy"] for r in await h.reads.recovery_log(tid)] == ["completion_limit"]
    assert info.snapshot.usage["completions"] == 5
    fake.route = None
    fake.add(reply("Stopped looking."))
    await h.resume(tid, "go on")
    await h.run_until_idle(timeout=10)
    assert (await h.get(tid)).snapshot.result == "Stopped looking."  # a person grants more
    await h.close()


async def test_r12_r26_the_same_refund_asked_again_and_again_stops_at_the_limit(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    fake.route = lambda body: reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})])
    h, refunded = harness(tmp_path, fake, settings=fast_settings(max_identical_side_effects=3))
    tid, info = await run(h)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert len(refunded) == 3 and len(set(refunded)) == 3  # three keys: idempotency alone
    assert "refund with the same arguments a 4th time" in (info.record.reason or "")
    fake.route = None
    fake.add(reply("Four refunds, as you said."))
    await h.resume(tid)  # a plain resume: the held call runs, as planned
    await h.run_until_idle(timeout=10)
    assert len(refunded) == 4
    assert (await h.get(tid)).record.status is tt.Status.COMPLETED
    await h.close()


# ---------------------------------------------------------------------------- usage


@pytest.mark.parametrize("stream", [True, False])
async def test_r02_token_usage_is_recorded_per_completion_and_in_total(
        tmp_path: Path, fake: FakeOpenAI, stream: bool) -> None:
    fake.add(reply(tool_calls=[call("lookup", {"order": "A1"})],
                   usage={"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}),
             reply("Done.", usage={"prompt_tokens": 150, "completion_tokens": 5,
                                   "total_tokens": 155}))
    h, _ = harness(tmp_path, fake, stream=stream)
    tid, info = await run(h)
    rows = model_rows(await h.history(tid))
    assert [(r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"]) for r in rows] == [
        (100, 20), (150, 5)]
    assert [r["finish_reason"] for r in rows] == ["tool_calls", "stop"]
    assert info.snapshot.usage == {"completions": 2, "prompt_tokens": 250,
                                   "completion_tokens": 25}
    bundle = await h.export(tid)
    assert bundle["usage"]["prompt_tokens"] == 250
    metrics = render_metrics(h.counters, {}, 0).decode()
    assert 'tether_model_tokens_total{kind="prompt"} 250.0' in metrics
    assert "tether_model_completions_total 2.0" in metrics
    await h.close()
    env = {"TETHER_STORE": f"sqlite:///{tmp_path / 'chat.db'}"}
    shown = await asyncio.to_thread(CliRunner().invoke, main, ["show", tid], env=env)
    assert "model: 2 completions, 275 tokens (250 prompt, 25 completion)" in shown.output
    dialog = await asyncio.to_thread(CliRunner().invoke, main, ["history", tid], env=env)
    assert "fake-model: stop, 150+5 tokens" in dialog.output

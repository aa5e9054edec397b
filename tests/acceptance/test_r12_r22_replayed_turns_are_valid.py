"""A dialog tether replays is one every OpenAI-compatible server accepts (R8, R12, R22, R26).

Seen against llama.cpp's ``llama-server``: one call of an answer had arguments that were not
JSON; tether told the model (an error as that call's result) but replayed the arguments
verbatim in the assistant turn, and llama-server answered every later request with HTTP 500
("Failed to parse tool call arguments as JSON"): nine completions, then a person. The same
happened to a long, valid argument string clipped for the prompt (a note cut into the
middle of the JSON).

Here the fake server is as strict as llama-server (``FakeOpenAI(parse_arguments=True)``), so
a prompt that replays such arguments is refused just as it was there. The negative controls
put the old replay back and must be refused; the real server is checked in
``tests/realmodel/test_replayed_turns.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import fast_settings

import tether as tt
from tether.agents import ChatAgent, RetryPolicy, prompt
from tether.testing.fake_openai import FakeOpenAI, call, raw_call, reply

NO_WAIT = RetryPolicy(attempts=3, base=0.001)
BROKEN = '{"order": "A1", amount: 5}'
"""A refund's arguments as a model writes them wrongly (an unquoted key)."""


@pytest.fixture
def strict() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(parse_arguments=True) as server:
        yield server


def harness(tmp_path: Path, fake: FakeOpenAI, **agent: Any) -> tuple[tt.Harness, list[str]]:
    h = tt.Harness(f"sqlite:///{tmp_path / 'chat.db'}", settings=fast_settings())
    refunded: list[str] = []

    @h.tool(idempotent=True)
    async def lookup(ctx: tt.ToolContext, order: str) -> dict[str, Any]:
        """Look an order up."""
        return {"order": order, "paid": 40}

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, order: str, amount: int) -> str:
        """Refund part of an order."""
        refunded.append(ctx.idempotency_key)
        return f"refunded {amount} on {order}"

    @h.tool(side_effect=True)
    async def write(ctx: tt.ToolContext, path: str, content: str) -> str:
        """Write a file."""
        return f"wrote {len(content)} characters to {path}"

    agent.setdefault("retry", NO_WAIT)
    h.add_agent("chat", ChatAgent("fake-model", base_url=fake.url, api_key="none",
                                  tools=[lookup, refund, write], **agent))
    return h, refunded


async def run(h: tt.Harness, text: str = "Refund 5 on order A1") -> tuple[str, tt.TaskInfo]:
    tid = await h.submit("chat", text)
    await h.run_until_idle(timeout=20)
    return tid, await h.get(tid)


def replayed(body: dict[str, Any]) -> list[str]:
    """Every ``arguments`` string a request replays."""
    return [c["function"]["arguments"] for m in body["messages"] if m["role"] == "assistant"
            for c in m.get("tool_calls") or []]


def assert_all_objects(fake: FakeOpenAI) -> None:
    """Each replayed call of each request parses, strictly, as a JSON object."""
    for body in fake.requests:
        for arguments in replayed(body):
            assert isinstance(json.loads(arguments), dict), arguments


def the_old_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put back what tether sent before: the text as it came, clipped like any text."""
    monkeypatch.setattr(prompt, "arguments", lambda value, limit: prompt.clip(
        value if isinstance(value, str) else prompt.text(value), limit))


@pytest.mark.parametrize("stream", [True, False])
async def test_r22_one_broken_call_beside_a_valid_one_no_longer_breaks_the_dialog(
        tmp_path: Path, strict: FakeOpenAI, stream: bool) -> None:
    """The llama-server case: a valid lookup and a refund whose arguments are not JSON, in
    one answer. The lookup runs; the refund goes back as ``{}`` with its result saying what
    was wrong and quoting what was sent; the model sends it again and it runs once. Every
    request is accepted, and the dialog row keeps the broken text."""
    strict.add(reply(tool_calls=[call("lookup", {"order": "A1"}), raw_call("refund", BROKEN,
                                                                         "bad_1")]),
               reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})]),
               reply("Refunded."))
    h, refunded = harness(tmp_path, strict, stream=stream)
    tid, info = await run(h)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "Refunded." and len(refunded) == 1
    assert strict.refused == [] and strict.completions == 3
    assert_all_objects(strict)
    second = strict.requests[1]["messages"]
    [asked] = [m for m in second if m["role"] == "assistant" and m.get("tool_calls")
               and m["tool_calls"][0]["id"] == "bad_1"]
    assert asked["tool_calls"][0]["function"] == {"name": "refund", "arguments": "{}"}
    [told] = [m for m in second if m["role"] == "tool" and m["tool_call_id"] == "bad_1"]
    assert "not valid JSON" in told["content"] and "This call was not made." in told["content"]
    assert told["content"].endswith(f"You sent: {BROKEN}")
    [row] = [r for r in await h.history(tid) if r.get("rejected")]
    assert row["rejected"][0]["arguments"] == BROKEN  # kept for people, as it came
    assert await h.reads.recovery_log(tid) == []
    await h.close()


@pytest.mark.parametrize("sent", [BROKEN, '{"order": "A1", "amou', "[1, 2]", "5"])
async def test_r22_an_answer_of_only_broken_calls_is_asked_again_and_accepted(
        tmp_path: Path, strict: FakeOpenAI, sent: str) -> None:
    """No valid call at all: the model is asked again at once, with a prompt the server
    takes, and the task goes on."""
    strict.add(reply(tool_calls=[raw_call("refund", sent, "bad_1")]),
               reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})]),
               reply("Refunded."))
    h, refunded = harness(tmp_path, strict)
    _, info = await run(h)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert len(refunded) == 1 and strict.refused == [] and strict.completions == 3
    assert_all_objects(strict)
    await h.close()


async def test_r08_a_long_valid_argument_is_clipped_as_json(tmp_path: Path,
                                                            strict: FakeOpenAI) -> None:
    """A 40,000-character file written through a tool, in a 2,000-token context: the call is
    replayed within its share of the prompt, as JSON, its keys kept; the store keeps it all."""
    content = "HEAD" + "x" * 40_000 + "TAIL"
    strict.add(reply(tool_calls=[call("write", {"path": "notes.md", "content": content})]),
               reply("Written."))
    h, _ = harness(tmp_path, strict, context_tokens=2_000)
    tid, info = await run(h, "Write the notes")
    assert info.snapshot.result == "Written." and strict.refused == []
    [sent] = replayed(strict.requests[1])
    found = json.loads(sent)
    assert len(sent) <= prompt.ContextBudget(2_000).clip_chars
    assert found["path"] == "notes.md" and found["content"].startswith("HEAD")
    assert found["content"].endswith("TAIL") and "characters left out" in found["content"]
    [stored] = [r["tool_call"] for r in await h.history(tid) if "tool_call" in r]
    assert stored["args"]["content"] == content
    await h.close()


async def test_r08_summary_requests_replay_valid_calls_too(tmp_path: Path,
                                                           strict: FakeOpenAI) -> None:
    """Older turns, a broken call among them, are folded into a summary by completions of
    their own: those requests replay the calls as well, and are accepted."""
    strict.add(reply(tool_calls=[raw_call("refund", BROKEN + "y" * 3_000, "bad_1")]),
               *[reply(tool_calls=[call("lookup", {"order": f"O{n}" + "z" * 600})])
                 for n in range(6)],
               reply("All done."))
    strict.route = lambda body: reply("SUMMARY") if "tools" not in body else None
    h, _ = harness(tmp_path, strict, context_tokens=1_000, keep_recent=2)
    _, info = await run(h, "Look up six orders")
    assert info.snapshot.result == "All done.", info.record.reason
    summaries = [body for body in strict.requests if "tools" not in body]
    assert summaries and any(replayed(body) for body in summaries)
    assert strict.refused == []
    assert_all_objects(strict)
    await h.close()


# ---------------------------------------------------------------------------- negative controls


async def test_r22_r26_control_the_old_replay_is_refused_until_a_person_is_needed(
        tmp_path: Path, strict: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the arguments replayed as they came, the strict server refuses every request
    after the broken answer, as llama-server did: the task ends with a person, naming the
    server's error. (So the tests above would see the defect if it came back.)"""
    the_old_replay(monkeypatch)
    strict.add(reply(tool_calls=[call("lookup", {"order": "A1"}), raw_call("refund", BROKEN,
                                                                         "bad_1")]),
               reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})]),
               reply("Refunded."))
    h, refunded = harness(tmp_path, strict)
    _, info = await run(h)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "Failed to parse tool call arguments as JSON" in (info.record.reason or "")
    assert refunded == [] and strict.completions == 1 + len(strict.refused)
    assert len(strict.refused) >= 2 * NO_WAIT.attempts  # the plan, and its recovery
    await h.close()


async def test_r08_control_the_old_clip_of_a_long_argument_is_refused(
        tmp_path: Path, strict: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    the_old_replay(monkeypatch)
    strict.add(reply(tool_calls=[call("write", {"path": "n.md", "content": "x" * 40_000})]),
               reply("Written."))
    h, _ = harness(tmp_path, strict, context_tokens=2_000)
    _, info = await run(h, "Write the notes")
    assert info.record.status is tt.Status.NEEDS_HUMAN and strict.refused
    await h.close()


# ---------------------------------------------------------------------------- integrations


async def test_r22_the_openai_agents_integration_replays_valid_arguments(
        tmp_path: Path, strict: FakeOpenAI) -> None:
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, function_tool
    from openai import AsyncOpenAI

    from tether.integrations.openai_agents import OpenAIAgentsAgent

    @function_tool
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return f"refunded {amount} on {order}"

    strict.add(reply(tool_calls=[raw_call("refund", BROKEN, "bad_1")]),
               reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})]),
               reply("Refunded."))
    model = OpenAIChatCompletionsModel("fake", AsyncOpenAI(base_url=strict.url, api_key="none",
                                                           max_retries=0))
    h = tt.Harness(f"sqlite:///{tmp_path / 'oa.db'}", settings=fast_settings())
    h.add_agent("support", OpenAIAgentsAgent(
        Agent(name="support", model=model, tools=[refund]), stream=False,
        retry=NO_WAIT, run_config=RunConfig(tracing_disabled=True)))
    tid = await h.submit("support", "Refund 5 on A1")
    await h.run_until_idle(timeout=20)
    info = await h.get(tid)
    await h.close()
    assert strict.refused == []
    assert info.record.status is tt.Status.COMPLETED, info.record.reason

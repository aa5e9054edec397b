"""The fake server's ``parse_arguments`` knob refuses what llama-server refuses (R12, R22).

``FakeOpenAI(parse_arguments=True)`` stands in for llama.cpp's server in the tests of what a
prompt replays; if it accepted a prompt the real server refuses, those tests would pass on
the defect they are named after. So it is checked here through the real ``openai`` client:
a request replaying an assistant tool call whose arguments are not JSON gets HTTP 500 with
llama-server's message, without using up the script; valid JSON (any JSON: llama-server
parses, it does not check for an object) passes; and by default nothing is checked.
(``tests/realmodel/test_replayed_turns.py`` shows the real server refusing the same.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tether.testing.fake_openai import FakeOpenAI, reply, unparsable_arguments


def replaying(arguments: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": "refund A1"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "c1", "type": "function",
                "function": {"name": "refund", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "error: not JSON"}]


@pytest.fixture
async def strict() -> AsyncIterator[tuple[FakeOpenAI, openai.AsyncOpenAI]]:
    with FakeOpenAI(parse_arguments=True) as fake:
        async with openai.AsyncOpenAI(base_url=fake.url, api_key="x", max_retries=0,
                                      timeout=10.0) as client:
            yield fake, client


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("arguments", ['{"order": "A1", amount: 5}', '{"order": "A1"', "",
                                       '{"x": NaN}', "{} {}"])
async def test_r22_a_replayed_call_that_is_not_json_gets_llama_servers_500(
        strict: tuple[FakeOpenAI, openai.AsyncOpenAI], arguments: str, stream: bool) -> None:
    fake, client = strict
    fake.add(reply("never sent"))
    with pytest.raises(openai.InternalServerError) as raised:
        await client.chat.completions.create(model="m", messages=replaying(arguments),
                                             stream=stream)
    assert raised.value.status_code == 500
    assert "Failed to parse tool call arguments as JSON" in str(raised.value)
    assert len(fake.refused) == 1 and fake.completions == 1
    assert len(fake.script) == 1  # refused before any answer: the script is not used up


@pytest.mark.parametrize("arguments", ["{}", '{"order": "A1", "amount": 5}', "[1, 2]", "42"])
async def test_r22_a_replayed_call_that_is_json_is_answered(
        strict: tuple[FakeOpenAI, openai.AsyncOpenAI], arguments: str) -> None:
    fake, client = strict
    fake.add(reply("fine"))
    answer = await client.chat.completions.create(model="m", messages=replaying(arguments))
    assert answer.choices[0].message.content == "fine" and fake.refused == []


async def test_r22_by_default_the_fake_takes_any_arguments() -> None:
    with FakeOpenAI([reply("fine")]) as fake:
        async with openai.AsyncOpenAI(base_url=fake.url, api_key="x", max_retries=0) as client:
            answer = await client.chat.completions.create(model="m",
                                                          messages=replaying("{broken"))
    assert answer.choices[0].message.content == "fine" and fake.refused == []


def test_r22_only_assistant_tool_calls_are_read() -> None:
    body: dict[str, Any] = {"messages": [
        {"role": "user", "content": '{"not": json'},
        {"role": "assistant", "content": "no calls"},
        {"role": "tool", "tool_call_id": "c1", "content": "{broken"}]}
    assert unparsable_arguments(body) is None
    body["messages"].append({"role": "assistant", "tool_calls": [
        {"id": "a", "function": {"name": "f", "arguments": "{}"}},
        {"id": "b", "function": {"name": "f", "arguments": "{"}}]})
    assert (unparsable_arguments(body) or "").startswith(
        "Failed to parse tool call arguments as JSON: ")

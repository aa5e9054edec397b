"""The fake OpenAI server's knobs reach the real ``openai`` client as a real server's would.

Agent tests rely on these knobs to script truncation, rate limits, broken tool arguments,
timeouts and dropped connections; if a knob silently did nothing, those tests would pass
without exercising the error paths they are named after. So each knob is checked here
through the real client over a socket.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam

from tether.testing.fake_openai import DEFAULT_USAGE, FakeOpenAI, call, failure, raw_call, reply

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
BROKEN = '{"order": "A1", "amou'


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def api(fake: FakeOpenAI) -> AsyncIterator[openai.AsyncOpenAI]:
    """A real client with no retries, so each scripted reply is seen exactly once."""
    async with openai.AsyncOpenAI(base_url=fake.url, api_key="x", max_retries=0,
                                  timeout=10.0) as client:
        yield client


async def complete(api: openai.AsyncOpenAI, **kwargs: Any) -> ChatCompletion:
    answer: ChatCompletion = await api.chat.completions.create(model="m", messages=MESSAGES,
                                                               **kwargs)
    return answer


async def stream(api: openai.AsyncOpenAI, **kwargs: Any) -> list[ChatCompletionChunk]:
    answer = await api.chat.completions.create(model="m", messages=MESSAGES, stream=True, **kwargs)
    return [chunk async for chunk in answer]


def finish_reasons(chunks: list[ChatCompletionChunk]) -> list[str | None]:
    return [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]


# finish_reason


async def test_finish_reason_defaults_to_stop_or_tool_calls(
        fake: FakeOpenAI, api: openai.AsyncOpenAI) -> None:
    fake.add(reply("done"), reply(tool_calls=[call("lookup", {"q": 1})]))
    assert (await complete(api)).choices[0].finish_reason == "stop"
    assert finish_reasons(await stream(api))[-1] == "tool_calls"


async def test_a_scripted_finish_reason_passes_through_unstreamed(
        fake: FakeOpenAI, api: openai.AsyncOpenAI) -> None:
    fake.add(reply("cut o", finish_reason="length"))
    answer = await complete(api)
    assert answer.choices[0].finish_reason == "length"
    assert answer.choices[0].message.content == "cut o"


async def test_a_scripted_finish_reason_ends_the_stream(fake: FakeOpenAI, api: openai.AsyncOpenAI) -> None:
    fake.add(reply("I can't", chunks=3, finish_reason="content_filter"))
    reasons = finish_reasons(await stream(api))
    assert reasons[-1] == "content_filter"
    assert reasons[:-1] == [None] * (len(reasons) - 1)


# headers


async def test_a_429_carries_its_scripted_headers(fake: FakeOpenAI, api: openai.AsyncOpenAI) -> None:
    fake.add(failure(429, "slow down", headers={"retry-after": "2"}))
    with pytest.raises(openai.RateLimitError) as caught:
        await complete(api)
    assert caught.value.response.headers["retry-after"] == "2"
    assert "slow down" in str(caught.value)


async def test_headers_are_sent_with_successful_and_streamed_answers(
        fake: FakeOpenAI, api: openai.AsyncOpenAI) -> None:
    fake.add(reply("a", headers={"x-request-id": "r1"}), reply("b", headers={"x-request-id": "r2"}))
    plain = await api.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    streamed = await api.chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, stream=True)
    assert plain.headers["x-request-id"] == "r1"
    assert streamed.headers["x-request-id"] == "r2"
    assert [chunk.choices[0].delta.content async for chunk in streamed.parse()
            if chunk.choices and chunk.choices[0].delta.content] == ["b"]


# usage


async def test_unstreamed_answers_always_carry_usage(fake: FakeOpenAI, api: openai.AsyncOpenAI) -> None:
    fake.add(reply("a"), reply("b", usage={"prompt_tokens": 7, "completion_tokens": 3,
                                           "total_tokens": 10}))
    first, second = await complete(api), await complete(api)
    assert first.usage is not None
    assert (first.usage.prompt_tokens, first.usage.completion_tokens,
            first.usage.total_tokens) == tuple(DEFAULT_USAGE.values()) == (1, 1, 2)
    assert second.usage is not None
    assert (second.usage.prompt_tokens, second.usage.total_tokens) == (7, 10)


async def test_a_stream_has_no_usage_chunk_unless_asked(fake: FakeOpenAI, api: openai.AsyncOpenAI) -> None:
    fake.add(reply("hello", chunks=2, usage={"prompt_tokens": 4, "completion_tokens": 2,
                                             "total_tokens": 6}))
    chunks = await stream(api)
    assert all(chunk.choices and chunk.usage is None for chunk in chunks)


async def test_include_usage_adds_one_choiceless_usage_chunk_after_the_finish(
        fake: FakeOpenAI, api: openai.AsyncOpenAI) -> None:
    fake.add(reply("hello", chunks=2, usage={"prompt_tokens": 4, "completion_tokens": 2,
                                             "total_tokens": 6}))
    chunks = await stream(api, stream_options={"include_usage": True})
    last, before = chunks[-1], chunks[:-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (4, 2)
    assert before[-1].choices[0].finish_reason == "stop"
    assert all(chunk.usage is None for chunk in before)


# raw tool-call arguments


async def test_raw_arguments_arrive_verbatim_unstreamed(fake: FakeOpenAI, api: openai.AsyncOpenAI) -> None:
    fake.add(reply(tool_calls=[raw_call("refund", BROKEN, "call_1")]))
    tool_call = (await complete(api)).choices[0].message.tool_calls[0]  # type: ignore[index]
    assert (tool_call.id, tool_call.function.name) == ("call_1", "refund")  # type: ignore[union-attr]
    assert tool_call.function.arguments == BROKEN  # type: ignore[union-attr]


async def test_streamed_arguments_come_in_pieces_that_reassemble_verbatim(
        fake: FakeOpenAI, api: openai.AsyncOpenAI) -> None:
    fake.add(reply(tool_calls=[raw_call("refund", BROKEN, "call_1"), call("lookup", {"q": "x"})]))
    deltas = [piece for chunk in await stream(api) if chunk.choices
              for piece in chunk.choices[0].delta.tool_calls or []]
    first = [d for d in deltas if d.index == 0]
    assert len(first) >= 2
    assert (first[0].id, first[0].type, first[0].function.name) == (  # type: ignore[union-attr]
        "call_1", "function", "refund")
    assert all(d.id is None and d.function.name is None for d in first[1:])  # type: ignore[union-attr]
    assert "".join(d.function.arguments for d in first) == BROKEN  # type: ignore[union-attr,misc]
    second = "".join(d.function.arguments for d in deltas if d.index == 1)  # type: ignore[union-attr,misc]
    assert second == '{"q": "x"}'


async def test_short_arguments_are_streamed_whole(fake: FakeOpenAI, api: openai.AsyncOpenAI) -> None:
    fake.add(reply(tool_calls=[raw_call("ping", "{}", "call_2")]))
    deltas = [piece for chunk in await stream(api) if chunk.choices
              for piece in chunk.choices[0].delta.tool_calls or []]
    assert len(deltas) == 1
    assert deltas[0].function is not None and deltas[0].function.arguments == "{}"


# drop


async def test_a_dropped_connection_is_a_connection_error_and_the_server_goes_on(
        fake: FakeOpenAI, api: openai.AsyncOpenAI) -> None:
    fake.add(reply(drop=True), reply("back"))
    with pytest.raises(openai.APIConnectionError) as caught:
        await complete(api)
    assert not isinstance(caught.value, openai.APITimeoutError)
    assert (await complete(api)).choices[0].message.content == "back"
    assert fake.completions == 2


# hang


async def test_a_hanging_answer_times_the_client_out(fake: FakeOpenAI, api: openai.AsyncOpenAI) -> None:
    fake.add(reply("too late", hang=1.0))
    with pytest.raises(openai.APITimeoutError):
        await complete(api, timeout=0.2)


async def test_a_hanging_stream_sends_its_first_chunk_then_times_out(
        fake: FakeOpenAI, api: openai.AsyncOpenAI) -> None:
    fake.add(reply("first second", chunks=2, hang=60.0))  # far past the read timeout
    answer = await api.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                               timeout=httpx.Timeout(30.0, read=3.0))
    received: list[str | None] = []
    with pytest.raises(openai.APITimeoutError):
        async for chunk in answer:
            received.append(chunk.choices[0].delta.content)
    assert received == ["first "]


async def test_a_hang_shorter_than_the_timeout_only_delays(fake: FakeOpenAI, api: openai.AsyncOpenAI) -> None:
    fake.add(reply("late", hang=0.3))
    started = time.monotonic()
    answer = await complete(api)
    assert answer.choices[0].message.content == "late"
    assert time.monotonic() - started >= 0.3


# request headers


async def test_request_headers_are_recorded_alongside_the_bodies(
        fake: FakeOpenAI, api: openai.AsyncOpenAI) -> None:
    fake.add(reply("a"), reply("b"))
    await complete(api)
    await api.chat.completions.create(model="m2", messages=MESSAGES,
                                      extra_headers={"X-Trace": "t2"})
    assert len(fake.request_headers) == len(fake.requests) == 2
    assert [body["model"] for body in fake.requests] == ["m", "m2"]
    assert all(h["authorization"] == "Bearer x" for h in fake.request_headers)
    assert "x-trace" not in fake.request_headers[0]
    assert fake.request_headers[1]["x-trace"] == "t2"

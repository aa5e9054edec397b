"""How model calls read a provider's answers and errors (R12, R22; issue 16).

Errors are built as the ``openai`` client builds them from a real HTTP response, so the
headers and bodies are parsed exactly as they would be in production.
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

import httpx2
import openai
import pytest

from tether.agents import prompt
from tether.agents.model_calls import (
    AnswerCut,
    ContextOverflow,
    ModelTimeout,
    RequestOptions,
    RetryPolicy,
    check_finish,
    context_overflow,
    describe,
    retry_after,
    transient,
)
from tether.engine.limits import _ordinal
from tether.errors import NeedsPerson


def status_error(status: int, body: Any = None, headers: dict[str, str] | None = None
                 ) -> openai.APIStatusError:
    request = httpx2.Request("POST", "http://model/v1/chat/completions")
    response = httpx2.Response(status, json=body, headers=headers or {}, request=request)
    client = openai.OpenAI(api_key="x", base_url="http://model/v1")
    error: openai.APIStatusError = client._make_status_error_from_response(response)
    return error


@pytest.mark.parametrize(("status", "retried"), [(429, True), (408, True), (409, True),
                                                 (500, True), (502, True), (503, True),
                                                 (400, False), (401, False), (404, False),
                                                 (422, False)])
def test_r12_which_statuses_are_worth_waiting_for(status: int, retried: bool) -> None:
    assert transient(status_error(status, {"error": {"message": "x"}})) is retried


def test_r12_resets_and_timeouts_are_transient() -> None:
    request = httpx2.Request("POST", "http://model/v1/chat/completions")
    assert transient(openai.APIConnectionError(request=request))
    assert transient(openai.APITimeoutError(request=request))
    assert transient(ModelTimeout("slow"))
    assert not transient(ValueError("bug"))


@pytest.mark.parametrize(("headers", "seconds"), [
    ({"retry-after": "7"}, 7.0), ({"retry-after": "1.5"}, 1.5),
    ({"retry-after-ms": "250"}, 0.25), ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
    ({"retry-after": "soon"}, None), ({"retry-after": "-3"}, None), ({"retry-after": "nan"}, None),
    ({}, None)])
def test_r12_retry_after_is_read_in_every_form(headers: dict[str, str],
                                               seconds: float | None) -> None:
    assert retry_after(status_error(429, {}, headers)) == seconds


def test_r12_retry_after_as_an_http_date() -> None:
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    waited = retry_after(status_error(429, {}, {"retry-after": later}))
    assert waited is not None and 25 <= waited <= 31


def test_r12_our_backoff_doubles_with_jitter_and_never_undercuts_retry_after() -> None:
    policy = RetryPolicy(base=1.0, cap=5.0)
    for _ in range(200):
        assert 0.5 <= policy.delay(1, None) <= 1.0
        assert 2.0 <= policy.delay(3, None) <= 4.0
        assert 2.5 <= policy.delay(9, None) <= 5.0  # capped
        assert 7.0 <= policy.delay(1, 7.0) <= 7.7


@pytest.mark.parametrize(("body", "tokens"), [
    ({"error": {"code": 400, "message": "the request exceeds the available context size, try"
                " increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 900,
                "n_ctx": 512}}, 512),  # llama.cpp
    ({"error": {"message": "This model's maximum context length is 8192 tokens. However, you"
                " requested 9000 tokens.", "type": "invalid_request_error",
                "code": "context_length_exceeded"}}, 8192),  # OpenAI
    ({"object": "error", "message": "This model's maximum context length is 4096 tokens."
      " However, your messages resulted in 5000 tokens.", "type": "BadRequestError"},
     4096),  # vLLM
    ({"error": {"message": "prompt is too long: context window exceeded"}}, None)])
def test_r08_context_overflow_is_recognised_with_the_servers_size(body: dict[str, Any],
                                                                  tokens: int | None) -> None:
    overflow = context_overflow(status_error(400, body))
    assert isinstance(overflow, ContextOverflow) and overflow.context_tokens == tokens


def test_r08_other_bad_requests_are_not_overflows() -> None:
    assert context_overflow(status_error(400, {"error": {"message": "unknown field top_k"}})) is None
    assert context_overflow(status_error(500, {"error": {"message": "context size"}})) is None


def test_r22_a_provider_error_is_described_briefly() -> None:
    text = describe(status_error(503, {"error": {"message": "overloaded " * 100}}))
    assert text.startswith("HTTP 503: overloaded") and len(text) < 320


def test_r12_finish_reasons_that_are_not_an_ending() -> None:
    check_finish("stop", "m", RequestOptions())
    check_finish("tool_calls", "m", RequestOptions())
    with pytest.raises(AnswerCut, match="max_tokens=5"):
        check_finish("length", "m", RequestOptions(max_tokens=5))
    with pytest.raises(NeedsPerson, match="content filter"):
        check_finish("content_filter", "m", RequestOptions())


def test_r12_options_leave_out_what_was_not_set() -> None:
    assert RequestOptions().fields([], stream=False) == {}
    sent = RequestOptions(stop=("END",), stream_usage=False).fields([{"t": 1}], stream=True)
    assert sent == {"tools": [{"t": 1}], "tool_choice": "auto", "stop": ["END"], "stream": True}


def test_r08_clipping_keeps_head_and_tail_and_says_how_much_was_left_out() -> None:
    text = "A" * 1000 + "B" * 1000
    clipped = prompt.clip(text, 300)
    assert clipped.startswith("A" * 200) and clipped.endswith("B" * 100)
    assert "1,700 characters left out" in clipped
    assert prompt.clip("short", 300) == "short"


def test_r08_summaries_take_the_oldest_rows_that_fit_half_the_budget() -> None:
    rows = [{"role": "user", "content": "x" * 400} for _ in range(10)]  # ~100 tokens each
    assert prompt.oldest_chunk(rows, keep_recent=2, budget=600, limit=10_000) == 2
    assert prompt.oldest_chunk(rows, keep_recent=2, budget=50, limit=10_000) == 1  # at least one
    assert prompt.oldest_chunk(rows, keep_recent=10, budget=600, limit=10_000) == 0


def test_r08_a_budget_learns_from_an_overflow() -> None:
    budget = prompt.ContextBudget(100_000, answer_tokens=500)
    sent = [{"role": "user", "content": "x" * 40_000}]
    budget.learn(ContextOverflow("too long", 8192), sent)
    assert budget.prompt_tokens == int(8192 * 0.8) - 500
    budget.learn(ContextOverflow("too long"), [{"role": "user", "content": "x" * 8_000}])
    assert budget.prompt_tokens < int(8192 * 0.8) - 500


@pytest.mark.parametrize(("n", "text"), [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"),
                                         (11, "11th"), (12, "12th"), (13, "13th"), (21, "21st"),
                                         (22, "22nd"), (111, "111th")])
def test_ordinals_in_reasons(n: int, text: str) -> None:
    assert _ordinal(n) == text

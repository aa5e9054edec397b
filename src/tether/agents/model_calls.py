"""Calling a model the way production traffic needs: options, retries, finish reasons, usage.

Shared by :class:`tether.agents.chat.ChatAgent` and the framework integrations, so every
agent under tether treats a real provider the same way:

- **Request options** (:class:`RequestOptions`) are sent as given, and ``tool_choice`` is
  sent whenever tools are offered: some servers treat its absence as "no tools" and let the
  model invent an answer instead of calling one.
- **Transient errors** (429, 408, 409, 5xx, a reset connection, a timeout) are retried
  in-process with exponential back-off and jitter, waiting at least what ``Retry-After`` asks
  (:class:`RetryPolicy`). Only when the attempts run out does the failure reach the runner,
  where it counts as a recovery (and the same failure twice goes to a person). Anything else
  (400, 401, 404, ...) is not retried here: it will not go away by waiting.
- **A timeout is a timeout** (:class:`ModelTimeout`), never mistaken for a P0 cut, and its
  message stays short: the partial text is not carried into reasons and fingerprints.
- **Finish reasons** are read: ``length`` means the answer was cut by the token limit
  (:class:`AnswerCut`, even when a tool call's arguments were cut mid-way), and
  ``content_filter`` means the provider refused (:class:`tether.NeedsPerson`: re-asking
  the same prompt cannot help).
- **A prompt larger than the server's context** is recognised in the error of vLLM,
  llama.cpp and OpenAI (:class:`ContextOverflow`, with the server's context size when it
  says it), so the agent can shrink its prompt instead of failing the same way again.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tether.errors import (
    ConfigurationError,
    MissingExtra,
    NeedsPerson,
    RateLimited,
    TetherError,
)

try:
    from openai import APIConnectionError, APIStatusError, APITimeoutError, OpenAIError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("model calls need the openai client", "openai") from exc

T = TypeVar("T")

TRANSIENT_STATUS = frozenset({408, 409, 429})
"""Besides every 5xx: the statuses a provider uses for "try again shortly"."""
TOOL_CHOICES = ("auto", "none", "required")


class ModelError(TetherError):
    """The model call failed; the runner retries it with back-off, a repeat goes to a person."""


class ModelTimeout(ModelError):
    """The model did not answer (or finish streaming) within the timeout."""


class ModelUnavailable(ModelError):
    """The provider kept failing with transient errors through every in-process retry."""


class AnswerCut(ModelError):
    """The answer stopped at the token limit (``finish_reason="length"``): it is not final,
    and a tool call in it may be cut mid-arguments. Raise ``max_tokens``, or let a person
    look."""


class ContextOverflow(ModelError):
    """The prompt is larger than the server's context window."""

    def __init__(self, message: str, context_tokens: int | None = None) -> None:
        super().__init__(message)
        self.context_tokens = context_tokens
        """The server's context size, when its error says it."""


@dataclass(frozen=True)
class RequestOptions:
    """Fields sent with every chat-completions request (None: not sent, the server decides)."""

    tool_choice: str | Mapping[str, Any] = "auto"
    """Sent whenever tools are offered: "auto", "none", "required", or a specific function."""
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    stream_usage: bool = True
    """Ask for token usage in streamed answers (``stream_options.include_usage``)."""
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    """Provider-specific fields, merged into the request body as they are."""

    def __post_init__(self) -> None:
        if isinstance(self.tool_choice, str) and self.tool_choice not in TOOL_CHOICES:
            raise ConfigurationError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)} or"
                                     f" a function choice, not {self.tool_choice!r}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigurationError("max_tokens must be at least 1")
        if self.temperature is not None and not 0 <= self.temperature <= 2:
            raise ConfigurationError("temperature must be between 0 and 2")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigurationError("top_p must be above 0 and at most 1")

    def fields(self, tools: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
        """The request's keyword arguments beyond model and messages."""
        sent: dict[str, Any] = {}
        if tools:
            sent["tools"] = tools
            sent["tool_choice"] = self.tool_choice
            if self.parallel_tool_calls is not None:
                sent["parallel_tool_calls"] = self.parallel_tool_calls
        for name in ("max_tokens", "temperature", "top_p", "seed"):
            if getattr(self, name) is not None:
                sent[name] = getattr(self, name)
        if self.stop is not None:
            sent["stop"] = list(self.stop)
        if stream:
            sent["stream"] = True
            if self.stream_usage:
                sent["stream_options"] = {"include_usage": True}
        if self.extra_body:
            sent["extra_body"] = dict(self.extra_body)
        return sent


@dataclass(frozen=True)
class RetryPolicy:
    """In-process retries of transient model errors, before they count as a recovery."""

    attempts: int = 4
    """Tries of one request in all, the first included."""
    base: float = 0.5
    """Back-off before the second try, doubled for each further one (then jittered)."""
    cap: float = 30.0
    """Longest back-off of our own choosing."""
    max_retry_after: float = 120.0
    """Longest ``Retry-After`` waited in-process; a provider asking for more gets the failure
    passed to the runner, whose recovery backs off (and frees the worker) instead."""
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, compare=False)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigurationError("RetryPolicy.attempts must be at least 1")
        if min(self.base, self.cap, self.max_retry_after) < 0:
            raise ConfigurationError("RetryPolicy delays cannot be negative")

    def delay(self, retry: int, asked: float | None) -> float:
        """Seconds before retry number *retry* (1 for the first), never earlier than *asked*."""
        if asked is not None:  # a little later than asked, so waiting clients do not stampede
            return asked + random.uniform(0, 0.1 * asked)
        return min(self.cap, self.base * 2.0 ** (retry - 1)) * random.uniform(0.5, 1.0)


async def with_retries(attempt: Callable[[], Awaitable[T]], policy: RetryPolicy,
                       what: str, *, shared: bool = False) -> T:
    """Run *attempt*, retrying transient failures under *policy*; other errors pass at once.
    With *shared* (the agent declares named limits), a 429 is not waited out here: it is
    raised as :class:`RateLimited`, so the limits close for every task until Retry-After."""
    for retry in range(1, policy.attempts + 1):
        try:
            return await attempt()
        except (ModelTimeout, OpenAIError) as error:
            _share_a_429(error, shared, policy, retry, what)
            if not transient(error) or retry == policy.attempts:
                raise _as_model_error(error, what, retry) from None
            await _wait_to_retry(error, policy, retry, what)
        except Exception as error:  # a framework's own error (PydanticAI's ModelHTTPError)
            _share_a_429(error, shared, policy, retry, what)
            if not transient(error) or retry == policy.attempts:
                raise
            await _wait_to_retry(error, policy, retry, what)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _share_a_429(error: Exception, shared: bool, policy: RetryPolicy, retry: int,
                 what: str) -> None:
    status = getattr(error, "status_code", None) or getattr(error.__cause__, "status_code", None)
    if shared and status == 429:
        asked = retry_after(error)
        raise RateLimited(asked if asked is not None else policy.delay(retry, None),
                          f"{what}: the provider answered 429 ({describe(error)})") from None


async def _wait_to_retry(error: Exception, policy: RetryPolicy, retry: int, what: str) -> None:
    asked = retry_after(error)
    if asked is not None and asked > policy.max_retry_after:
        raise ModelUnavailable(f"{what}: the provider asked to wait {asked:.0f}s, longer"
                               f" than max_retry_after={policy.max_retry_after:.0f}s;"
                               f" {describe(error)}") from None
    await policy.sleep(policy.delay(retry, asked))


def transient(error: BaseException) -> bool:
    """Whether waiting and asking again may succeed."""
    if isinstance(error, ModelTimeout | APIConnectionError):  # resets and client timeouts
        return True
    status = getattr(error, "status_code", None)  # the openai client's, or a framework's
    if isinstance(status, int):
        return status in TRANSIENT_STATUS or status >= 500
    cause = error.__cause__  # a framework's error raised from the client's
    return isinstance(cause, OpenAIError) and transient(cause)


def retry_after(error: BaseException) -> float | None:
    """Seconds the provider asked us to wait (``retry-after-ms`` or ``Retry-After``, in
    seconds or as an HTTP date), or None."""
    response = getattr(error, "response", None) or getattr(error.__cause__, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    millis = headers.get("retry-after-ms")
    if millis is not None:
        return _non_negative(millis, scale=0.001)
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _non_negative(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _non_negative(text: str, scale: float = 1.0) -> float | None:
    try:
        value = float(text) * scale
    except ValueError:
        return None
    return value if value >= 0 and value == value else None  # not NaN


def describe(error: BaseException) -> str:
    """A short account of a provider error: type, status and the provider's message."""
    if isinstance(error, APIStatusError):
        return f"HTTP {error.status_code}: {_provider_message(error)[:300]}"
    return f"{type(error).__name__}: {str(error)[:300]}"


def _as_model_error(error: BaseException, what: str, tries: int) -> ModelError:
    if isinstance(error, ModelError):
        return error
    if isinstance(error, APITimeoutError):
        return ModelTimeout(f"{what}: no answer within the client's timeout ({tries} tries)")
    overflow = context_overflow(error)
    if overflow is not None:
        return overflow
    if transient(error):
        return ModelUnavailable(f"{what}: {describe(error)} ({tries} tries)")
    return ModelError(f"{what}: {describe(error)}")


def _provider_message(error: APIStatusError) -> str:
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(error.message)


_CONTEXT_WORDS = re.compile(r"context (length|size|window)|maximum context|too many tokens|"
                            r"exceed_context_size|context_length_exceeded", re.IGNORECASE)
_CONTEXT_SIZE = re.compile(r"(?:n_ctx|maximum context length is|context size)\D{0,12}(\d{3,7})",
                           re.IGNORECASE)


def context_overflow(error: BaseException) -> ContextOverflow | None:
    """A provider's "prompt too long" as :class:`ContextOverflow`, else None."""
    if not isinstance(error, APIStatusError) or error.status_code not in (400, 413, 422):
        return None
    body = error.body if isinstance(error.body, dict) else {}
    inner = body.get("error", body) if isinstance(body.get("error", body), dict) else {}
    text = f"{_provider_message(error)} {inner.get('type', '')} {inner.get('code', '')}"
    if not _CONTEXT_WORDS.search(text):
        return None
    size = inner.get("n_ctx")
    found = _CONTEXT_SIZE.search(text)
    tokens = int(size) if isinstance(size, int) else int(found.group(1)) if found else None
    return ContextOverflow(f"the prompt is larger than the model's context ({describe(error)})",
                           tokens)


def check_finish(finish_reason: str | None, model: str, options: RequestOptions) -> None:
    """Refuse an answer that did not end on its own (see the module docstring)."""
    if finish_reason == "length":
        limit = f"max_tokens={options.max_tokens}" if options.max_tokens else "the server's limit"
        raise AnswerCut(f"model {model}: the answer was cut at the token limit ({limit}); it is"
                        " not final, and a tool call in it may be incomplete")
    if finish_reason == "content_filter":
        raise NeedsPerson(f"model {model}: the provider's content filter stopped the answer;"
                          " asking again with the same dialog will not help")

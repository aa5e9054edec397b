"""Turning a task's dialog into a chat prompt that fits the model's context.

tether's dialog rows are richer than the chat format (tool calls with their keys, events,
cut-off answers, model-call records) and are kept whole in the store, however large. The
prompt is another matter: a 40 KB tool result sent every turn overflows a small model's
context on every request. So:

- each row's text is **clipped** for the prompt to a share of the context (its head and
  tail, with a note saying how much was left out and that the whole of it is kept);
- a tool call is **replayed as the server will take it** (:func:`arguments`): its
  ``arguments`` are always a JSON object, whatever the model sent and however long it was;
- when the rows after the last summary outgrow the budget, the oldest of them are
  **summarised in chunks** that fit, so a summary request never overflows either.

Sizes are estimated at :data:`CHARS_PER_TOKEN`; a server's "prompt too long" makes the
agent lower its budget (:meth:`ContextBudget.learn`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tether import dialog
from tether.agents.model_calls import ContextOverflow

CHARS_PER_TOKEN = 4
CLIP_SHARE = 4
"""One row may take at most this fraction (1/N) of the context."""
SUMMARY_PROMPT = ("Summarise the conversation so far for your own later use: the task, what was"
                  " decided, what tools returned that still matters, and what is left to do."
                  " Be brief and factual.")


@dataclass
class ContextBudget:
    """How many tokens a prompt may take: the configured context, less the answer's room,
    lowered when a server says a prompt was too long."""

    context_tokens: int
    answer_tokens: int = 0
    learned: int | None = None

    @property
    def prompt_tokens(self) -> int:
        limit = self.context_tokens if self.learned is None else self.learned
        return max(256, limit - self.answer_tokens)

    @property
    def clip_chars(self) -> int:
        return max(400, self.prompt_tokens * CHARS_PER_TOKEN // CLIP_SHARE)

    def learn(self, overflow: ContextOverflow, sent: Sequence[Mapping[str, Any]]) -> None:
        """A prompt of about ``tokens(sent)`` was too long: aim well below it, and below the
        server's context size when it said it."""
        ceiling = int(tokens(sent) * 0.7)
        if overflow.context_tokens:
            ceiling = min(ceiling, int(overflow.context_tokens * 0.8))
        current = self.learned or self.context_tokens
        self.learned = max(256, min(current, ceiling))


def tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """A rough token count of *messages* (JSON characters / CHARS_PER_TOKEN)."""
    return sum(len(orjson.dumps(dict(m))) for m in messages) // CHARS_PER_TOKEN


def text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def clip(value: str, limit: int) -> str:
    """*value* cut to about *limit* characters: its head and tail, with a note between."""
    limit = max(0, limit)
    if len(value) <= limit:
        return value
    head = limit * 2 // 3
    tail = limit - head
    left_out = len(value) - head - tail
    return (f"{value[:head]}\n[... {left_out:,} characters left out of this prompt; the whole"
            f" text is kept in the task's dialog ...]\n{value[len(value) - tail:]}")


# ---------------------------------------------------------------------------- tool-call arguments
#
# Servers read the ``arguments`` of the tool calls a prompt replays. llama.cpp's server parses
# them as JSON and answers HTTP 500 ("Failed to parse tool call arguments as JSON") to a
# prompt holding one that is not; other servers that hand them to the model's chat template
# parse them too, and templates that iterate ``arguments.items()`` need an object. A prompt
# that fails like that fails on every later request of the task, since each replays the call.
# So a replayed call's arguments are always a JSON object: what the model sent when it is one
# and fits; its long strings clipped when it is too long (the keys stay, so a model that
# copies its earlier calls still copies the right shape); ``{}`` when it is not an object at
# all (the call's result says what was wrong and quotes what was sent, see :func:`_rejected`).

SHORTENED = "_shortened"
"""The one key of the arguments replayed for a call too large to clip string by string."""
MIN_STRING = 40
"""A clipped string argument keeps at least this many of its characters (head and tail)."""


def parsed_object(value: Any) -> dict[str, Any] | None:
    """*value* (a JSON text, or arguments already parsed) as a JSON object, or None when it
    is not one: text that is not JSON (by orjson's strict reading, which every server's
    parser accepts), or JSON that is not an object. Empty text is the empty object, as
    ChatAgent reads it."""
    if isinstance(value, str):
        if not value:
            return {}
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    return dict(value) if isinstance(value, Mapping) else None


def arguments(value: Any, limit: int) -> str:
    """A tool call's arguments as a prompt replays them: always the text of a JSON object, of
    about *limit* characters at most.

    *value* is the model's text (or arguments already parsed). A JSON object that fits is
    sent as it was; a longer one has its string values clipped (:func:`clip`, inside the
    JSON strings, so the keys and the structure stay); one whose structure alone does not fit
    becomes ``{"_shortened": <its JSON text, clipped>}``. Anything that is not a JSON object
    is sent as ``{}``; the dialog row keeps what the model sent."""
    found = parsed_object(value)
    if found is None:
        return "{}"
    if isinstance(value, str) and value and len(value) <= limit:
        return value  # the model's own text, byte for byte
    whole = text(found)
    if len(whole) <= limit:
        return whole
    return _shortened(found, whole, limit)


def _shortened(found: dict[str, Any], whole: str, limit: int) -> str:
    """*found* within *limit* characters: its strings clipped to the largest cap that fits
    (the keys and the structure kept); when even :data:`MIN_STRING` does not fit (many keys,
    long lists of numbers), its whole text, clipped, as the one string of
    ``{"_shortened": ...}``; ``{}`` when not even that fits."""
    longest = _longest_string(found)
    if longest > MIN_STRING and len(text(_clip_strings(found, MIN_STRING))) <= limit:
        best = _largest(lambda cap: text(_clip_strings(found, cap)), MIN_STRING, longest, limit)
        if best is not None:
            return best
    return _largest(lambda cap: text({SHORTENED: clip(whole, cap)}), 0, limit, limit) or "{}"


def _largest(make: Callable[[int], str], low: int, high: int, limit: int) -> str | None:
    """``make(cap)`` for the largest cap in [low, high] whose text fits *limit* (a binary
    search: the text grows with the cap), or None when none does."""
    best = None
    while low <= high:
        cap = (low + high) // 2
        attempt = make(cap)
        if len(attempt) <= limit:
            best, low = attempt, cap + 1
        else:
            high = cap - 1
    return best


def _longest_string(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return max((_longest_string(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return max((_longest_string(v) for v in value), default=0)
    return 0


def _clip_strings(value: Any, cap: int) -> Any:
    if isinstance(value, str):
        return clip(value, cap)
    if isinstance(value, Mapping):
        return {k: _clip_strings(v, cap) for k, v in value.items()}
    if isinstance(value, list):
        return [_clip_strings(v, cap) for v in value]
    return value


def messages(stored: Mapping[str, Any], limit: int) -> list[dict[str, Any]]:
    """One dialog row as chat messages, its text clipped to *limit* characters."""
    row = dialog.read(stored)
    if isinstance(row, dialog.CallRow):
        return [{"role": "assistant", "content": None, "tool_calls": [{
            "id": row.key, "type": "function",
            "function": {"name": row.name, "arguments": arguments(row.args, limit)}}]}]
    if isinstance(row, dialog.ResultRow):
        content = row.content if row.error is None else f"error: {row.error}"
        return [{"role": "tool", "tool_call_id": row.key, "content": clip(text(content), limit)}]
    if isinstance(row, dialog.ReplyRow):
        cut = dialog.CUT_OFF if row.cut_off else ""
        return [{"role": "assistant", "content": clip(text(row.text), limit) + cut}]
    if isinstance(row, dialog.UserRow | dialog.EventRow):
        return [{"role": "user", "content": clip(dialog.spoken(row, text(row.content)), limit)}]
    if isinstance(row, dialog.Decision):
        return [{"role": "user", "content": clip(f"[decide] {text(row.content)}", limit)}]
    if isinstance(row, dialog.Completion) and row.record.get("rejected"):
        return _rejected(stored, limit)
    return []


def _rejected(row: Mapping[str, Any], limit: int) -> list[dict[str, Any]]:
    """Tool calls an answer asked for that could not be made, told back to the model as the
    results of those calls, so it can send them again correctly.

    The call is replayed with arguments the server can read (:func:`arguments`): arguments
    that are not a JSON object are sent as ``{}``, and the result quotes them (clipped), so
    the model still sees what it sent. The row keeps them as they came."""
    calls, told = [], []
    for call in row["rejected"]:
        sent = call.get("arguments")
        calls.append({"id": call["id"], "type": "function",
                      "function": {"name": call["name"], "arguments": arguments(sent, limit)}})
        said = f"error: {call['error']} This call was not made."
        if parsed_object(sent) is None:
            said += (" Its arguments are not a JSON object, so the call above shows {} in"
                     f" their place. You sent: {clip(text(sent), limit)}")
        told.append({"role": "tool", "tool_call_id": call["id"], "content": said})
    content = row.get("text")
    return [{"role": "assistant", "content": clip(content, limit) if content else None,
             "tool_calls": calls}, *told]


def summary_request(previous: str | None, task_input: Any,
                    older: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prompt that asks the model to fold *older* messages into the running summary."""
    return [{"role": "system", "content": SUMMARY_PROMPT},
            {"role": "user", "content": text(task_input) if not previous
             else f"Earlier summary: {previous}"}, *older,
            {"role": "user", "content": SUMMARY_PROMPT}]


def oldest_chunk(rows: Sequence[Mapping[str, Any]], keep_recent: int, budget: int,
                 limit: int) -> int:
    """How many of the oldest *rows* to summarise next: as many as fit half the *budget*
    (at least one), never the newest *keep_recent*; 0 when nothing may be summarised."""
    foldable = len(rows) - keep_recent
    taken, size = 0, 0
    while taken < foldable:
        size += tokens(messages(rows[taken], limit))
        if size > budget // 2 and taken:
            break
        taken += 1
    return taken

"""Turning a task's dialog into a chat prompt that fits the model's context.

tether's dialog rows are richer than the chat format (tool calls with their keys, events,
cut-off answers, model-call records) and are kept whole in the store, however large. The
prompt is another matter: a 40 KB tool result sent every turn overflows a small model's
context on every request. So:

- each row's text is **clipped** for the prompt to a share of the context (its head and
  tail, with a note saying how much was left out and that the whole of it is kept);
- when the rows after the last summary outgrow the budget, the oldest of them are
  **summarised in chunks** that fit, so a summary request never overflows either.

Sizes are estimated at :data:`CHARS_PER_TOKEN`; a server's "prompt too long" makes the
agent lower its budget (:meth:`ContextBudget.learn`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

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
    if len(value) <= limit:
        return value
    head = limit * 2 // 3
    tail = limit - head
    left_out = len(value) - head - tail
    return (f"{value[:head]}\n[... {left_out:,} characters left out of this prompt; the whole"
            f" text is kept in the task's dialog ...]\n{value[-tail:]}")


def messages(row: Mapping[str, Any], limit: int) -> list[dict[str, Any]]:
    """One dialog row as chat messages, its text clipped to *limit* characters."""
    role = row.get("role")
    if "tool_call" in row:
        call = row["tool_call"]
        return [{"role": "assistant", "content": None, "tool_calls": [{
            "id": call["key"], "type": "function",
            "function": {"name": call["name"], "arguments": clip(text(call["args"]), limit)}}]}]
    if role == "tool":
        content = row.get("content") if "error" not in row else f"error: {row['error']}"
        return [{"role": "tool", "tool_call_id": row["key"], "content": clip(text(content), limit)}]
    if role == "assistant":
        cut = " [cut off: interrupted before the answer was finished]" if row.get("cut_off") else ""
        return [{"role": "assistant", "content": clip(text(row.get("content")), limit) + cut}]
    if role == "user":
        return [{"role": "user", "content": clip(text(row.get("content")), limit)}]
    if role == "event":
        return [{"role": "user",
                 "content": clip(f"[{row.get('type')} event] {text(row.get('content'))}", limit)}]
    if role == "model" and row.get("rejected"):
        return _rejected(row, limit)
    return []


def _rejected(row: Mapping[str, Any], limit: int) -> list[dict[str, Any]]:
    """Tool calls an answer asked for that could not be made, told back to the model as the
    results of those calls, so it can send them again correctly."""
    calls = [{"id": call["id"], "type": "function",
              "function": {"name": call["name"], "arguments": clip(call["arguments"], limit)}}
             for call in row["rejected"]]
    told = [{"role": "tool", "tool_call_id": call["id"],
             "content": f"error: {call['error']} This call was not made."}
            for call in row["rejected"]]
    return [{"role": "assistant", "content": row.get("text"), "tool_calls": calls}, *told]


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

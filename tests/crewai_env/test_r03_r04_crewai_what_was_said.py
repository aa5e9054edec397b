"""R3, R4: where what people said goes in the requests a crew makes (issue 31). CrewAI builds
each request from its own messages, which never hold a person's words or an answer a P0
cut; ``Conversation.shown`` puts them back after the answer they followed and its results,
in every later request of the same crew task, and not into the next task's conversation."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("crewai", reason="CrewAI runs in its own environment: .ci/crewai-venv")

from tether import dialog
from tether.integrations.crewai import Conversation


def answered(n: int) -> list[dict[str, Any]]:
    """A crew task's messages after *n* native answers, each with one call's result."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You work."},
                                      {"role": "user", "content": "Step 1"}]
    for k in range(n):
        messages += [{"role": "assistant", "content": None, "tool_calls": [{"id": f"c{k}"}]},
                     {"role": "tool", "tool_call_id": f"c{k}", "content": f"result {k}"}]
    return messages


def talk(*rows: dict[str, Any]) -> Conversation:
    made = Conversation("crew.", "go")
    made.feed(rows)
    return made


def completion(n: int) -> dict[str, Any]:
    return {"role": "model", "messages": [{"crewai": [{"id": f"c{n}"}], "agent": "worker"}]}


def roles(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m.get("content") if m["role"] == "user" and "Step" not in str(m.get("content"))
                else m["role"]) for m in messages]


def test_r04_words_after_an_answer_follow_its_results_in_every_later_request() -> None:
    """Said after answer 1 (and its call's result): after that result, now and when two
    more answers have come."""
    heard = talk(completion(0), dialog.user("user_message", "STOP"), completion(1), completion(2))
    assert roles(heard.shown(answered(1), 1)) == [
        "system", "user", "assistant", "tool", "STOP"]
    assert roles(heard.shown(answered(3), 3)) == [
        "system", "user", "assistant", "tool", "STOP", "assistant", "tool", "assistant", "tool"]


def test_r03_an_answer_cut_off_and_the_words_after_it_come_last_in_order() -> None:
    """A P0 cut the second answer: the request asked again shows what was said of it, marked
    cut off, then the person's words, after the first answer's result."""
    heard = talk(completion(0), dialog.reply("Let me", cut_off=True), dialog.user("user_message", "go on"))
    shown = heard.shown(answered(1), 1)
    assert [m["role"] for m in shown][-2:] == ["assistant", "user"]
    assert shown[-2]["content"] == "Let me" + dialog.CUT_OFF
    assert shown[-1]["content"] == "go on"


def test_r04_words_said_in_an_earlier_crew_task_stay_in_its_conversation() -> None:
    """Said after task 1's first answer: task 2's requests (its own messages, one answer in
    so far, after task 1's two) do not show it; words said when task 2 began (after task 1's
    last answer) do, before task 2's first answer."""
    heard = talk(completion(0), dialog.user("user_message", "only for task 1"), completion(1),
                 dialog.user("user_message", "for task 2"), completion(2))
    assert roles(heard.shown(answered(1), 3)) == [
        "system", "user", "for task 2", "assistant", "tool"]

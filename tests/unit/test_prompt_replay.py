"""Every tool call a prompt replays has arguments any OpenAI-compatible server can read
(R8, R12, R22).

llama.cpp's server parses the ``arguments`` of each replayed assistant tool call as JSON and
answers HTTP 500 to a prompt holding one that is not, so one malformed call in the dialog
made every later request of the task fail. Here, whatever a dialog row holds (the model's
broken text, JSON that is not an object, arguments of any size), each ``arguments`` string
:func:`tether.agents.prompt.messages` produces parses, strictly, as a JSON object of about
the row's share of the prompt; the row itself is never changed.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.agents import prompt

LIMIT = 400
"""The smallest clip a ContextBudget gives (ContextBudget.clip_chars)."""


def strict_object(arguments: str) -> dict[str, Any]:
    """*arguments* read as a strict JSON parser (llama.cpp's, say) reads them."""

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    found = json.loads(arguments, parse_constant=no_constant)
    assert isinstance(found, dict), arguments
    return found


def replayed(messages: list[dict[str, Any]]) -> list[str]:
    return [c["function"]["arguments"] for m in messages for c in m.get("tool_calls") or []]


def rejected_row(arguments: str, error: str = "the arguments for refund are not valid JSON"
                 " (unexpected character).") -> dict[str, Any]:
    return {"role": "model", "model": "m", "finish_reason": "tool_calls", "usage": {},
            "rejected": [{"id": "bad_1", "name": "refund", "arguments": arguments,
                          "error": error}]}


def call_row(args: Any) -> dict[str, Any]:
    return {"role": "assistant", "tool_call": {"name": "write", "args": args, "key": "k1"}}


MALFORMED = ['{"order": "A1", amount: 5}', '{"order": "A1", "amou', "{", "not json at all",
             "NaN", '{"x": NaN}', '{"x": Infinity}', '{"x": 1e400}', '"\\ud800"', "{}}",
             "<tool_call>{\"name\": \"refund\"}</tool_call>", '{"a": 1} trailing', "  "]
NOT_OBJECTS = ["[1, 2]", '"a string"', "42", "null", "true"]


@pytest.mark.parametrize("sent", MALFORMED + NOT_OBJECTS)
def test_r22_a_rejected_call_is_replayed_as_an_empty_object_and_its_result_quotes_it(
        sent: str) -> None:
    """The call that could not be made goes back as ``{}``; its result (the error tool
    message) says what was wrong and quotes what the model sent; the row is untouched."""
    row = rejected_row(sent)
    kept = copy.deepcopy(row)
    assistant, told = prompt.messages(row, LIMIT)
    assert replayed([assistant]) == ["{}"]
    assert assistant["tool_calls"][0]["id"] == told["tool_call_id"] == "bad_1"
    assert told["content"].startswith("error: the arguments for refund are not valid JSON")
    assert "This call was not made." in told["content"]
    assert told["content"].endswith(f"You sent: {sent}")
    assert row == kept


def test_r22_what_the_model_sent_is_quoted_clipped() -> None:
    sent = '{"text": "' + "x" * 20_000 + '", broken'
    _, told = prompt.messages(rejected_row(sent), LIMIT)
    assert len(told["content"]) < 1_000 and "characters left out" in told["content"]
    assert told["content"].endswith("x\", broken")  # the tail, where JSON usually breaks


@pytest.mark.parametrize("sent", ['{"order": "A1", "amount": 5, "why": "late"}', ""])
def test_r22_a_rejected_call_whose_arguments_are_an_object_is_replayed_as_sent(
        sent: str) -> None:
    """An unknown argument, a tool that does not exist: the arguments are an object, so the
    model sees its own call (empty arguments, which ChatAgent reads as none, as ``{}``)."""
    assistant, told = prompt.messages(rejected_row(sent, "the arguments for refund do not"
                                                         " fit its parameters."), LIMIT)
    assert replayed([assistant]) == [sent or "{}"]
    assert "You sent" not in told["content"]


def test_r08_the_text_beside_rejected_calls_is_clipped() -> None:
    row = {**rejected_row("{"), "text": "y" * 10_000}
    assistant, _ = prompt.messages(row, LIMIT)
    assert len(assistant["content"]) < LIMIT + 200
    assert prompt.messages(rejected_row("{"), LIMIT)[0]["content"] is None


def test_r08_long_arguments_are_clipped_inside_their_strings_and_stay_json() -> None:
    """The old clip cut the JSON text in the middle and put a note there: invalid JSON.
    Now the long string values are clipped; the keys, the short values and the structure
    stay, so the model sees the shape of the call it made."""
    args = {"path": "notes/today.md", "mode": "append", "lines": 3,
            "content": "A" * 30_000 + "B" * 10_000}
    [sent] = replayed(prompt.messages(call_row(args), LIMIT))
    found = strict_object(sent)
    assert len(sent) <= LIMIT
    assert {k: found[k] for k in ("path", "mode", "lines")} == {
        "path": "notes/today.md", "mode": "append", "lines": 3}
    assert found["content"].startswith("AAAA") and found["content"].endswith("BBBB")
    assert "characters left out of this prompt" in found["content"]


def test_r08_arguments_whose_structure_is_too_big_are_replayed_as_one_shortened_string() -> None:
    for args in ({"ids": list(range(5_000))}, {f"k{n}": n for n in range(2_000)},
                 {"x" * 5_000: 1}):
        [sent] = replayed(prompt.messages(call_row(args), LIMIT))
        found = strict_object(sent)
        assert len(sent) <= LIMIT and list(found) == [prompt.SHORTENED]
        assert "characters left out of this prompt" in found[prompt.SHORTENED]


def test_r08_arguments_that_fit_are_sent_as_they_are() -> None:
    assert replayed(prompt.messages(call_row({"order": "A1", "amount": 5}), LIMIT)) == [
        '{"order":"A1","amount":5}']
    spaced = '{ "order" : "A1" }'
    assert replayed(prompt.messages(rejected_row(spaced), LIMIT)) == [spaced]  # verbatim
    # whitespace the model added does not count against it when re-serialised
    loose = '{"order":' + " " * 1_000 + '"A1"}'
    assert replayed(prompt.messages(rejected_row(loose), LIMIT)) == ['{"order":"A1"}']


def test_r08_a_tool_call_row_whose_args_are_not_an_object_is_replayed_as_one() -> None:
    for args in (None, [1, 2], "not json", '{"q": 1}'):
        [sent] = replayed(prompt.messages(call_row(args), LIMIT))
        assert isinstance(strict_object(sent), dict)
    assert replayed(prompt.messages(call_row('{"q": 1}'), LIMIT)) == ['{"q": 1}']


def test_r08_clip_keeps_no_tail_when_given_no_room() -> None:
    """``value[-0:]`` is the whole string: a clip with no room for a tail must not give it."""
    clipped = prompt.clip("abcdef" * 100, 0)
    assert "abcdef" not in clipped and "600 characters left out" in clipped
    assert prompt.clip("abcdef" * 100, 3).endswith("\nf")


# ---------------------------------------------------------------------------- any arguments

long_text = st.builds(lambda piece, times: piece * times, st.text(min_size=1, max_size=8),
                      st.integers(0, 2_000))
"""Strings up to 16,000 characters, cheap to draw (quotes, backslashes, control characters
and non-ASCII included: escaping is what makes clipped JSON grow)."""
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**15, 10**15)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=60) | long_text,
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=40), inner,
                                                                 max_size=8),
    max_leaves=25)


@settings(max_examples=100, deadline=None)
@given(args=st.dictionaries(st.text(max_size=60), json_values, max_size=6),
       limit=st.integers(min_value=400, max_value=6_000))
def test_r08_any_object_is_replayed_as_a_json_object_within_the_limit(
        args: dict[str, Any], limit: int) -> None:
    [sent] = replayed(prompt.messages(call_row(args), limit))
    found = strict_object(sent)
    assert len(sent) <= limit
    if len(json.dumps(args, ensure_ascii=False, separators=(",", ":"))) <= limit:
        assert found == args


@settings(max_examples=100, deadline=None)
@given(sent=st.text(max_size=200) | long_text, limit=st.integers(min_value=400, max_value=6_000))
def test_r22_any_text_the_model_sends_is_replayed_as_a_json_object(sent: str,
                                                                   limit: int) -> None:
    assistant, told = prompt.messages(rejected_row(sent), limit)
    [arguments] = replayed([assistant])
    strict_object(arguments)
    assert len(arguments) <= limit
    assert told["tool_call_id"] == "bad_1"

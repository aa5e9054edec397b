"""R10, R17 (issue 28): a running LangChain task is fed back the rows it just wrote (a model
turn's answer, a call's tool message); :class:`Messages` takes the very messages it made for
such a row instead of having pydantic decode them again (about a tenth of tether's own cost
a tool call, measured), and decodes wherever taking them could differ from decoding.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, ToolMessage

from tether import dialog
from tether.integrations import langchain_messages
from tether.integrations.langchain_messages import MADE_KEPT, Messages, dumped


def stored(value: Any) -> Any:
    """*value* as it comes back from the store: its JSON, decoded."""
    return orjson.loads(orjson.dumps(value))


def answer(call_id: str = "c1", message_id: str | None = "run-1") -> AIMessage:
    return AIMessage("", id=message_id, tool_calls=[{"name": "lookup", "args": {"order": "A1"},
                                                      "id": call_id}])


def turn_row(messages: list[AIMessage]) -> dict[str, Any]:
    return stored(dialog.completion({"model": "m", "messages": [dumped(m) for m in messages]}))


def result_row(message: ToolMessage) -> dict[str, Any]:
    return stored(dialog.result("agent.lookup", "t1:0", dumped(message)))


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every decode Messages asks of LangChain, counted."""
    decoded: list[Any] = []
    real = langchain_messages.messages_from_dict

    def counting(plain: Any) -> Any:
        decoded.append(plain)
        return real(plain)

    monkeypatch.setattr(langchain_messages, "messages_from_dict", counting)
    return decoded


def test_r17_rows_fed_back_are_the_messages_made_here_not_decoded_again(
        no_decoding: list[Any]) -> None:
    decoded = Messages("look up A1", "agent.", "")
    made = answer()
    assert decoded.recorded([made]) == [dumped(made)]
    result = ToolMessage("found", tool_call_id="c1", name="lookup")
    decoded.recorded([result])

    decoded.feed([turn_row([made]), result_row(result)])

    messages = decoded.result()
    assert messages[1] is made and messages[2] is result
    assert no_decoding == []
    assert decoded.made == []  # each taken once


def test_r10_a_row_unlike_what_was_made_is_decoded_from_the_row(no_decoding: list[Any]) -> None:
    decoded = Messages("look up A1", "agent.", "")
    made = answer()
    decoded.recorded([made])
    other = answer(call_id="c9", message_id="run-9")  # the row holds another answer

    decoded.feed([turn_row([other])])

    taken = decoded.result()[1]
    assert taken is not made and isinstance(taken, AIMessage)
    assert [c["id"] for c in taken.tool_calls] == ["c9"]
    assert len(no_decoding) == 1


def test_r10_a_made_message_whose_id_the_conversation_holds_is_decoded_and_left_alone(
        no_decoding: list[Any]) -> None:
    """The conversation gives a repeated id a new one: done to a made message, it would change
    an object a graph run holds too."""
    decoded = Messages("look up A1", "agent.", "")
    decoded.feed([turn_row([answer()]), result_row(ToolMessage("found", tool_call_id="c1"))])
    again = answer(call_id="c2")  # the same message id as the first answer
    decoded.recorded([again])
    no_decoding.clear()

    decoded.feed([turn_row([again])])

    taken = decoded.result()[-1]
    assert taken is not again and taken.id != "run-1"
    assert again.id == "run-1"
    assert len(no_decoding) == 1


class Receipt:
    """A live object a tool hands back as its message's artifact (as a retriever hands back
    LangChain Documents)."""

    def __str__(self) -> str:
        return "receipt #7"


@pytest.mark.parametrize(("artifact", "in_the_row"), [
    (Receipt(), "receipt #7"),
    ([Document("receipt", metadata={"source": "db"})],
     [{"id": None, "metadata": {"source": "db"}, "page_content": "receipt",
       "type": "Document"}]),
])
def test_r10_a_message_holding_more_than_its_row_is_decoded_from_the_row(
        no_decoding: list[Any], artifact: Any, in_the_row: Any) -> None:
    """The row holds the artifact as JSON (a retriever's Documents as their dicts): after a
    restart the conversation holds that, so a running task holds the same, not the live
    objects."""
    decoded = Messages("look up A1", "agent.", "")
    decoded.feed([turn_row([answer()])])
    result = ToolMessage("found", tool_call_id="c1", name="lookup", artifact=artifact)
    row = result_row(result)
    assert decoded.recorded([result]) == [row["content"]]
    no_decoding.clear()

    decoded.feed([row])

    taken = decoded.result()[-1]
    assert taken is not result and taken.artifact == in_the_row
    assert len(no_decoding) == 1


def test_r10_a_made_message_whose_id_changed_since_it_was_recorded_is_decoded(
        no_decoding: list[Any]) -> None:
    """A graph run gives a message without an id one of its own, in place: the row, which
    has none, is what the conversation holds."""
    decoded = Messages("look up A1", "agent.", "")
    decoded.feed([turn_row([answer()])])
    result = ToolMessage("found", tool_call_id="c1", name="lookup")
    row = result_row(result)
    decoded.recorded([result])
    result.id = "given-by-a-graph-run"
    no_decoding.clear()

    decoded.feed([row])

    taken = decoded.result()[-1]
    assert taken is not result and taken.id != "given-by-a-graph-run"
    assert len(no_decoding) == 1


def test_r17_what_is_made_here_is_bounded_when_its_rows_never_come() -> None:
    decoded = Messages("look up A1", "agent.", "")
    for n in range(3 * MADE_KEPT):
        decoded.recorded([answer(call_id=f"c{n}", message_id=f"run-{n}")])
    assert len(decoded.made) == MADE_KEPT
    assert decoded.made[-1][1][0].id == f"run-{3 * MADE_KEPT - 1}"

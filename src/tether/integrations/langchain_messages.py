"""A task's LangChain conversation, decoded from its dialog rows (the history half of
:mod:`tether.integrations.langchain`).

A running task keeps its decoded :class:`Messages` between plans and feeds them only the rows
added since; a load, a rollback or a fork decodes from every row again. Rows hold LangChain's
own message dicts (``message_to_dict``): a turn's row the messages it added, or, when
middleware rewrote the conversation (a summary, a redaction), the whole conversation after it
behind ``RemoveMessage(REMOVE_ALL_MESSAGES)``, as LangGraph's reducer writes it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pydantic_core

from tether import dialog
from tether.agent import DialogPosition
from tether.errors import MissingExtra
from tether.model import builtin_only

try:
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        RemoveMessage,
        ToolMessage,
        message_to_dict,
        messages_from_dict,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("the LangChain integration needs langchain-core", "langchain") from exc

__all__ = ["NOT_MADE", "SKIPPED", "Messages", "dumped", "messages_of", "replayable", "text"]

MADE_KEPT = 8
"""Messages made here kept for their rows (:meth:`Messages.recorded`)."""
NOT_MADE = "error: this call was not made (its plan was dropped)"
SKIPPED = "skipped: a person decided this call is not made"


def messages_of(rows: Sequence[Mapping[str, Any]], opening: Any,
                prefix: str = "") -> list[BaseMessage]:
    """The LangChain messages a task's dialog rows hold after *opening* (the task's input)."""
    decoded = Messages(opening, prefix, "")
    decoded.feed(rows)
    return decoded.result()


class Messages:
    """A task's LangChain messages, decoded as its rows come (a running task feeds only the
    rows added since its last plan). Providers want every call answered before the
    conversation goes on, so a message that came while calls were open follows their
    results, and a call never made is answered as such."""

    def __init__(self, opening: Any, prefix: str, key: str) -> None:
        self.messages: list[BaseMessage] = []
        self.ids: set[str] = set()
        self.held: list[BaseMessage] = []
        self.open_calls: dict[str, str] = {}  # call id -> tool name, in order
        self.call_ids: dict[str, str] = {}
        self.prefix = prefix
        self.opening = key
        self.position: DialogPosition | None = None
        self.live: Any = None
        """The graph run kept open for this conversation (:mod:`.langchain_run`)."""
        self.count = 0
        self.made: list[tuple[list[dict[str, Any]], list[BaseMessage]]] = []
        """Messages this process wrote rows for (a turn's answer, a call's result): each
        row's plain form and the objects, so that the row fed back is not decoded again
        (:meth:`recorded`)."""
        self._add(*_opening(opening))  # an input's open calls are answered too

    def feed(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in map(dialog.read, rows):
            if isinstance(row, dialog.CallRow):
                if row.name.startswith(self.prefix) and isinstance(row.args, Mapping):
                    self.call_ids[row.key] = str(row.args.get("call_id", ""))
                continue
            if isinstance(row, dialog.Completion) and self.open_calls:  # a dropped plan's calls
                self._add(*self._not_made(), *self.held)
                self.held = []
            for message in self._messages(row):
                if isinstance(message, RemoveMessage):  # the turn rewrote the conversation
                    self.messages, self.ids, self.open_calls = [], set(), {}
                elif not isinstance(row, dialog.Completion) and \
                        not isinstance(message, ToolMessage) and self.open_calls:
                    self.count += 1
                    message.id = message.id or f"tether-{self.count}"
                    self.held.append(message)
                else:
                    self._add(message)
            if self.held and not self.open_calls:
                self._add(*self.held)
                self.held = []

    def recorded(self, messages: list[BaseMessage]) -> list[dict[str, Any]]:
        """*messages*, made in this process, as their row holds them. Where the row is all
        they are (nothing in them but JSON's own data: an artifact of live objects, such as a
        retriever's Documents, comes back from the row as plain data, as after a restart),
        the row fed back takes them as they are. A few are kept: a row that never came, a
        dropped plan's, does not pile up."""
        raw = [message_to_dict(m) for m in messages]
        plain = [dict(pydantic_core.to_jsonable_python(m, fallback=str)) for m in raw]
        if plain == raw and all(builtin_only(vars(m)) for m in messages):
            self.made = [*self.made[-(MADE_KEPT - 1):], (plain, messages)]
        return plain

    def _decoded(self, plain: list[dict[str, Any]]) -> list[BaseMessage]:
        """*plain*'s messages: those made here for a row equal to it (the same messages,
        without pydantic decoding them again), else decoded. Made messages whose ids changed
        since (a graph run gives a message without one an id of its own), or whose ids the
        conversation holds already, are decoded instead: :meth:`_add` gives such a message a
        new id, which must not change an object a graph run holds too."""
        for index, (form, messages) in enumerate(self.made):
            if form == plain:
                del self.made[:index + 1]
                if all(m.id == f["data"].get("id") and (m.id is None or m.id not in self.ids)
                       for m, f in zip(messages, form, strict=True)):
                    return list(messages)
                break
        return messages_from_dict(plain)

    def _add(self, *messages: BaseMessage) -> None:
        """Append *messages*, each under an id of its own: LangGraph's reducer would merge two
        messages with one id, so a missing or repeated id is replaced by tether's."""
        for message in messages:
            if message.id is None or message.id in self.ids:
                self.count += 1
                message.id = f"tether-{self.count}"
            self.ids.add(message.id)
            self.messages.append(message)
            if isinstance(message, AIMessage):
                self.open_calls.update({c["id"]: c["name"] for c in message.tool_calls if c["id"]})
            elif isinstance(message, ToolMessage):
                self.open_calls.pop(message.tool_call_id, None)

    def _not_made(self) -> list[BaseMessage]:
        return [ToolMessage(NOT_MADE, tool_call_id=c, name=n, status="error",
                            id=f"tether-not-made-{c}") for c, n in self.open_calls.items()]

    def _messages(self, row: dialog.DialogRow) -> list[BaseMessage]:
        """What one dialog row adds to the conversation."""
        if isinstance(row, dialog.Completion):  # RemoveMessage: only REMOVE_ALL is written
            return [replayable(m) for m in self._decoded(row.messages)]
        if isinstance(row, dialog.ReplyRow):
            return [AIMessage(text(row.text) + dialog.CUT_OFF)] if row.cut_off else []
        if isinstance(row, dialog.ResultRow):
            return self._result(row)
        if isinstance(row, dialog.UserRow | dialog.EventRow):
            return [HumanMessage(dialog.spoken(row, text(row.content)))]
        if isinstance(row, dialog.Decision):
            return [HumanMessage(f"[decide] {text(row.content)}")]
        return []

    def _result(self, row: dialog.ResultRow) -> list[BaseMessage]:
        content = row.content
        if isinstance(content, Mapping) and content.get("type") == "tool":
            return self._decoded([dict(content)])
        call_id = self.call_ids.get(row.key)
        if call_id is None or not row.name.startswith(self.prefix):
            return []
        name = row.name[len(self.prefix):]
        if row.error is not None:
            return [ToolMessage(f"error: {row.error}", tool_call_id=call_id, name=name,
                                status="error")]
        return [ToolMessage(SKIPPED if row.skipped else text(content), tool_call_id=call_id,
                            name=name)]

    def result(self) -> list[BaseMessage]:
        """The messages so far; calls still open answered as never made."""
        return [*self.messages, *self._not_made(), *self.held]


def _opening(value: Any) -> list[BaseMessage]:
    """The task's input as messages: a list of LangChain message dicts as they are, else one
    human message."""
    if isinstance(value, list) and value and all(isinstance(m, Mapping) and "type" in m
                                                 and "data" in m for m in value):
        return [m for m in messages_from_dict(value) if not isinstance(m, RemoveMessage)]
    return [HumanMessage(text(value), id="tether-input")]


def replayable(message: BaseMessage) -> BaseMessage:
    """A message as a model is sent it again: calls whose arguments were not a JSON object
    are replayed as calls with ``{}`` (a strict server answers HTTP 500 to every request
    holding one); the tool message after each says what the model sent."""
    if not isinstance(message, AIMessage) or not message.invalid_tool_calls:
        return message
    calls = [*message.tool_calls, *({"name": bad.get("name") or "", "args": {},
                                      "id": bad.get("id") or "", "type": "tool_call"}
                                     for bad in message.invalid_tool_calls)]
    return message.model_copy(update={"tool_calls": calls, "invalid_tool_calls": []})


def dumped(message: BaseMessage) -> dict[str, Any]:
    return dict(pydantic_core.to_jsonable_python(message_to_dict(message), fallback=str))


def text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(
        pydantic_core.to_jsonable_python(value, fallback=str))

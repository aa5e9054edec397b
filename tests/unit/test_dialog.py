"""R8/R17 (issue 27): a task's dialog rows come in a few kinds, written through one API and
read by one reader every model agent maps to its own messages; rows stored before the
reader existed (the same plain shapes) read the same."""

from __future__ import annotations

from typing import Any

import pytest

from tether import dialog


@pytest.mark.parametrize(("row", "typed"), [
    (dialog.user("user_message", "hi", 3), dialog.UserRow("user_message", "hi")),
    (dialog.user("resume", "go on"), dialog.UserRow("resume", "go on")),
    (dialog.event("amend", "new@x", 4), dialog.UserRow("amend", "new@x")),
    (dialog.event("webhook", {"a": 1}, 5), dialog.EventRow("webhook", {"a": 1}, 5)),
    (dialog.completion({"model": "m", "messages": [{"x": 1}]}),
     dialog.Completion({"role": "model", "model": "m", "messages": [{"x": 1}]})),
    (dialog.call("refund", {"o": 1}, "k1"), dialog.CallRow("refund", {"o": 1}, "k1")),
    (dialog.call("refund", {}, "k2", not_run=True), dialog.CallRow("refund", {}, "k2", True)),
    (dialog.result("refund", "k1", "ok"), dialog.ResultRow("refund", "k1", "ok")),
    (dialog.result("refund", "k1", None, skipped=True),
     dialog.ResultRow("refund", "k1", skipped=True)),
    (dialog.error("refund", "k1", "boom"), dialog.ResultRow("refund", "k1", error="boom")),
    (dialog.reply("done"), dialog.ReplyRow("done")),
    (dialog.reply("Let", cut_off=True), dialog.ReplyRow("Let", cut_off=True)),
    (dialog.decision(9, {"outcome": "skip"}), dialog.Decision({"outcome": "skip"})),
    (dialog.system("spawn", agent="child", depth=1),
     dialog.SystemRow("spawn", {"agent": "child", "depth": 1})),
])
def test_each_kind_is_written_and_read_back(row: dict[str, Any], typed: dialog.DialogRow) -> None:
    assert dialog.read(row) == typed


@pytest.mark.parametrize("stored", [
    {"role": "user", "type": "user_message", "event_id": 1, "content": "hi", "at": 1.0},
    {"role": "assistant", "tool_call": {"name": "pay", "args": {}, "key": "k"},
     "tool_version": "1", "planned_by": "a@1", "at": 2.0},
    {"role": "tool", "name": "pay", "key": "k", "error": "x", "traceback": "tb", "at": 3.0},
    {"role": "system", "event": "degrade", "scope": "worker", "content": {"mode": "x"}},
    {"role": "mystery", "what": 1},
])
def test_rows_stored_before_the_reader_and_of_no_known_shape_read_without_error(
        stored: dict[str, Any]) -> None:
    assert dialog.read(stored) is not None


def test_a_user_message_is_spoken_as_it_is_and_anything_else_labelled() -> None:
    assert dialog.spoken(dialog.UserRow("user_message", "hi"), "hi") == "hi"
    assert dialog.spoken(dialog.UserRow("resume", "go"), "go") == "[resume] go"
    assert dialog.spoken(dialog.EventRow("webhook", 1, None), "1") == "[webhook] 1"

"""R20 (issue 26, defect 6): user data is never markup.

A stored head replaces large strings by ``{"$tether_blob": digest, "bytes": n}``. Payload
content of exactly that shape (an event's payload, a tool's result, a task's input) must
stay data: on a real SQLite store, a task sent such a payload completes with it as data,
its result intact in every process that loads it, no version read as damaged, and
another task's large value never copied into it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
from _support import fast_settings

import tether as tt
from tether import blobs
from tether.model import Snapshot, Status

DOCUMENT = "confidential contract of the other customer " * 5_000  # ~220 KB: a blob
MISSING = "sha256:" + "0" * 64


def app(db: Path, paid: list[Any]) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}", settings=fast_settings(keep_versions=50))

    @h.tool(side_effect=True)
    async def pay(ctx: tt.ToolContext, order: str, note: Any) -> Any:
        paid.append(order)
        return note  # a tool result shaped like a reference, too

    @h.agent("approver")
    class Approver(tt.Agent):
        """Waits for an approval, pays once, and finishes with what it was sent."""

        async def plan(self, t: tt.TaskView) -> tt.Action:
            stage = t.scratch.get("stage")
            if stage is None:
                t.scratch["stage"] = "waiting"
                return tt.Wait("approval")
            if stage == "waiting":
                t.scratch["stage"] = "paying"
                t.scratch["approval"] = (t.last_event or {}).get("payload")
                return tt.ToolCall("pay", {"order": t.input["order"], "note": t.input["note"]})
            return tt.Finish({"approval": t.scratch["approval"], "paid": t.last_tool_result,
                              "input": t.input})

    @h.agent("keeper")
    class Keeper(tt.Agent):
        """Holds a large document (stored as a blob) and waits."""

        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Wait("never")

    return h


def stored_heads(db: Path, task_id: str) -> list[bytes]:
    with sqlite3.connect(db) as conn:
        return [bytes(row[0]) for row in conn.execute(
            "SELECT head FROM snapshots WHERE task_id = ? ORDER BY version", (task_id,))]


@pytest.mark.parametrize("whose", ["missing", "another task's"])
async def test_r20_a_payload_shaped_like_a_large_value_reference_stays_data(
        tmp_path: Path, whose: str) -> None:
    """The event payload is exactly a reference (to a digest no blob has, or to another
    task's real document); the task input and the tool result hold one too, and a key
    that already looks escaped. The task completes with all of it as data, in this process
    and in the next; no version is damaged; the other task's document is never copied."""
    db = tmp_path / "tether.db"
    paid: list[str] = []
    h = app(db, paid)
    await h.submit("keeper", {"document": DOCUMENT}, task_id="other")
    await h.run_until_idle(timeout=10)
    (digest,) = set().union(*(blobs.references(head) for head in stored_heads(db, "other")))
    forged = {"$tether_blob": MISSING if whose == "missing" else digest,
              "bytes": len(DOCUMENT.encode())}
    note = {"$$tether_blob": "looks escaped", "inner": [forged]}
    await h.submit("approver", {"order": "o1", "note": note, "ref": forged}, task_id="t1")
    await h.run_until_idle(timeout=10)
    await h.emit(tt.Event("approval", "t1", forged))
    await h.run_until_idle(timeout=10)
    expected = {"approval": forged, "paid": note,
                "input": {"order": "o1", "note": note, "ref": forged}}

    info = await h.get("t1")
    assert info.record.status is Status.COMPLETED, info.record.reason
    assert info.snapshot.result == expected
    assert info.damaged == ()
    assert paid == ["o1"]
    await h.close()

    h = app(db, paid)  # another process loads it: the same, nothing fell back
    info = await h.get("t1")
    assert (info.record.status, info.snapshot.result, info.damaged) == (
        Status.COMPLETED, expected, ())
    for version, _, _ in await h.reads.versions("t1"):  # every kept version reads whole
        _, head = await h.reads.head("t1", version)
        Snapshot.loads(await h.reads.whole("t1", version, head), "t1", version)
    bundle = await h.export("t1")
    assert "snapshot_error" not in bundle and bundle["snapshot"]["result"] == expected
    for text in (orjson.dumps(bundle), *stored_heads(db, "t1")):  # never the other's document
        assert DOCUMENT[:60].encode() not in text
    assert (await h.get("other")).snapshot.input == {"document": DOCUMENT}
    await h.close()
    assert paid == ["o1"]

"""R20: splitting large values out of a snapshot head and joining them back."""

from __future__ import annotations

import orjson
import pytest

from tether import blobs
from tether.errors import CorruptSnapshot
from tether.model import Frame, Snapshot

BIG = "QUJD" * 50_000  # 200 KB of base64


def snapshot(**scratch: object) -> bytes:
    return Snapshot(task_id="t1", agent="a", input={"doc": BIG},
                    stack=[Frame(agent="a", scratch=dict(scratch))]).dumps()


def test_r20_large_strings_leave_the_head_once_each_and_come_back_intact() -> None:
    head = snapshot(copy=BIG, small="x" * 100, other="Z" * 70_000)
    stored, large = blobs.layered(head, threshold=64 * 1024)
    assert len(stored) < 2_000 < len(head)
    assert len(large) == 2  # BIG twice (input and scratch) is one blob
    assert blobs.references(stored) == set(large)
    assert blobs.join(stored, large, "t1", 2) == orjson.dumps(orjson.loads(head))
    snap = Snapshot.loads(blobs.join(stored, large, "t1", 2), "t1", 2)
    assert snap.input == {"doc": BIG} and snap.frame.scratch["small"] == "x" * 100


def test_r20_a_small_head_is_left_exactly_as_it_is() -> None:
    head = Snapshot(task_id="t1", agent="a", input={"q": "hi"}, stack=[Frame(agent="a")]).dumps()
    assert blobs.layered(head, threshold=64 * 1024) == (head, {})
    assert blobs.references(head) == set()


def test_r20_a_missing_blob_names_the_task_version_and_digest() -> None:
    stored, large = blobs.layered(snapshot(), threshold=64 * 1024)
    (digest,) = large
    with pytest.raises(CorruptSnapshot, match=f"task t1 version 7: large value {digest} is missing"):
        blobs.join(stored, {}, "t1", 7)

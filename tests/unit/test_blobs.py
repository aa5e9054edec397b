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


# Issue 26, defect 6: user data is never markup. Payload content shaped like a reference
# (an event's payload in frame.last_event, a tool result, a task's input, scratch) is
# escaped when the head is stored and comes back as the same data when it is loaded.

FORGED = {"$tether_blob": "sha256:" + "0" * 64, "bytes": 10}


class Blobs:
    """A store's blob table, counting what is asked of it."""

    def __init__(self, table: dict[str, bytes]) -> None:
        self.table = table
        self.asked: list[set[str]] = []

    async def load_head(self, task_id: str, version: int | None = None) -> tuple[int, bytes]:
        raise AssertionError("not used")

    async def load_blobs(self, digests: object) -> dict[str, bytes]:
        asked = set(digests)  # type: ignore[call-overload]
        self.asked.append(asked)
        return {d: self.table[d] for d in asked if d in self.table}


def head_with(**scratch: object) -> bytes:
    return Snapshot(task_id="t1", agent="a", input={"q": "hi"},
                    stack=[Frame(agent="a", scratch=dict(scratch),
                                 last_event={"type": "approval", "payload": FORGED})]).dumps()


async def test_r20_a_forged_reference_in_a_small_head_is_escaped_and_read_back_as_data() -> None:
    head = head_with(result=FORGED)
    stored, large = blobs.layered(head, threshold=64 * 1024)
    assert large == {} and stored != head  # small, but escaped all the same
    assert blobs.references(stored) == set()  # no reference: nothing to load, nothing kept
    assert b'"$tether_blob"' not in stored and b'"$$tether_blob"' in stored
    table = Blobs({})
    assert await blobs.resolve(table, stored, "t1", 2) == head
    assert table.asked == []
    snap = Snapshot.loads(await blobs.resolve(table, stored, "t1", 2), "t1", 2)
    assert snap.frame.last_event == {"type": "approval", "payload": FORGED}
    assert snap.frame.scratch["result"] == FORGED


async def test_r20_a_forged_reference_to_a_real_digest_never_brings_that_value_in() -> None:
    """Another task's document is in the blob table under its digest: a payload naming
    that digest stays a payload, and the document is never read, let alone copied."""
    other, other_large = blobs.layered(snapshot(), threshold=64 * 1024)
    (digest,) = other_large
    forged = {"$tether_blob": digest, "bytes": len(BIG)}
    head = Snapshot(task_id="t2", agent="a", input=forged, stack=[Frame(agent="a")]).dumps()
    stored, large = blobs.layered(head, threshold=64 * 1024)
    assert large == {} and blobs.references(stored) == set()
    table = Blobs(dict(other_large))
    whole = await blobs.resolve(table, stored, "t2", 1)
    assert Snapshot.loads(whole, "t2", 1).input == forged and BIG.encode() not in whole
    assert table.asked == []
    assert blobs.references(other) == {digest}  # the other task's reference is still one


async def test_r20_real_and_forged_references_side_by_side_in_a_large_head() -> None:
    head = snapshot(copy=BIG, forged=FORGED, nested=[{"x": [FORGED]}])
    stored, large = blobs.layered(head, threshold=64 * 1024)
    assert blobs.references(stored) == set(large) and len(large) == 1
    table = Blobs(large)
    assert await blobs.resolve(table, stored, "t1", 3) == orjson.dumps(orjson.loads(head))
    assert table.asked == [set(large)]


@pytest.mark.parametrize("key", ["$tether_blob", "$$tether_blob", "$$$tether_blob"])
def test_r20_every_level_of_the_reserved_key_round_trips(key: str) -> None:
    """Escaping adds one ``$`` and unescaping takes it off: data that already looks
    escaped survives too, and only a single-``$`` key in a stored head is a reference."""
    value = {key: "sha256:abc", "bytes": 3, "more": {key: {key: 1}}}
    head = Snapshot(task_id="t1", agent="a", input=value, stack=[Frame(agent="a")]).dumps()
    stored, _ = blobs.layered(head, threshold=64 * 1024)
    raw = orjson.loads(stored)["input"]
    assert set(raw) == {"$" + key, "bytes", "more"} and raw["more"] == {"$" + key: {"$" + key: 1}}
    assert blobs.join(stored, {}, "t1", 1) == head


@pytest.mark.parametrize("key", ["tether_blob", "x$tether_blob", "$tether_blobs", "$tether",
                                 "$ tether_blob"])
def test_r20_keys_that_only_resemble_the_reserved_one_are_left_alone(key: str) -> None:
    head = Snapshot(task_id="t1", agent="a", input={key: {"$tether_blob": "no", key: 1}},
                    stack=[Frame(agent="a")]).dumps()
    stored, _ = blobs.layered(head, threshold=64 * 1024)
    assert orjson.loads(stored)["input"] == {key: {"$$tether_blob": "no", key: 1}}
    assert blobs.join(stored, {}, "t1", 1) == head


async def test_r20_a_head_without_the_reserved_key_is_never_parsed() -> None:
    """The common head costs one byte search when stored and one when loaded: the very
    same bytes come back, even with the reserved name in its string values."""
    head = Snapshot(task_id="t1", agent="a", input={"q": "$tether_blob", "r": ['"$tether_blob":']},
                    stack=[Frame(agent="a")]).dumps()
    stored, large = blobs.layered(head, threshold=64 * 1024)
    assert stored is head and large == {}
    assert await blobs.resolve(Blobs({}), stored, "t1", 1) is head

"""R3, R8, R26 (issue 13, part 2): every input is bounded and checked before anything is stored.

Task ids have a short, documented alphabet (they name bundle files, reach terminals and URLs);
NaN and infinities, which JSON cannot carry, are refused instead of silently becoming null;
event types and source ids are bounded.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import tether as tt
from tether.model import TaskRecord

BAD_IDS = ["../escape", "/tmp/abs", "", ".", "..", "a" * 129, "[/]x", "x\x1b[31mred",
           "-rf", "sp ace", "é"]


def echo(h: tt.Harness) -> None:
    @h.agent("echo")
    class Echo(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.Wait("approval")


@pytest.mark.parametrize("task_id", BAD_IDS)
async def test_r08_a_bad_task_id_is_refused_everywhere_and_nothing_is_stored(
        harness: tt.Harness, task_id: str) -> None:
    """R8: submit, emit, the levers and the readers refuse an id outside the alphabet by name."""
    echo(harness)
    with pytest.raises(tt.InvalidInput, match="letters, digits"):
        await harness.submit("echo", task_id=task_id)
    assert await harness.store.count_by_status() == {}
    for attempt in (harness.emit(tt.Event("approval", task_id)), harness.get(task_id),
                    harness.cancel(task_id), harness.resume(task_id), harness.export(task_id),
                    harness.rollback(task_id, 1), harness.decide(task_id, "skip")):
        with pytest.raises(tt.InvalidInput, match="task id"):
            await attempt


async def test_r08_good_ids_are_taken(harness: tt.Harness) -> None:
    """R8: the alphabet is letters, digits and . _ : - (1-128, starting with a letter or digit)."""
    echo(harness)
    for task_id in ["t1", "invoice-2026.12:acme_01", "A" * 128]:
        assert await harness.submit("echo", task_id=task_id) == task_id


async def test_r26_a_stored_id_that_would_escape_the_bundle_folder_writes_nothing(
        tmp_path: Path) -> None:
    """R26: a task id that slipped into an older store ("../escape") cannot place its bundle
    outside bundle_dir: notify refuses it by name and no file appears anywhere."""
    bundles = tmp_path / "bundles"
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}", bundle_dir=bundles)
    record = TaskRecord("../escape", "echo", tt.Status.NEEDS_HUMAN, 1.0, 1.0, 1)
    snap = tt.Snapshot(task_id="../escape", agent="echo", input=None)
    await h.store.create_task(record, snap.dumps())
    with pytest.raises(tt.InvalidInput, match="task id"):
        await h.notify("../escape")
    assert not (tmp_path / "escape.json").exists()
    assert not bundles.exists() or list(bundles.iterdir()) == []
    await h.close()


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
async def test_r03_nan_and_infinities_are_refused_not_turned_into_null(
        harness: tt.Harness, number: float) -> None:
    """R3/R8: JSON has no NaN or infinity; orjson would write null. Inputs and payloads
    holding one are refused by name, and nothing is stored."""
    echo(harness)
    with pytest.raises(tt.InvalidInput, match="NaN or an infinity"):
        await harness.submit("echo", {"amount": [1.0, {"x": number}]})
    tid = await harness.submit("echo", {"amount": 1.5})
    with pytest.raises(tt.InvalidInput, match="NaN or an infinity"):
        await harness.emit(tt.Event("approval", tid, {"amount": number}))
    assert await harness.store.list_events(tid) == []
    assert (await harness.get(tid)).snapshot.input == {"amount": 1.5}


async def test_r03_event_types_and_source_ids_are_bounded(harness: tt.Harness) -> None:
    """R3/R6: an event type or source id that is huge or holds control characters is refused
    before it reaches the store's index."""
    echo(harness)
    tid = await harness.submit("echo")
    for event in (tt.Event("a" * 201, tid, priority=1), tt.Event("ap\x1bproval", tid, priority=1),
                  tt.Event("approval", tid, source_event_id="s" * 201)):
        with pytest.raises(tt.InvalidInput):
            await harness.emit(event)
    assert await harness.store.list_events(tid) == []


def nested(levels: int) -> object:
    value: object = "leaf"
    for _ in range(levels):
        value = {"x": value}
    return value


async def test_r03_r08_one_nesting_bound_at_every_intake_and_nothing_stored(
        harness: tt.Harness) -> None:
    """R3, R8 (issue 26): a value nested past MAX_DEPTH is refused by name at every intake (task
    input, event payload, a person's input and result) with nothing stored, and a task already
    there is left as it was; before, ~252 levels were accepted and could never be committed."""
    from tether.model import MAX_DEPTH

    echo(harness)
    for levels in (MAX_DEPTH + 1, 252, 5_000):
        with pytest.raises(tt.InvalidInput, match=f"nested more than {MAX_DEPTH} levels"):
            await harness.submit("echo", nested(levels), task_id="deep")
    assert await harness.store.count_by_status() == {}
    task_id = await harness.submit("echo", "shallow")
    await harness.run_until_idle()
    before = await harness.get(task_id)
    for attempt in (harness.emit(tt.Event("approval", task_id, nested(252))),
                    harness.resume(task_id, input=nested(MAX_DEPTH + 1))):
        with pytest.raises(tt.InvalidInput, match="nested more than"):
            await attempt
    after = await harness.get(task_id)
    assert (after.version, after.record.status) == (before.version, tt.Status.WAITING)
    assert [e for e in await harness.reads.events(task_id)] == []


async def test_r03_r08_a_payload_at_the_bound_is_committed_and_read_back(
        harness: tt.Harness) -> None:
    """R3, R8: what the bound lets in can be stored: a payload exactly MAX_DEPTH deep ends the
    task's wait, is committed with the head, and reads back equal."""
    from tether.model import MAX_DEPTH

    @harness.agent("waiter")
    class Waiter(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if task.last_event is None:
                return tt.Wait("approval")
            return tt.Finish(task.last_event["payload"])

    deep = nested(MAX_DEPTH)
    task_id = await harness.submit("waiter")
    await harness.run_until_idle()
    receipt = await harness.emit(tt.Event("approval", task_id, deep))
    assert receipt.accepted
    await harness.run_until_idle()
    info = await harness.get(task_id)
    assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == deep

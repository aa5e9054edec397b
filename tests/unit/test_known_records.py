"""R10 (issue 30): the idempotency lookup before every tool call is answered from the keys
the runner knows can have a record, not by a query per call; a key that may have a record
(written in an earlier life of the task, or by the runner itself) is still read from the
store, so a call that ran is never run again."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import tether as tt
from tether.engine.records import KnownRecords
from tether.model import IdempotencyRecord, OutcomeStatus


def counted(store: Any, reads: Counter[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Count the store's idempotency reads (the real store answers them)."""
    for name in ("get_idempotency", "idempotency_keys"):
        real = getattr(store, name)

        async def spy(*args: Any, _real: Any = real, _name: str = name) -> Any:
            reads[_name] += 1
            return await _real(*args)

        monkeypatch.setattr(store, name, spy)


def build(db: Path, calls: int) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}")

    @h.tool(idempotent=True)
    async def note(ctx: tt.ToolContext, n: int) -> int:
        return n

    @h.agent("noter")
    class Noter(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if task.step < calls:
                return tt.ToolCall("note", {"n": task.step})
            return tt.Finish(task.step)

    return h


async def test_a_clean_run_reads_the_keys_once_and_no_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: Counter[str] = Counter()
    async with build(tmp_path / "t.db", 20) as h:
        counted(h.store, reads, monkeypatch)
        task_id = await h.submit("noter")
        await h.run_until_idle()
        assert (await h.get(task_id)).snapshot.result == 20
        assert len(await h.store.list_idempotency(task_id)) == 20
    assert reads == {"idempotency_keys": 1}  # 20 calls, no lookup of a record that cannot exist


async def test_a_key_with_a_record_is_read_from_the_store(tmp_path: Path) -> None:
    async with build(tmp_path / "t.db", 0) as h:
        await h.store.list_tasks()  # open the store
        store = h.store
        record = IdempotencyRecord("t1:root:0", "t1", "note", "h", OutcomeStatus.SUCCEEDED, 7,
                                   None, 1)
        real_keys = store.idempotency_keys

        async def keys(task_id: str) -> set[str]:
            return {"t1:root:0"} if task_id == "t1" else await real_keys(task_id)

        asked: list[str] = []

        async def get(key: str) -> IdempotencyRecord | None:
            asked.append(key)
            return record if key == "t1:root:0" else None

        store.idempotency_keys = keys  # type: ignore[method-assign]
        store.get_idempotency = get  # type: ignore[method-assign]
        known = KnownRecords(store, "t1")
        assert await known.get_idempotency("t1:root:0") == record  # stored before: read
        assert await known.get_idempotency("t1:root:1") is None
        assert asked == ["t1:root:0"]  # the key no record can have was not asked for
        known.recorded("t1:root:1")  # the runner writes one: from now on it is asked for
        assert await known.get_idempotency("t1:root:1") is None
        assert asked == ["t1:root:0", "t1:root:1"]

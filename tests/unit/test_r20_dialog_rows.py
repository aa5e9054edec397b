"""R20 (issue 30): a running task's dialog read when first needed (engine/dialog_rows.py).

The rows counted at load stay in the store until something needs them; rows appended
meanwhile follow them; a store that fails while they are read is the store's failure, never
the agent's (the task is not handed to a person for it).
"""

from __future__ import annotations

from typing import Any

import pytest
from engine_double import FakeTask, ScriptedAgent, make_snap, stored, waiting_task

from tether.engine import recovery
from tether.engine.dialog_rows import DialogRows
from tether.engine.events import apply_event
from tether.errors import CorruptSnapshot, StoreUnavailable
from tether.model import Status

STORED = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def reader(rows: list[dict[str, Any]], reads: list[int]) -> Any:
    async def read() -> list[dict[str, Any]]:
        reads.append(1)
        return [dict(row) for row in rows]

    return read


async def failing() -> list[dict[str, Any]]:
    raise StoreUnavailable("the store is not reachable")


async def test_r20_rows_are_read_once_and_rows_appended_meanwhile_follow_them() -> None:
    reads: list[int] = []
    dialog = DialogRows([], 2, reader([*STORED, {"role": "later", "content": "x"}], reads))
    dialog.append({"role": "tool", "content": "new"})
    assert len(dialog) == 3 and reads == []
    rows = await dialog.rows()
    assert [r["role"] for r in rows] == ["user", "assistant", "tool"]  # only the counted two
    assert await dialog.rows() is rows and reads == [1]


async def test_r20_truncating_keeps_unread_rows_and_refuses_to_drop_them() -> None:
    dialog = DialogRows([], 2, reader(STORED, []))
    dialog.append({"role": "tool", "content": "undone"})
    dialog.truncate(2)
    assert len(dialog) == 2
    with pytest.raises(ValueError, match="never read"):
        dialog.truncate(1)
    assert [r["role"] for r in await dialog.rows()] == ["user", "assistant"]


async def test_r14_r20_a_replaced_dialog_reads_nothing_from_the_store() -> None:
    reads: list[int] = []
    dialog = DialogRows([], 2, reader(STORED, reads))
    dialog.replace([{"role": "user", "content": "version 3"}])
    assert [r["content"] for r in await dialog.rows()] == ["version 3"] and reads == []


async def test_r20_rows_gone_from_the_store_are_named() -> None:
    dialog = DialogRows([], 3, reader(STORED, []), "task t1 version 4")
    with pytest.raises(CorruptSnapshot, match=r"task t1 version 4.*counts 3.*has 2"):
        await dialog.rows()


async def test_r20_r26_a_store_failing_under_check_wait_is_not_the_agents_failure() -> None:
    """A waiting task's agent is asked whether its wait already happened; the store failing
    while the dialog is read for it propagates (the worker rides the outage out) instead of
    handing the task to a person as if the agent had failed."""
    task = waiting_task(ScriptedAgent(found=None))
    task.history = DialogRows([], 80, failing)
    with pytest.raises(StoreUnavailable):
        await recovery.restore(task)
    assert task.snap.status is Status.WAITING


async def test_r20_r26_a_store_failing_under_on_event_is_not_the_agents_failure() -> None:
    task = FakeTask(make_snap(), agents=[ScriptedAgent(answer=None)])
    task.history = DialogRows([], 80, failing)
    with pytest.raises(StoreUnavailable):
        await apply_event(task, stored("user_message", "any news?"))
    assert task.snap.status is Status.RUNNING

"""R20: layered snapshots. Large values (documents, images, base64) are stored apart from the
head, once per content; heads stay small in every kept version; the values are whole again
whenever the task is loaded to run, rolled back or exported."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from _support import fast_settings

import tether as tt
from tether.model import Status

IMAGE = "iVBORw0KGgo" * 30_000  # ~330 KB of base64, in the task's input
REPORT = "lorem ipsum " * 20_000  # ~240 KB, returned by a tool


def app(db: Path, seen: list[Any]) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}", settings=fast_settings(keep_versions=50))

    @h.tool(idempotent=True)
    async def fetch_report(ctx: tt.ToolContext, n: int) -> str:
        return REPORT  # the same large result every time: one blob

    @h.agent("analyst")
    class Analyst(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            seen.append((len(t.input["image"]), len(t.last_tool_result or "")))
            if t.step < 4:
                t.scratch["draft"] = (t.last_tool_result or "")[:100_000]
                return tt.ToolCall("fetch_report", {"n": t.step})
            if t.last_event is None:
                return tt.Wait("approval")
            return tt.Finish({"image": len(t.input["image"]), "draft": len(t.scratch["draft"])})

    return h


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


async def test_r20_large_values_are_stored_once_and_heads_stay_small(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    seen: list[Any] = []
    h = app(db, seen)
    tid = await h.submit("analyst", {"image": IMAGE})
    await h.run_until_idle(timeout=10)
    assert (await h.get(tid)).record.status is Status.WAITING
    heads = [size for _, _, size in await h.store.list_versions(tid)]
    assert len(heads) >= 5 and max(heads) < 8_000, heads  # without layering: > 500 KB each
    assert rows(db, "SELECT COUNT(*) FROM blobs") == [(3,)]  # image, report, draft
    assert all(length == len(IMAGE) for length, _ in seen)
    await h.close()

    h = app(db, seen)  # a restarted worker: the values come back whole
    await h.emit(tt.Event("approval", tid))
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.snapshot.result == {"image": len(IMAGE), "draft": 100_000}
    assert info.snapshot.input == {"image": IMAGE}
    bundle = await h.export(tid)
    assert bundle["snapshot"]["input"]["image"] == IMAGE

    first = (await h.store.list_versions(tid))[2][0]
    await h.rollback(tid, first)  # an old version's values are whole too
    rolled = await h.get(tid)
    assert rolled.snapshot.input == {"image": IMAGE}
    await h.close()


async def test_r20_a_lost_blob_is_named_and_nothing_stored_is_deleted(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    h = app(db, [])
    tid = await h.submit("analyst", {"image": IMAGE})
    await h.run_until_idle(timeout=10)
    await h.close()
    versions = rows(db, "SELECT COUNT(*) FROM snapshots")
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM blobs WHERE length(data) > 300000")  # the image is gone
    h = app(db, [])
    await h.emit(tt.Event("approval", tid))
    await h.run_until_idle(timeout=10)
    record = await h.store.get_task(tid)
    assert record.status is Status.NEEDS_HUMAN
    assert record.reason is not None and "is missing from the blob table" in record.reason
    assert "sha256:" in record.reason and tid in record.reason
    assert rows(db, "SELECT COUNT(*) FROM snapshots") == versions
    await h.close()

"""Bad, damaged and old data (R8, R14, R26, E8; issue 3 section 3).

Each case gives a clear error naming the task and version, recovery falls back to the
newest good version, and nothing stored is deleted by the attempt. A worker that cannot
read a task at all backs off (a snapshot from newer code) or hands it to a person with
its lease released (no readable snapshot), instead of claiming it over and over.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
from _support import fast_settings, wait_until

import tether as tt
from tether.engine.loading import EAGER_ROWS
from tether.model import SNAPSHOT_FORMAT, Snapshot
from tether.store import SQLiteStore

FAST = tt.Settings(poll_interval=0.01, recovery_backoff=0.001)


def _harness(path: Path, paid: list[str] | None = None) -> tt.Harness:
    h = tt.Harness(SQLiteStore(str(path)), settings=FAST)

    @h.tool(side_effect=True)
    async def pay(ctx: tt.ToolContext, n: int) -> int:
        if paid is not None:
            paid.append(ctx.idempotency_key)
        return n

    @h.agent("steps")
    class Steps(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            n = t.scratch.get("n", 0)
            if n == t.input["steps"]:
                return tt.Finish(n)
            t.scratch["n"] = n + 1
            return tt.ToolCall("pay", {"n": n})

    return h


def _rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def _exec(path: Path, sql: str, *params: object) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(sql, params)
    db.close()


async def _finished_task(path: Path, steps: int = 3) -> tuple[str, int]:
    h = _harness(path)
    tid = await h.submit("steps", {"steps": steps})
    await h.run_until_idle(timeout=5)
    version = (await h.get(tid)).version
    await h.close()
    return tid, version


async def status_of(h: tt.Harness, task_id: str) -> tt.Status:
    return (await h.store.get_task(task_id)).status  # the index row: needs no snapshot


async def status_of_is(h: tt.Harness, task_id: str, status: tt.Status) -> bool:
    return await status_of(h, task_id) is status


@pytest.mark.parametrize("damage", ["truncated", "garbled"])
async def test_damaged_newest_head_falls_back_and_deletes_nothing(tmp_path: Path, damage: str) -> None:
    """R14: a truncated or garbled head names task and version; recovery uses the newest good
    one and every stored row is still there afterwards."""
    path = tmp_path / "t.db"
    tid, newest = await _finished_task(path)
    head = _rows(path, f"SELECT head FROM snapshots WHERE version = {newest}")[0][0]
    bad = head[: len(head) // 2] if damage == "truncated" else bytes(b ^ 0x5A for b in head)
    _exec(path, "UPDATE snapshots SET head = ? WHERE version = ?", bad, newest)
    _exec(path, "UPDATE tasks SET status = 'running'")
    rows_before = _rows(path, "SELECT COUNT(*) FROM history")[0][0]

    h = _harness(path)
    shown = await h.get(tid)  # readers see the last good version and the damage by name
    assert shown.version < newest and f"task {tid} version {newest}" in shown.damaged[0]
    await h.run_until_idle(timeout=5)
    log = await h.store.list_recovery_log(tid)
    assert any(r["resume_strategy"] == "fallback_version" and f"version {newest}" in r["detail"]
               for r in log)
    assert (await h.get(tid)).record.status is tt.Status.COMPLETED
    assert _rows(path, f"SELECT head FROM snapshots WHERE version = {newest}")[0][0] == bad
    assert _rows(path, "SELECT COUNT(*) FROM history")[0][0] >= rows_before
    await h.close()


@pytest.mark.parametrize("steps", [4, 50])
async def test_missing_dialog_rows_are_named_and_an_older_complete_version_is_used(
        tmp_path: Path, steps: int) -> None:
    """R8/R14: a head whose dialog rows are missing is treated as damaged (it would resume with
    a hole in the dialog); recovery falls back to a version whose rows are all there. A short
    dialog is read at load; a long one (50 steps) only counted there (R20), which finds the
    hole as well."""
    path = tmp_path / "t.db"
    tid, newest = await _finished_task(path, steps=steps)
    assert (_rows(path, "SELECT COUNT(*) FROM history")[0][0] > EAGER_ROWS) is (steps == 50)
    last_seq = _rows(path, "SELECT MAX(seq) FROM history")[0][0]
    _exec(path, "DELETE FROM history WHERE seq = ?", last_seq)
    _exec(path, "UPDATE tasks SET status = 'running'")
    h = _harness(path)
    await h.run_until_idle(timeout=5)
    log = await h.store.list_recovery_log(tid)
    assert any("dialog rows are missing" in r["detail"] and f"version {newest}" in r["detail"]
               for r in log)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert len(await h.history(tid)) == info.snapshot.history_len
    await h.close()


async def test_head_from_newer_code_is_refused_not_replaced(tmp_path: Path) -> None:
    """E8: a head written by a newer tether is not damage: it is refused by name and left as
    it is, never replaced by an older version."""
    path = tmp_path / "t.db"
    tid, newest = await _finished_task(path)
    raw = orjson.loads(_rows(path, f"SELECT head FROM snapshots WHERE version = {newest}")[0][0])
    raw["format"] = SNAPSHOT_FORMAT + 1
    _exec(path, "UPDATE snapshots SET head = ? WHERE version = ?", orjson.dumps(raw), newest)
    h = _harness(path)
    with pytest.raises(tt.SnapshotTooNew, match=f"task {tid} version {newest}"):
        await h.get(tid)
    await h.close()


async def test_a_format_1_head_is_migrated_on_load_and_the_task_resumes(tmp_path: Path) -> None:
    """E8: snapshots are data; a head written in format 1 (with the per-call fingerprint list
    that format 2 dropped) loads through the migration and its task carries on."""
    path = tmp_path / "t.db"
    paid: list[str] = []
    h = _harness(path, paid)
    tid = await h.submit("steps", {"steps": 3})
    await h.run_until_idle(timeout=5)
    await h.close()
    first_version = _rows(path, "SELECT MIN(version) FROM snapshots")[0][0]
    raw = orjson.loads(_rows(path, f"SELECT head FROM snapshots WHERE version = {first_version}")[0][0])
    raw["format"] = 1
    raw["call"] = {"key": "k", "tool": "pay", "args": {"n": 0}, "args_hash": "x",
                   "status": "planned", "attempt": 0, "retry_at": None, "error": None,
                   "fingerprints": ["pay:abc", "pay:abc"]}
    loaded = Snapshot.loads(orjson.dumps(raw), tid, first_version)
    assert loaded.format == SNAPSHOT_FORMAT and loaded.call is not None
    assert loaded.call.tool == "pay"


async def test_in_doubt_side_effect_with_no_idempotency_record_is_not_repeated(
        tmp_path: Path) -> None:
    """R10: a call in flight at the crash whose idempotency record is gone (pointing nowhere)
    is still in doubt: without a reconcile hook it goes to a person, never re-run blindly."""
    path = tmp_path / "t.db"
    paid: list[str] = []
    h = _harness(path, paid)
    tid = await h.submit("steps", {"steps": 2})
    await h.run_until_idle(timeout=5)
    await h.close()
    versions = [v for (v,) in _rows(path, "SELECT version FROM snapshots ORDER BY version")]
    in_flight = next(v for v in versions if orjson.loads(_rows(
        path, f"SELECT head FROM snapshots WHERE version = {v}")[0][0])["call"])
    # the worker died right after this resume point: later versions and rows never existed
    in_flight_len = Snapshot.loads(_rows(path, f"SELECT head FROM snapshots WHERE version ="
                                         f" {in_flight}")[0][0], tid, in_flight).history_len
    _exec(path, "DELETE FROM snapshots WHERE version > ?", in_flight)
    _exec(path, "DELETE FROM history WHERE seq > ?", in_flight_len)
    _exec(path, "UPDATE tasks SET head_version = ?, status = 'running', lease_owner = 'dead',"
          " lease_until = 0", in_flight)
    _exec(path, "DELETE FROM idempotency")
    paid.clear()
    h = _harness(path, paid)
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "outcome unknown" in (info.record.reason or "")
    assert paid == []
    await h.close()


async def test_bad_events_are_refused_with_a_clear_message_and_nothing_stored(tmp_path: Path) -> None:
    """R3/R7: unknown types, payloads that are not JSON, and huge payloads are refused, naming
    the problem; the inbox is unchanged."""
    h = tt.Harness(SQLiteStore(str(tmp_path / "t.db")),
                   settings=tt.Settings(max_payload_bytes=10_000))

    @h.agent("idle")
    class Idle(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Wait("approval")

    tid = await h.submit("idle")
    with pytest.raises(tt.UnknownEventType, match="made_up"):
        await h.emit(tt.Event("made_up", tid, {}))
    with pytest.raises(tt.InvalidInput, match="not JSON-serialisable"):
        await h.emit(tt.Event("user_message", tid, {"when": object()}))
    with pytest.raises(tt.InvalidInput, match="over the limit"):
        await h.emit(tt.Event("user_message", tid, "x" * 20_000))
    with pytest.raises(tt.InvalidInput, match="task input"):
        await h.submit("idle", {"blob": "y" * 20_000})
    assert await h.store.list_events(tid) == []
    await h.close()


@pytest.mark.parametrize("content", ["not sqlite", "foreign sqlite"])
def test_a_file_that_is_not_a_tether_store_is_refused_and_left_untouched(
        tmp_path: Path, content: str) -> None:
    """A store file that is not a tether database is refused, not overwritten."""
    path = tmp_path / "other.db"
    if content == "not sqlite":
        path.write_bytes(b"these are my notes, not a database\n" * 200)
    else:
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total INTEGER)")
        db.execute("INSERT INTO invoices (total) VALUES (42)")
        db.commit()
        db.close()
    before = path.read_bytes()
    with pytest.raises(tt.StoreError, match=r"other\.db"):
        SQLiteStore(str(path))
    assert path.read_bytes() == before


async def test_e8_snapshot_from_newer_code_makes_an_old_worker_back_off():
    """E8 (r16): a worker that cannot read a snapshot written by newer code leaves the task
    alone for a while (a few claims a second at most, not thousands) and does not change
    the task: a newer worker can still run it."""
    h = tt.Harness("memory://", settings=fast_settings())

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            return tt.Finish(1)

    tid = await h.submit("a")
    head = orjson.loads((await h.store.load_head(tid))[1])
    head["format"] = SNAPSHOT_FORMAT + 1  # written by a newer worker
    h.store._db.execute("UPDATE snapshots SET head = ? WHERE task_id = ?",
                        (orjson.dumps(head), tid))
    original = h.store.claim_many
    claims: list[str] = []

    async def counting_claims(*args: Any, **kwargs: Any) -> Any:
        taken = await original(*args, **kwargs)
        claims.extend(claim.task_id for claim in taken)
        return taken

    h.store.claim_many = counting_claims  # type: ignore[method-assign]
    stop = asyncio.Event()
    server = asyncio.create_task(h.serve(stop=stop))
    await asyncio.sleep(0.8)
    stop.set()
    await server
    assert len(claims) in range(1, 6), f"{len(claims)} claims in 0.8 s"
    record = await h.store.get_task(tid)
    assert record.status is tt.Status.PENDING and record.lease_owner is None
    assert (await h.store.load_head(tid))[1] == orjson.dumps(head)
    await h.close()


async def test_r26_task_without_a_readable_snapshot_goes_to_a_person_lease_released():
    """R26 (r9b): a task whose only snapshot is unreadable cannot be run; instead of being
    claimed and crashed over and over, it ends in needs_human with a reason naming the task,
    and its lease is released."""
    notified: list[dict] = []
    h = tt.Harness("memory://", settings=fast_settings(lease_seconds=0.3),
                   notifier=notified.append)

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            return tt.Finish(1)

    tid = await h.submit("a")
    h.store._db.execute("UPDATE snapshots SET head = x'7b7b' WHERE task_id = ?", (tid,))
    stop = asyncio.Event()
    server = asyncio.create_task(h.serve(stop=stop))
    try:
        await wait_until(lambda: status_of_is(h, tid, tt.Status.NEEDS_HUMAN), timeout=3,
                         what="needs_human")
        await asyncio.sleep(0.4)  # longer than a lease: nobody grabs it again
    finally:
        stop.set()
        await server
    record = await h.store.get_task(tid)
    assert record.status is tt.Status.NEEDS_HUMAN
    assert tid in (record.reason or "") and "snapshot" in (record.reason or ""), record.reason
    assert record.lease_owner is None
    assert len(notified) == 1
    await h.close()

"""A damaged SQLite store is reported as damage (issue 13): CorruptStore naming the file and
saying what to do (``tether check``, restore from a backup), never a traceback, and never
"no such task" for a task the damage hides. Writes are refused once damage is known, so a
damaged file is not written further; ``Store.integrity_check`` lists what is wrong.

The damage is real: pages of a closed store file are overwritten on disk.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tether as tt
from tether.errors import CorruptStore, TaskNotFound
from tether.model import Status, TaskRecord
from tether.store import SQLiteStore, sqlite_integrity
from tether.store.conformance.helpers import claim, commit, head, make_task

TASKS = 300


async def _fill(path: Path) -> None:
    store = SQLiteStore(str(path), synchronous="OFF")
    now = time.time()
    for i in range(TASKS):
        await make_task(store, f"t{i:03d}", created_at=now - TASKS + i)
    lease = await claim(store, "t005", now)
    await commit(store, lease, Status.WAITING, now)
    await store.close()


@pytest.fixture
def healthy(tmp_path: Path) -> Path:
    path = tmp_path / "tether.db"
    asyncio.run(_fill(path))
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the main file
    db.close()
    return path


def _page_size(path: Path) -> int:
    data = path.read_bytes()[16:18]
    size = int.from_bytes(data, "big")
    return 65536 if size == 1 else size


def _root(path: Path, name: str) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?",
                              (name,)).fetchone()[0])
    finally:
        db.close()


def _btree_pages(path: Path, root: int) -> list[int]:
    """Every page of one b-tree (walked from its root through the interior pages' child
    pointers), so the test needs no dbstat."""
    data, size = path.read_bytes(), _page_size(path)
    pages, todo = [], [root]
    while todo:
        page = todo.pop()
        pages.append(page)
        base = (page - 1) * size
        start = base + (100 if page == 1 else 0)
        kind, cells = data[start], int.from_bytes(data[start + 3:start + 5], "big")
        if kind in (0x02, 0x05):  # interior index / table page
            todo.append(int.from_bytes(data[start + 8:start + 12], "big"))
            for n in range(cells):
                offset = int.from_bytes(data[start + 12 + 2 * n:start + 14 + 2 * n], "big")
                todo.append(int.from_bytes(data[base + offset:base + offset + 4], "big"))
    return pages


def _leaf(path: Path, name: str) -> int:
    """A leaf page of a table or index (not its root, which may be all of it)."""
    root = _root(path, name)
    pages = [page for page in _btree_pages(path, root) if page != root]
    assert pages, f"{name} fits in one page; make the test's store larger"
    return pages[-1]


def _smash(path: Path, page: int) -> None:
    size = _page_size(path)
    with open(path, "r+b") as f:
        f.seek((page - 1) * size)
        f.write(b"\xde\xad\xbe\xef" * (size // 4))


def _rename_in_index(path: Path, old: bytes, new: bytes) -> None:
    """Change one key of the tasks' primary-key index in place (its order kept), so the
    index no longer finds the row while the table still holds it."""
    size = _page_size(path)
    raw = bytearray(path.read_bytes())
    for page in _btree_pages(path, _root(path, "sqlite_autoindex_tasks_1")):
        chunk = raw[(page - 1) * size:page * size]
        at = chunk.find(old)
        if at >= 0:
            raw[(page - 1) * size + at:(page - 1) * size + at + len(old)] = new
            path.write_bytes(bytes(raw))
            return
    raise AssertionError(f"{old!r} not found in the index")


def _says_what_to_do(error: BaseException, path: Path) -> None:
    text = str(error)
    assert str(path) in text and "tether check" in text and "backup" in text, text


async def test_a_task_the_damaged_index_hides_is_reported_as_damage_not_as_missing(
        healthy: Path) -> None:
    _rename_in_index(healthy, b"t010", b"t00z")  # t010's index entry now says t00z
    store = SQLiteStore(str(healthy))
    try:
        assert (await store.get_task("t011")).task_id == "t011"  # the rest still reads
        with pytest.raises(TaskNotFound):  # a task that never existed is "not found"...
            await store.get_task("never-was")
        with pytest.raises(CorruptStore) as raised:
            await store.get_task("t010")
        _says_what_to_do(raised.value, healthy)
        with pytest.raises(CorruptStore):
            await store.load_head("t010")
        with pytest.raises(CorruptStore, match="may be lost in the damage"):
            await store.get_task("never-was")  # ...until the store is known to be damaged
        problems = await store.integrity_check()
        assert problems and any("index" in p for p in problems), problems
    finally:
        await store.close()


async def test_reads_of_a_damaged_table_raise_corrupt_store_naming_the_file(
        healthy: Path) -> None:
    _smash(healthy, _leaf(healthy, "tasks"))  # a leaf of tasks
    store = SQLiteStore(str(healthy))  # reads are still allowed: salvage what is readable
    try:
        with pytest.raises(CorruptStore) as raised:
            await store.list_tasks()
        _says_what_to_do(raised.value, healthy)
        assert await store.integrity_check() != []
    finally:
        await store.close()


async def test_a_store_found_damaged_at_open_refuses_every_write_and_is_left_as_it_was(
        healthy: Path) -> None:
    _smash(healthy, _leaf(healthy, "snapshots"))
    before = healthy.read_bytes()
    store = SQLiteStore(str(healthy))
    try:
        record = TaskRecord("new", "echo", Status.PENDING, 1.0, 1.0, 1)
        with pytest.raises(CorruptStore) as raised:
            await store.create_task(record, head("new"))
        _says_what_to_do(raised.value, healthy)
        with pytest.raises(CorruptStore):
            await store.claim("w1", time.time(), 30)
        with pytest.raises(CorruptStore):
            await store.wake_all(Status.WAITING, time.time())
        assert (await store.get_task("t001")).task_id == "t001"  # reads are not refused
    finally:
        await store.close()
    assert healthy.read_bytes() == before
    wal = healthy.with_name(healthy.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0


async def test_damage_met_later_stops_later_writes(healthy: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A file too large to check at open: the first read that meets the damage makes the
    store refuse writes from then on."""
    monkeypatch.setattr(sqlite_integrity, "QUICK_CHECK_MAX_BYTES", 0)
    _smash(healthy, _leaf(healthy, "tasks"))
    store = SQLiteStore(str(healthy))
    try:
        with pytest.raises(CorruptStore):
            await store.list_tasks()
        record = TaskRecord("new", "echo", Status.PENDING, 1.0, 1.0, 1)
        with pytest.raises(CorruptStore, match="refus"):
            await store.create_task(record, head("new"))
    finally:
        await store.close()


def test_a_file_that_is_not_a_database_is_corrupt_store(tmp_path: Path) -> None:
    path = tmp_path / "tether.db"
    asyncio.run(_fill(path))
    raw = bytearray(path.read_bytes())
    raw[:16] = b"not a database!!"  # the header is gone
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptStore) as raised:
        SQLiteStore(str(path))
    _says_what_to_do(raised.value, path)


async def test_a_healthy_store_passes_its_integrity_check(healthy: Path) -> None:
    store = SQLiteStore(str(healthy))
    try:
        assert await store.integrity_check() == []
    finally:
        await store.close()


async def test_a_task_whose_head_row_is_gone_is_named_by_the_integrity_check(
        healthy: Path) -> None:
    db = sqlite3.connect(healthy)
    db.execute("DELETE FROM snapshots WHERE task_id = 't007'")
    db.commit()
    db.close()
    store = SQLiteStore(str(healthy))
    try:
        problems = await store.integrity_check()
        assert len(problems) == 1 and "t007" in problems[0], problems
    finally:
        await store.close()


@pytest.mark.parametrize("command", [["show", "t010"], ["ls"], ["submit", "echo"]])
def test_the_cli_reports_a_damaged_store_in_one_line(healthy: Path, command: list[str]) -> None:
    _rename_in_index(healthy, b"t010", b"t00z")
    _smash(healthy, _leaf(healthy, "tasks"))
    before = healthy.read_bytes()
    app = healthy.parent / "damage_app.py"
    app.write_text("import tether as tt\n\ndef harness(url):\n    h = tt.Harness(url)\n\n"
                   "    @h.agent('echo')\n    class Echo(tt.Agent):\n"
                   "        async def plan(self, t):\n            return tt.Finish(1)\n\n"
                   "    return h\n")
    done = subprocess.run([sys.executable, "-m", "tether", "--store", f"sqlite:///{healthy}",
                           "--app", "damage_app:harness", *command], capture_output=True,
                          text=True, cwd=healthy.parent, timeout=60,
                          env={"PYTHONPATH": str(healthy.parent), "COLUMNS": "300",
                               "PATH": "/usr/bin:/bin"})
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output and "no task" not in output, output
    assert "damaged" in output and "tether check" in output, output
    assert healthy.read_bytes() == before


def test_cli_store_error_classes_are_tether_errors() -> None:
    assert issubclass(CorruptStore, tt.StoreError)


async def test_a_task_whose_head_row_is_gone_goes_to_a_person_instead_of_crash_looping(
        tmp_path: Path) -> None:
    """The worker meets the damage when it loads the task: the task is handed to a person
    naming it, once, instead of its lease lapsing and every worker failing on it in turn."""
    path = tmp_path / "t.db"
    h = tt.Harness(f"sqlite:///{path}", settings=tt.Settings(lease_seconds=0.3,
                                                             poll_interval=0.01))

    @h.agent("echo")
    class Echo(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Finish(1)

    task_id = await h.submit("echo", "x")
    db = sqlite3.connect(path)
    db.execute("DELETE FROM snapshots WHERE task_id = ?", (task_id,))
    db.commit()
    db.close()
    await h.run_until_idle(timeout=20)
    record = await h.store.get_task(task_id)
    assert record.status is Status.NEEDS_HUMAN, record
    assert record.reason is not None and "version 1" in record.reason, record.reason
    await h.close()

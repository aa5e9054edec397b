"""A schema-2 SQLite store (snapshots and history WITHOUT ROWID) is upgraded to schema 3 in
place, losing nothing (R8, R14: every kept version and the whole dialog survive), and a
failed upgrade leaves the store exactly as it was."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import tether as tt
from tether.errors import StoreError
from tether.store.sqlite_schema import SCHEMA_VERSION

SCHEMA_2 = {  # the two tables as schema 2 created them
    "snapshots": """CREATE TABLE snapshots (task_id TEXT NOT NULL, version INTEGER NOT NULL,
        created_at REAL NOT NULL, head BLOB NOT NULL, PRIMARY KEY (task_id, version))
        WITHOUT ROWID""",
    "history": """CREATE TABLE history (task_id TEXT NOT NULL, epoch INTEGER NOT NULL,
        seq INTEGER NOT NULL, entry BLOB NOT NULL, PRIMARY KEY (task_id, epoch, seq))
        WITHOUT ROWID""",
}


def build_app(db: Path) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}", settings=tt.Settings(keep_versions=4))

    @h.tool()
    async def note(ctx: tt.ToolContext, n: int) -> str:
        return f"note {n}"

    @h.agent("noter")
    class Noter(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if task.step < 6:
                return tt.ToolCall("note", {"n": task.step})
            if task.last_event is None:
                return tt.Wait("approval")
            return tt.Finish(task.step)

    return h


def downgrade_to_schema_2(db: Path) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN")
    for name, create in SCHEMA_2.items():
        conn.execute(f"ALTER TABLE {name} RENAME TO {name}_new")
        conn.execute(create)
        conn.execute(f"INSERT INTO {name} SELECT * FROM {name}_new")
        conn.execute(f"DROP TABLE {name}_new")
    conn.execute("UPDATE tether_meta SET value = '2' WHERE key = 'schema_version'")
    conn.execute("COMMIT")
    conn.close()


def layout(db: Path) -> dict[str, str]:
    conn = sqlite3.connect(db)
    rows = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"
                             " AND name IN ('snapshots', 'history')").fetchall())
    version = conn.execute("SELECT value FROM tether_meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    return {**rows, "schema_version": version[0]}


def contents(db: Path) -> tuple[list[tuple], list[tuple]]:
    conn = sqlite3.connect(db)
    snapshots = conn.execute("SELECT * FROM snapshots ORDER BY task_id, version").fetchall()
    history = conn.execute("SELECT * FROM history ORDER BY task_id, epoch, seq").fetchall()
    conn.close()
    return snapshots, history


async def test_a_schema_2_store_is_upgraded_in_place_and_the_task_carries_on(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    async with build_app(db) as h:
        task_id = await h.submit("noter")
        await h.run_until_idle()
    downgrade_to_schema_2(db)
    old = layout(db)
    assert old["schema_version"] == "2" and "WITHOUT ROWID" in old["snapshots"].upper()
    before = contents(db)
    assert len(before[0]) == 4 and len(before[1]) >= 12

    async with build_app(db) as h:
        assert await h.store.count_by_status() == {"waiting": 1}  # opening it upgrades it
        upgraded = layout(db)
        assert upgraded["schema_version"] == SCHEMA_VERSION  # to this tether's, in one go
        assert "WITHOUT ROWID" not in upgraded["snapshots"].upper()
        assert "WITHOUT ROWID" not in upgraded["history"].upper()
        assert contents(db) == before
        oldest = min(v for v, _, _ in await h.store.list_versions(task_id))
        await h.rollback(task_id, oldest)  # a version written by schema 2 is still usable
        await h.run_until_idle()
        assert (await h.get(task_id)).record.status is tt.Status.WAITING
        await h.emit(tt.Event("approval", task_id))
        await h.run_until_idle()
        info = await h.get(task_id)
        assert info.record.status is tt.Status.COMPLETED
        assert info.snapshot.result == 7  # six notes, then the approval
    assert len(contents(db)[0]) == 4  # still only the newest keep_versions kept


async def test_a_failed_upgrade_says_so_and_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    async with build_app(db) as h:
        await h.submit("noter")
        await h.run_until_idle()
    downgrade_to_schema_2(db)
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE history_v2 (x)")  # the upgrade's scratch name is taken
    conn.commit()
    conn.close()
    before, old = contents(db), layout(db)

    with pytest.raises(StoreError, match=r"could not upgrade SQLite store .* schema 3.*left as it"):
        tt.Harness(f"sqlite:///{db}").store  # noqa: B018 (opening the store runs the upgrade)
    assert contents(db) == before and layout(db) == old


def downgrade_to_schema_4(db: Path) -> None:
    """The schedules table as schema 4 made it: no column for the worker holding one."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute("ALTER TABLE schedules DROP COLUMN claimed_until")
    conn.execute("UPDATE tether_meta SET value = '4' WHERE key = 'schema_version'")
    conn.execute("COMMIT")
    conn.close()


async def test_a_schema_4_store_gains_schedule_claims_and_keeps_its_schedules(
        tmp_path: Path) -> None:
    db = tmp_path / "four.db"
    async with build_app(db) as h:
        await h.schedule("hourly", "0 * * * *", "noter", timezone="UTC")
    downgrade_to_schema_4(db)

    async with build_app(db) as h:
        (kept,) = await h.store.list_schedules()  # opening the store upgrades it
        assert layout(db)["schema_version"] == SCHEMA_VERSION
        assert kept.name == "hourly" and kept.next_at is not None
        taken = await h.store.claim_due_schedules(kept.next_at, hold=60.0)
        assert [s.name for s in taken] == ["hourly"]
        assert await h.store.claim_due_schedules(kept.next_at + 1) == []  # held by the first


def test_r08_the_schema_sql_is_read_from_the_package_folder_or_through_its_loader(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30: a resumed process reads the schema straight from the package's folder (the
    import machinery's readers cost a resume milliseconds); where the package is no folder
    (a zip), its loader gives the same text."""
    from importlib import resources

    from tether.store import sqlite_schema

    shipped = resources.files("tether.store").joinpath("sql/sqlite_schema.sql").read_text()
    read: list[Path] = []
    real_read = Path.read_text

    def reading(path: Path, *args: object, **kwargs: object) -> str:
        read.append(path)
        return real_read(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", reading)
    sqlite_schema._sql.cache_clear()
    assert sqlite_schema._sql("sqlite_schema.sql") == shipped
    assert read == [Path(sqlite_schema.__file__).with_name("sql") / "sqlite_schema.sql"]
    monkeypatch.setattr(Path, "is_file", lambda path: False)  # as inside a zip
    sqlite_schema._sql.cache_clear()
    assert sqlite_schema._sql("sqlite_schema.sql") == shipped
    sqlite_schema._sql.cache_clear()


def downgrade_to_schema_6(db: Path) -> None:
    """Snapshots keyed by (task, version) and idempotency indexed by task, as schema 6 had
    them."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute("ALTER TABLE snapshots RENAME TO snapshots_new")
    conn.execute("DROP INDEX snapshots_by_task")
    conn.execute("CREATE TABLE snapshots (task_id TEXT NOT NULL, version INTEGER NOT NULL,"
                 " created_at REAL NOT NULL, head BLOB NOT NULL, PRIMARY KEY (task_id, version))")
    conn.execute("INSERT INTO snapshots SELECT * FROM snapshots_new")
    conn.execute("DROP TABLE snapshots_new")
    conn.execute("CREATE INDEX idempotency_by_task ON idempotency (task_id)")
    conn.execute("UPDATE tether_meta SET value = '6' WHERE key = 'schema_version'")
    conn.execute("COMMIT")
    conn.close()


def indexes(db: Path) -> set[str]:
    conn = sqlite3.connect(db)
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    conn.close()
    return names


async def test_a_schema_6_store_loses_the_version_key_and_the_index_by_task_and_nothing_else(
        tmp_path: Path) -> None:
    """Issue 30 (R8, R10, R14): schema 7 rewrites a head in the row of the version it replaces
    without an index entry to move, and finds a task's call records by their keys. A schema-6
    file is rebuilt so on opening: every kept version, the dialog and the call records are
    still there, an older version can be rolled back to, and the task finishes answering its
    calls from their records."""
    db = tmp_path / "six.db"
    async with build_app(db) as h:
        task_id = await h.submit("noter")
        await h.run_until_idle()
        keys = await h.store.idempotency_keys(task_id)
    downgrade_to_schema_6(db)
    assert "PRIMARY KEY" in layout(db)["snapshots"] and "idempotency_by_task" in indexes(db)
    before = contents(db)

    async with build_app(db) as h:
        assert await h.store.count_by_status() == {"waiting": 1}  # opening it upgrades it
        assert layout(db)["schema_version"] == SCHEMA_VERSION
        assert "PRIMARY KEY" not in layout(db)["snapshots"].upper()
        assert "idempotency_by_task" not in indexes(db) and "snapshots_by_task" in indexes(db)
        assert contents(db) == before
        assert len(keys) == 6 and await h.store.idempotency_keys(task_id) == keys
        oldest = min(v for v, _, _ in await h.store.list_versions(task_id))
        await h.rollback(task_id, oldest)
        await h.run_until_idle()
        await h.emit(tt.Event("approval", task_id))
        await h.run_until_idle()
        info = await h.get(task_id)
        assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == 7
        reused = [r for r in await h.store.list_recovery_log(task_id)
                  if r["resume_strategy"] == "reuse_result"]
        assert reused  # the calls redone after the rollback were answered from their records
    assert len(contents(db)[0]) == 4


async def test_a_store_stopped_between_the_rebuild_and_its_missing_columns_is_finished_later(
        tmp_path: Path) -> None:
    """Issue 30 (R8): the snapshots rebuild is its own transaction, before the columns an
    older schema lacks are added. A store stopped in between (a kill, or the lock held by
    another process past the busy timeout) must not look current: the next open adds the
    columns and only then raises the version."""
    from tether.store import sqlite_schema

    db = tmp_path / "four.db"
    async with build_app(db) as h:
        await h.schedule("hourly", "0 * * * *", "noter", timezone="UTC")
    downgrade_to_schema_6(db)
    downgrade_to_schema_4(db)
    conn = sqlite3.connect(db, isolation_level=None)
    sqlite_schema._upgrade_layout(conn, str(db))  # the rebuild alone, then stopped
    assert "PRIMARY KEY" not in layout(db)["snapshots"].upper()
    assert not sqlite_schema._is_current(conn)
    conn.close()

    async with build_app(db) as h:
        (kept,) = await h.store.list_schedules()
        assert layout(db)["schema_version"] == SCHEMA_VERSION
        assert await h.store.claim_due_schedules(kept.next_at, hold=60.0)  # its column is back

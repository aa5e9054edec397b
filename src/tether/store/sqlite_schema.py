"""The SQLite store's schema: refuse a file that is not ours, create the tables, upgrade an
older layout in place. The SQL lives in ``sql/``."""

from __future__ import annotations

import functools
import re
import sqlite3
from importlib import resources
from pathlib import Path

from tether.errors import CorruptStore, StoreError
from tether.store import sqlite_integrity
from tether.store.sqlite_faults import DAMAGE, Damage, classify, damaged, what_to_do
from tether.store.sqlite_group_commit import write_transaction

SCHEMA_VERSION = "7"  # 2: the blob table (R20); 3: snapshots and history as rowid tables;
# 4: the named limits shared by all workers and the cron schedules; 5: schedules held by the
# worker starting them, and each limit's size; 6: LangGraph checkpoints (TetherSaver);
# 7: snapshots indexed by task only, idempotency records found by their keys' prefix


PAGE_SIZE = 2048
"""Bytes per page of a store this tether creates. A step touches about ten pages (its dialog
rows, its call record, its head, the task row and their indexes), and each is written whole
to the log and synced: 2 KB pages wrote 25% fewer bytes a step than SQLite's 4 KB and took
about 5% less time, and the file came out no larger (issue 30). 1 KB pages wrote fewer still
but made the file 30% larger, and would split a typical model message over several overflow
pages."""


@functools.cache
def _sql(name: str) -> str:
    """A shipped SQL file, read once per process: straight from the package's folder, since
    the first read through importlib.resources imports its readers and ``zipfile`` (1.4 to
    4 ms, a tenth of resuming a long task); through importlib.resources only where the
    package is not a folder (installed as a zip)."""
    beside = Path(__file__).with_name("sql") / name
    if beside.is_file():
        return beside.read_text()
    return resources.files("tether.store").joinpath(f"sql/{name}").read_text()


@functools.cache
def _schema_names() -> frozenset[str]:
    """The tables and indexes the schema script creates."""
    return frozenset(re.findall(r"CREATE (?:UNIQUE )?(?:TABLE|INDEX) IF NOT EXISTS (\w+)",
                                _sql("sqlite_schema.sql")))


def prepare(db: sqlite3.Connection, path: str, synchronous: str, busy_timeout_ms: int,
            damage: Damage) -> None:
    """Make a newly opened connection ready: refuse a foreign or newer file, check a small
    one for damage (sqlite_integrity), then create or upgrade the schema. A damaged file is
    only read from then on: nothing is written to it, not even the schema. On failure the
    connection is closed and the error is a StoreError."""
    try:
        db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        refuse_foreign_database(db, path)
        db.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        found = sqlite_integrity.check_at_open(db, path)
        if found is not None:
            damage.note(damaged(path, found))
            return
        if _is_new(db):  # only an empty file can take it; a store keeps the size it was made with
            db.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        if path != ":memory:":
            db.execute("PRAGMA journal_mode = WAL")
        create_or_upgrade(db, path)
    except sqlite3.Error as exc:
        db.close()
        raise classify(exc, path) from exc
    except StoreError:
        db.close()
        raise


def refuse_foreign_database(db: sqlite3.Connection, path: str) -> None:
    """Refuse, before writing a byte, a file that is not a tether store (or a newer one)."""
    try:
        tables = {row[0] for row in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as exc:
        db.close()
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF not in DAMAGE:
            raise classify(exc, path) from exc
        raise CorruptStore(f"{path!r} is not a readable SQLite database ({exc}); nothing was"
                           f" written to it. If it is your tether store, it is damaged:"
                           f" {what_to_do(path)}") from exc
    if tables and "tether_meta" not in tables:
        db.close()
        raise StoreError(f"{path!r} is a SQLite database but not a tether store (it has"
                         f" tables {', '.join(sorted(tables)[:5])}); refusing to touch it")
    if "tether_meta" in tables:
        _check_schema_version(db, path)


def create_or_upgrade(db: sqlite3.Connection, path: str) -> None:
    """Bring the file to this schema: new tables are created, an older layout rebuilt. A
    file already at this schema is only read (so opening it needs no write lock, and a
    damaged file is not written to by being opened)."""
    if _is_current(db):
        return
    _upgrade_layout(db, path)
    try:
        db.executescript(_sql("sqlite_schema.sql"))
    except sqlite3.Error as exc:
        raise classify(exc, path, "; the schema could not be created") from exc
    with write_transaction(db, path):
        _add_missing_columns(db)
        db.execute("INSERT OR IGNORE INTO tether_meta (key, value) VALUES ('schema_version', ?)",
                   (SCHEMA_VERSION,))
        db.execute(  # an older store just gained the newer tables: it is this version now
            "UPDATE tether_meta SET value = ? WHERE key = 'schema_version'"
            " AND CAST(value AS INTEGER) < ?", (SCHEMA_VERSION, int(SCHEMA_VERSION)))


ADDED_COLUMNS = {("schedules", "claimed_until"): "REAL", ("limit_locks", "size"): "TEXT"}
"""Columns a later schema added to a table an earlier one created (CREATE TABLE IF NOT
EXISTS leaves an existing table as it was)."""


def _add_missing_columns(db: sqlite3.Connection) -> None:
    for (table, column), kind in ADDED_COLUMNS.items():
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def _is_new(db: sqlite3.Connection) -> bool:
    """Nothing in the file yet (a new file, or ``:memory:``)."""
    return db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is None


def _is_current(db: sqlite3.Connection) -> bool:
    """At this schema version, with every table and index the schema script creates."""
    names = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    if "tether_meta" not in names:
        return False
    row = db.execute("SELECT value FROM tether_meta WHERE key = 'schema_version'").fetchone()
    return row is not None and row[0] == SCHEMA_VERSION and _schema_names() <= names


def _upgrade_layout(db: sqlite3.Connection, path: str) -> None:
    """Rebuild the tables an older schema laid out otherwise: WITHOUT ROWID (schema 2, see
    ``sqlite_v3_rowid_tables.sql``), then versions in the snapshots' key (schema 6 and
    before, see ``sqlite_v7_unkeyed_versions.sql``). Each rebuild is one transaction."""
    if any("WITHOUT ROWID" in sql.upper() for sql in _layouts(db).values()):
        _rebuild(db, path, "sqlite_v3_rowid_tables.sql", 3)
    if "PRIMARY KEY" in _layouts(db).get("snapshots", "").upper():
        _rebuild(db, path, "sqlite_v7_unkeyed_versions.sql", 7)


def _layouts(db: sqlite3.Connection) -> dict[str, str]:
    return dict(db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"
                           " AND name IN ('snapshots', 'history')").fetchall())


def _rebuild(db: sqlite3.Connection, path: str, script: str, schema: int) -> None:
    try:
        db.executescript(_sql(script))
    except sqlite3.Error as exc:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise StoreError(f"could not upgrade SQLite store {path!r} to schema {schema}:"
                         f" {exc}; it was left as it was") from exc


def _check_schema_version(db: sqlite3.Connection, path: str) -> None:
    row = db.execute("SELECT value FROM tether_meta WHERE key = 'schema_version'").fetchone()
    if row is not None and int(row[0]) > int(SCHEMA_VERSION):
        db.close()
        raise StoreError(f"store {path!r} has schema version {row[0]}, newer than this"
                         f" tether ({SCHEMA_VERSION}); upgrade tether to open it")

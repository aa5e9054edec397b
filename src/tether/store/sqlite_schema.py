"""The SQLite store's schema: refuse a file that is not ours, create the tables, upgrade an
older layout in place. The SQL lives in ``sql/``."""

from __future__ import annotations

import sqlite3
from importlib import resources

from tether.errors import StoreError
from tether.store.sqlite_group_commit import write_transaction

SCHEMA_VERSION = "3"  # 2: the blob table (R20); 3: snapshots and history as rowid tables


def _sql(name: str) -> str:
    return resources.files("tether.store").joinpath(f"sql/{name}").read_text()


def refuse_foreign_database(db: sqlite3.Connection, path: str) -> None:
    """Refuse, before writing a byte, a file that is not a tether store (or a newer one)."""
    try:
        tables = {row[0] for row in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        db.close()
        raise StoreError(f"{path!r} is not a SQLite database ({exc}); nothing was"
                         " written to it") from exc
    if tables and "tether_meta" not in tables:
        db.close()
        raise StoreError(f"{path!r} is a SQLite database but not a tether store (it has"
                         f" tables {', '.join(sorted(tables)[:5])}); refusing to touch it")
    if "tether_meta" in tables:
        _check_schema_version(db, path)


def create_or_upgrade(db: sqlite3.Connection, path: str) -> None:
    """Bring the file to this schema: new tables are created, an older layout rebuilt."""
    _upgrade_layout(db, path)
    try:
        db.executescript(_sql("sqlite_schema.sql"))
    except sqlite3.Error as exc:
        raise StoreError(f"SQLite store {path!r} is busy or unwritable: {exc}") from exc
    with write_transaction(db, path):
        db.execute("INSERT OR IGNORE INTO tether_meta (key, value) VALUES ('schema_version', ?)",
                   (SCHEMA_VERSION,))
        db.execute(  # an older store just gained the newer tables: it is this version now
            "UPDATE tether_meta SET value = ? WHERE key = 'schema_version'"
            " AND CAST(value AS INTEGER) < ?", (SCHEMA_VERSION, int(SCHEMA_VERSION)))


def _upgrade_layout(db: sqlite3.Connection, path: str) -> None:
    """Rebuild the tables a schema-2 store kept WITHOUT ROWID (see the script's header)."""
    layouts = dict(db.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table'"
        " AND name IN ('snapshots', 'history')").fetchall())
    if any("WITHOUT ROWID" in sql.upper() for sql in layouts.values()):
        try:
            db.executescript(_sql("sqlite_v3_rowid_tables.sql"))
        except sqlite3.Error as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise StoreError(f"could not upgrade SQLite store {path!r} to schema 3:"
                             f" {exc}; it was left as it was") from exc


def _check_schema_version(db: sqlite3.Connection, path: str) -> None:
    row = db.execute("SELECT value FROM tether_meta WHERE key = 'schema_version'").fetchone()
    if row is not None and int(row[0]) > int(SCHEMA_VERSION):
        db.close()
        raise StoreError(f"store {path!r} has schema version {row[0]}, newer than this"
                         f" tether ({SCHEMA_VERSION}); upgrade tether to open it")

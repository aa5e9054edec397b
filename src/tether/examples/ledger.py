"""A stand-in payment provider: a SQLite file the harness does not own.

It deliberately does *not* deduplicate by idempotency key, like many real
payment APIs without that feature: sending the same refund twice pays twice.
That makes it a fair witness. Only tether's own guards (resume points,
idempotency records, ``reconcile``) stand between a crash and a double refund.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any


class Ledger:
    """Refunds, as the outside world saw them."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout = 10000")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS refunds (id INTEGER PRIMARY KEY, order_id TEXT NOT NULL,"
            " cents INTEGER NOT NULL, reference TEXT NOT NULL, at REAL NOT NULL)"
        )

    def refund(self, order_id: str, cents: int, reference: str) -> dict[str, Any]:
        """Pay out. The reference is stored for lookups but duplicates are not refused."""
        cursor = self._db.execute(
            "INSERT INTO refunds (order_id, cents, reference, at) VALUES (?, ?, ?, ?)",
            (order_id, cents, reference, time.time()),
        )
        return {"refund_id": cursor.lastrowid, "order_id": order_id, "cents": cents}

    def find(self, reference: str) -> dict[str, Any] | None:
        row = self._db.execute(
            "SELECT id, order_id, cents FROM refunds WHERE reference = ? ORDER BY id LIMIT 1",
            (reference,),
        ).fetchone()
        return {"refund_id": row[0], "order_id": row[1], "cents": row[2]} if row else None

    def count(self, order_id: str) -> int:
        return int(self._db.execute(
            "SELECT COUNT(*) FROM refunds WHERE order_id = ?", (order_id,)).fetchone()[0])

    def all(self) -> list[tuple[str, int, str]]:
        return [(r[0], r[1], r[2]) for r in self._db.execute(
            "SELECT order_id, cents, reference FROM refunds ORDER BY id")]

    def close(self) -> None:
        self._db.close()

"""Long-term memory (R18): facts an agent recalls by search, kept out of every snapshot.

A :class:`Memory` has two methods, ``add`` and ``search``. :class:`ChatAgent` searches it
with the newest user text each time it builds a prompt and puts the hits in a system
message for that one request: they reach the model, never the task's snapshot or dialog,
so snapshots stay small however much is remembered.

:class:`SQLiteMemory` is the default (SQLite's FTS5 full-text index, ranked by BM25). A
vector store plugs in by implementing the same two methods, say::

    class PgVectorMemory:
        async def add(self, text, metadata=None): ...   # embed, INSERT
        async def search(self, query, limit=5): ...     # embed, ORDER BY embedding <=> $1
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson


@dataclass(frozen=True)
class Recollection:
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    score: float = 0.0


class Memory(Protocol):
    async def add(self, text: str, metadata: dict[str, Any] | None = None) -> None:
        """Remember *text*."""

    async def search(self, query: str, limit: int = 5) -> list[Recollection]:
        """The remembered texts most relevant to *query*, best first."""


class SQLiteMemory:
    """Full-text memory in one SQLite file (FTS5, BM25 ranking)."""

    def __init__(self, path: str = ":memory:") -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS memory USING fts5(text, metadata"
                         " UNINDEXED)")

    async def add(self, text: str, metadata: dict[str, Any] | None = None) -> None:
        self._db.execute("INSERT INTO memory (text, metadata) VALUES (?, ?)",
                         (text, orjson.dumps(metadata or {}).decode()))

    async def search(self, query: str, limit: int = 5) -> list[Recollection]:
        words = re.findall(r"\w+", query.lower())
        if not words:
            return []
        match = " OR ".join(f'"{word}"' for word in words)  # quoted: no FTS syntax from users
        rows = self._db.execute("SELECT text, metadata, bm25(memory) FROM memory WHERE memory"
                                " MATCH ? ORDER BY bm25(memory) LIMIT ?", (match, limit)).fetchall()
        return [Recollection(text, orjson.loads(meta), -score) for text, meta, score in rows]

    def close(self) -> None:
        self._db.close()

"""A running task's dialog, read from the store only when something needs its rows.

Resuming a long task used to read and decode its whole dialog (two thousand rows, a megabyte
for a thousand steps) before its call could run again, though the call needs none of it. At
load the runner now only counts the rows (so a version whose rows are missing still falls
back to an older one) and reads them the first time something needs them: an agent's hook,
a repeated side effect's check, a person's answer from an earlier call. Rows appended
meanwhile (the call's result, an event) follow the unread ones, which keep their place.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tether.errors import CorruptSnapshot

Reader = Callable[[], Awaitable[list[dict[str, Any]]]]


class DialogRows:
    """The dialog: the first *unread* rows still in the store (*read* fetches them, at least
    that many, in order), then the rows in memory. One list object holds the rows once read,
    for as long as the task runs here: a view of it sees rows appended or replaced later."""

    def __init__(self, rows: list[dict[str, Any]], unread: int = 0,
                 read: Reader | None = None, where: str = "") -> None:
        if unread and read is None:
            raise ValueError("unread dialog rows need a reader")
        self._rows = rows
        self._unread = unread
        self._read = read
        self._where = where

    def __len__(self) -> int:
        return self._unread + len(self._rows)

    async def rows(self) -> list[dict[str, Any]]:
        """Every row, in order (read from the store the first time it is asked)."""
        if self._unread:
            assert self._read is not None
            found = await self._read()
            if len(found) < self._unread:
                raise CorruptSnapshot(f"{self._where}: dialog rows went missing while the task"
                                      f" ran (the head counts {self._unread}, the store has"
                                      f" {len(found)})")
            self._rows[:0] = found[:self._unread]
            self._unread, self._read = 0, None
        return self._rows

    def append(self, row: dict[str, Any]) -> None:
        self._rows.append(row)

    def truncate(self, length: int) -> None:
        """Drop the rows after the first *length* (appended since, never unread ones)."""
        if length < self._unread:
            raise ValueError("cannot drop dialog rows that were never read")
        del self._rows[length - self._unread:]

    def replace(self, rows: list[dict[str, Any]]) -> None:
        """The dialog is *rows* now (a rollback): nothing is left to read."""
        self._rows[:] = rows
        self._unread, self._read = 0, None

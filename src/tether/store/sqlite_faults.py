"""What the SQLite store says when its file fails it (issue 13).

Every ``sqlite3`` error leaving the store is one of three :class:`StoreError` kinds:

- :class:`StoreUnavailable` for what passes by itself: the write lock held by another
  process past the busy timeout (``SQLITE_BUSY``/``SQLITE_LOCKED``), a full disk. Workers
  ride it out with back-off.
- :class:`CorruptStore` for damage: "database disk image is malformed" (``SQLITE_CORRUPT``)
  or "file is not a database" (``SQLITE_NOTADB``), naming the file and what to do. Once a
  store has met damage it refuses every write (writing into a damaged b-tree spreads the
  damage) while reads go on, so whatever is still readable can be looked at and exported.
- plain :class:`StoreError` for anything else (a read-only file, a schema problem).
"""

from __future__ import annotations

import functools
import inspect
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tether.errors import CorruptStore, StoreError, StoreUnavailable

TRANSIENT = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_FULL,
                       sqlite3.SQLITE_PROTOCOL})
DAMAGE = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})

C = TypeVar("C", bound=type)


def _primary(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def what_to_do(path: str) -> str:
    return (f"run `tether check` on it (tether --store sqlite:///{path} check) to see what is"
            " affected, and restore the file from a backup")


def damaged(path: str, detail: str) -> CorruptStore:
    return CorruptStore(f"SQLite store {path!r} is damaged ({detail}): {what_to_do(path)}")


def classify(exc: sqlite3.Error, path: str, outcome: str = "") -> StoreError:
    """The StoreError for *exc*; *outcome* ends the message (say, "; nothing was written")."""
    code, text = _primary(exc), str(exc)
    if code in DAMAGE or (code is None and ("malformed" in text or "not a database" in text)):
        return damaged(path, text)
    if code in TRANSIENT or (code is None and "locked" in text):
        why = " (another process held the write lock past the busy timeout)" \
            if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) else ""
        return StoreUnavailable(f"SQLite store {path!r} is unavailable for now: {text}{why}"
                                f"{outcome}")
    return StoreError(f"SQLite store {path!r}: {text}{outcome}")


class Damage:
    """Damage seen on one store file: once found, writes are refused."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.found: str | None = None

    def note(self, error: StoreError) -> StoreError:
        if isinstance(error, CorruptStore) and self.found is None:
            self.found = str(error)
        return error

    def refuse_writes(self) -> None:
        if self.found is not None:
            raise CorruptStore(f"refusing to write (it would spread the damage): {self.found}")


def guarded(cls: C) -> C:
    """Wrap every public coroutine method of a store class (with a ``damage`` attribute),
    its own and those it inherits (the methods shared with other SQL backends), so that no
    raw ``sqlite3`` error escapes it, and damage met anywhere is remembered."""
    for name in dir(cls):
        method = getattr(cls, name)
        if not name.startswith("_") and inspect.iscoroutinefunction(method):
            setattr(cls, name, _guard(method))
    return cls


def _guard(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def guarded_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        damage: Damage = self.damage
        try:
            return await method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise damage.note(classify(exc, damage.path)) from exc
        except CorruptStore as error:
            damage.note(error)
            raise

    return guarded_method

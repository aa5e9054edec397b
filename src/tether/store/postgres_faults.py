"""What the PostgreSQL store says when the server fails it (issue 13).

Every psycopg error leaving the store is a :class:`StoreError`; the ones that pass by
themselves are :class:`StoreUnavailable`, which workers ride out with back-off:

- the connection refused, reset or lost, the server shutting down or starting up
  (SQLSTATE classes 08, 57P01-57P03/57P05), out of connections or disk (53), a system error
  (58), a statement cancelled (57014), a serialization failure or deadlock (40001, 40P01),
  a session ended for idling in a transaction (25P03), no connection free in the pool;
- everything else is permanent (a missing table, a permission, bad SQL): plain StoreError.

psycopg reports a failed connection attempt without a SQLSTATE, so those are told apart by
what the server said: a ``FATAL`` about the login (no such database or role, a password, no
``pg_hba.conf`` entry) is configuration, not an outage; a refused or timed-out connection,
or a server starting up or shutting down, is an outage.

The pool's own reconnect attempts log a warning each (``psycopg.pool``); the worker logs
an outage once when it begins and once when it ends, so :func:`quiet_pool_log` drops them.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout

from tether.errors import StoreError, StoreUnavailable

_TRANSIENT_CLASSES = ("08", "53", "58")
_TRANSIENT_CODES = frozenset({"40001", "40P01", "57P01", "57P02", "57P03", "57P05", "57014",
                              "25P03"})
_PASSING_FATAL = ("the database system is", "too many clients", "remaining connection slots",
                  "terminating connection", "not yet accepting connections")
_POOL_CHATTER = ("error connecting in", "discarding closed connection",
                 "discarding broken connection", "reconnection attempt in pool")


def transient(exc: BaseException) -> bool:
    """Whether *exc* (from psycopg or its pool) may pass by itself."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    if state is not None:
        return state.startswith(_TRANSIENT_CLASSES) or state in _TRANSIENT_CODES
    if not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    text = str(exc)
    return "FATAL:" not in text or any(phrase in text for phrase in _PASSING_FATAL)


def connection_lost(exc: BaseException) -> bool:
    """Whether *exc* says a connection broke (the pool's idle ones may be broken too)."""
    if isinstance(exc, PoolTimeout) or not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    if state is None:
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    return state.startswith("08") or state in ("57P01", "57P02")


def classify(exc: BaseException, where: str, outcome: str = "") -> StoreError:
    """The StoreError for *exc*; *outcome* ends the message (say, "; nothing was written")."""
    text = " ".join(str(exc).split())
    if transient(exc):
        return StoreUnavailable(f"PostgreSQL store {where} is unavailable for now: {text}"
                                f"{outcome}")
    return StoreError(f"PostgreSQL store {where}: {text}{outcome}")


async def probe(url: str, where: str, options: str) -> StoreError | None:
    """Connect once, outside the pool, to learn why the pool has no connection to give (it
    keeps its own connection errors to itself): None if the server answers."""
    try:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=5,
                                                     options=options)
    except psycopg.Error as exc:
        return classify(exc, where)
    await conn.close()
    return None


class _QuietPool(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message: Any = record.msg
        return not (isinstance(message, str) and message.startswith(_POOL_CHATTER))


_QUIET = _QuietPool()


def quiet_pool_log() -> None:
    """Drop the pool's per-attempt connection warnings (idempotent)."""
    logger = logging.getLogger("psycopg.pool")
    if _QUIET not in logger.filters:
        logger.addFilter(_QUIET)

"""A real MCP server (the mcp SDK's MCPServer) for tests/integration/test_mcp_tools.py.

    python _mcp_server.py                 # over stdio
    python _mcp_server.py http PORT       # over streamable HTTP on 127.0.0.1:PORT

A payment provider in miniature. Refunds go to a SQLite ledger (``MCP_LEDGER``) with the
idempotency key the client sent in the request's ``_meta``; a key seen before returns the
refund it made, so the provider deduplicates by key. ``slow_refund`` writes its refund and
then hangs, so a test can kill the server after the effect landed and before the answer.
The server writes its pid to ``MCP_PIDFILE`` when it starts (a new process, a new pid).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, TypedDict

import anyio
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel

META_KEY = "tether.dev/idempotency-key"  # what tether.integrations.mcp sends

server = MCPServer("ledger", version="2.1.0", log_level="WARNING")


class Balance(TypedDict):
    order: str
    refunded: int
    refunds: int


class Refund(TypedDict):
    refund_id: int
    order: str
    cents: int
    key: str | None
    duplicate: bool


@contextmanager
def ledger() -> Iterator[sqlite3.Connection]:
    """The ledger, autocommitting: a refund is on disk before the tool answers."""
    db = sqlite3.connect(os.environ["MCP_LEDGER"], timeout=30, isolation_level=None)
    try:
        db.execute("CREATE TABLE IF NOT EXISTS refunds (id INTEGER PRIMARY KEY, key TEXT UNIQUE,"
                   " order_id TEXT NOT NULL, cents INTEGER NOT NULL)")
        db.execute("CREATE TABLE IF NOT EXISTS flags (name TEXT PRIMARY KEY, value INTEGER)")
        yield db
    finally:
        db.close()


def key_of(ctx: Context) -> str | None:
    meta = ctx.request_context.meta or {}
    key = meta.get(META_KEY)
    return key if isinstance(key, str) else None


def pay(order: str, cents: int, key: str | None) -> tuple[Refund, bool]:
    """The refund under *key*, made now or found from before (then ``duplicate``)."""
    if cents <= 0:
        raise ToolError(f"cents must be positive, got {cents}")
    with ledger() as db:
        row = db.execute("SELECT id, order_id, cents FROM refunds WHERE key = ?",
                         (key,)).fetchone() if key else None
        if row is not None:
            return Refund(refund_id=row[0], order=row[1], cents=row[2], key=key,
                          duplicate=True), False
        cursor = db.execute("INSERT INTO refunds (key, order_id, cents) VALUES (?, ?, ?)",
                            (key, order, cents))
        assert cursor.lastrowid is not None
        return Refund(refund_id=cursor.lastrowid, order=order, cents=cents, key=key,
                      duplicate=False), True


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def read_balance(order: str) -> Balance:
    """How much has been refunded on an order."""
    with ledger() as db:
        total, count = db.execute("SELECT COALESCE(SUM(cents), 0), COUNT(*) FROM refunds"
                                  " WHERE order_id = ?", (order,)).fetchone()
    return Balance(order=order, refunded=total, refunds=count)


@server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False),
             structured_output=False)
def set_flag(name: str, value: bool) -> str:
    """Set a named flag (setting it twice is the same as once)."""
    with ledger() as db:
        db.execute("INSERT OR REPLACE INTO flags VALUES (?, ?)", (name, int(value)))
    return f"flag {name} is {'on' if value else 'off'}"


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def refund(order: str, cents: int, ctx: Context) -> Refund:
    """Refund an order; a repeated idempotency key returns the first refund."""
    return pay(order, cents, key_of(ctx))[0]


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
async def slow_refund(order: str, cents: int, ctx: Context) -> Refund:
    """Refund an order, then take an hour to answer (a new key only: a known one answers
    at once with the refund it made)."""
    made, new = pay(order, cents, key_of(ctx))
    if new:
        await anyio.sleep(3600)
    return made


class Label(BaseModel):
    text: str
    color: Literal["red", "green"]


@server.tool(annotations=ToolAnnotations(idempotent_hint=True))
def label_order(order: str, label: Label, note: str = "") -> str:
    """Put a label on an order (its schema has $defs: a nested type)."""
    return f"{order}: {label.text} ({label.color}){note}"


@server.tool()
def notify(text: str) -> list[str]:
    """No annotations at all: the spec's defaults (destructive, open world)."""
    return [f"sent: {text}", "queued"]


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def logo() -> Image:
    """A tiny image: not text."""
    return Image(data=b"\x89PNG fake image bytes", format="png")


if __name__ == "__main__":
    pidfile = os.environ["MCP_PIDFILE"]
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pidfile + ".tmp", pidfile)  # a reader never sees half a pid
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")

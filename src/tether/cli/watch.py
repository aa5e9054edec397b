"""``tether watch ID``: follow a task in the terminal as it runs.

From the store by default (:func:`tether.watching.follow`), or from a server's stream
(``--server``, the same ``GET /api/tasks/{id}/stream`` the console reads) for a person who
has a token but no access to the database. Either way each committed row is printed once,
in order, with its time and the time since the row before; the command ends when the task
does: exit 0 if it completed, 1 if it failed or was cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any
from urllib.parse import urlsplit

import click
import orjson

import tether as tt
from tether.cli.app import store_reading_command
from tether.cli.render import echo, error, local_time, say
from tether.watching import Change, follow
from tether.web.timeline import recovery_entry, row_entry

RECONNECT_SECONDS = 30.0
"""How long ``--server`` keeps trying to reconnect a dropped stream before it gives up."""


@click.command()
@click.argument("task_id")
@click.option("--server", envvar="TETHER_SERVER", metavar="URL",
              help="Read the stream of a `tether serve` (e.g. http://127.0.0.1:8700) instead"
                   " of the store (or TETHER_SERVER).")
@click.option("--token", envvar="TETHER_TOKEN", metavar="TOKEN",
              help="The server's read or operator token; better given as TETHER_TOKEN, which"
                   " other users cannot see in the process list.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per change.")
@click.option("--keep-following", is_flag=True,
              help="Go on following a task that needs a person (by default the command ends"
                   " there, exit 2, so a script sees it at once).")
@click.pass_context
def watch(ctx: click.Context, task_id: str, server: str | None, token: str | None,
          as_json: bool, keep_following: bool) -> None:
    """Follow a task as it runs, until it completes (exit 0), fails or is cancelled (exit
    1), or needs a person (exit 2; with --keep-following, until it ends)."""
    stop_at = frozenset() if keep_following else frozenset({"needs_human"})
    if server is None:
        ctx.invoke(_watch_store, task_id=task_id, as_json=as_json, stop_at=stop_at)
        return
    base = _server_url(server)
    if not token:
        raise click.UsageError("--server needs a token: set TETHER_TOKEN (or --token)")
    try:
        ended = asyncio.run(_watch_server(base, token, task_id, as_json, stop_at))
    except tt.TetherError as exc:  # refused by the server, or the stream could not be had
        error(exc)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    raise SystemExit(exit_code(ended))


def exit_code(ended: str) -> int:
    return 0 if ended == "completed" else 2 if ended == "needs_human" else 1


@store_reading_command
async def _watch_store(harness: tt.Harness, task_id: str, as_json: bool,
                       stop_at: frozenset[str]) -> None:
    try:
        ended = await _show(follow(harness, task_id), as_json, stop_at)
    except asyncio.CancelledError:  # Ctrl-C
        raise SystemExit(130) from None
    raise SystemExit(exit_code(ended))


async def _watch_server(base: str, token: str, task_id: str, as_json: bool,
                        stop_at: frozenset[str]) -> str:
    """The server's stream through :class:`tether.client.AsyncClient` (which takes a dropped
    connection up again from the last position)."""
    from tether.client import AsyncClient

    async with AsyncClient(base, token, retry_for=RECONNECT_SECONDS) as client:
        return await _show(client.watch(task_id), as_json, stop_at)


async def _show(changes: AsyncGenerator[Change], as_json: bool,
                stop_at: frozenset[str] = frozenset()) -> str:
    """Print each change; the status the task ended in, or the status in *stop_at* it
    reached (a task that needs a person)."""
    printer = _Printer(as_json)
    async with aclosing(changes):  # the stream's connection is closed here, in this loop
        async for change in changes:
            printer.show(change)
            if change.kind == "end":
                return str(change.data.get("status"))
            if change.kind == "state" and change.data.get("status") in stop_at:
                printer.stopped(change.data)
                return str(change.data["status"])
    return "unknown"


class _Printer:
    """Prints changes as lines; rows numbered and timed as the console's timeline shows them."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.previous: float | None = None

    def show(self, change: Change) -> None:
        if change.kind == "quiet":
            return
        if self.as_json:
            echo(orjson.dumps({"event": change.kind, "id": str(change.position),
                               "data": change.data}, default=str).decode())
            return
        getattr(self, f"_{change.kind}")(change.data)

    def _state(self, data: dict[str, Any]) -> None:
        held = (f" · held by {data['lease_owner']} until {local_time(data['lease_until'])}"
                if data.get("lease_owner") else "")
        say(("task ", "bold"), (data["task_id"], "bold"), " ", (data["status"], "bold"),
            f" · version {data['version']} · step {data['step']}{held}",
            f" · {data['reason']}" if data.get("reason") else "")

    def _row(self, data: dict[str, Any]) -> None:
        self._entry(row_entry(data["row"], data["n"], self.previous))

    def _recovery(self, data: dict[str, Any]) -> None:
        self._entry(recovery_entry(data["record"], self.previous))

    def _entry(self, entry: dict[str, Any]) -> None:
        self.previous = entry["at"] if entry["at"] is not None else self.previous
        mark = (f"[{entry['marker']}] ", "yellow") if entry["marker"] else ""
        say(f"{entry['n']!s:>4}  {entry['time']:<12} {entry['delta']:>12}  ", mark,
            (entry["what"], "bold"), "  ", entry["detail"][:200])
        if entry.get("traceback"):
            say(("      ", ""), (str(entry["traceback"]).rstrip().splitlines()[-1], "red"))

    def _reset(self, data: dict[str, Any]) -> None:
        self.previous = None
        say(("-- rolled back: the dialog of version ", "yellow"), (data["version"], "yellow"),
            (" follows --", "yellow"))

    def stopped(self, data: dict[str, Any]) -> None:
        if not self.as_json:
            say(("stopped following: ", "bold"), (data["status"], "yellow"),
                f" · `tether show {data['task_id']}` says what it needs")

    def _end(self, data: dict[str, Any]) -> None:
        say(("ended: ", "bold"), (data["status"], "green" if data["status"] == "completed"
                                  else "red"), f" · {data['reason']}" if data.get("reason") else "")


def _server_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise click.BadParameter(f"give the server as http(s)://host:port, not {text[:80]!r}",
                                 param_hint="--server")
    return text.rstrip("/")

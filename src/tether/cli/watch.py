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
from urllib.parse import quote, urlsplit

import click
import orjson

import tether as tt
from tether.cli.app import reading_command
from tether.cli.render import echo, error, local_time, say
from tether.watching import KINDS, Change, Position, follow
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
@click.pass_context
def watch(ctx: click.Context, task_id: str, server: str | None, token: str | None,
          as_json: bool) -> None:
    """Follow a task as it runs, until it completes, fails or is cancelled."""
    if server is None:
        ctx.invoke(_watch_store, task_id=task_id, as_json=as_json)
        return
    base = _server_url(server)
    if not token:
        raise click.UsageError("--server needs a token: set TETHER_TOKEN (or --token)")
    try:
        ended = asyncio.run(_show(_from_server(base, token, task_id), as_json))
    except WatchFailed as exc:
        error(exc)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    raise SystemExit(0 if ended == "completed" else 1)


@reading_command
async def _watch_store(harness: tt.Harness, task_id: str, as_json: bool) -> None:
    try:
        ended = await _show(follow(harness, task_id), as_json)
    except asyncio.CancelledError:  # Ctrl-C
        raise SystemExit(130) from None
    raise SystemExit(0 if ended == "completed" else 1)


class WatchFailed(Exception):
    """The server refused the stream or could not be reached; the message says which."""


async def _show(changes: AsyncGenerator[Change], as_json: bool) -> str:
    """Print each change; the status the task ended in."""
    printer = _Printer(as_json)
    async with aclosing(changes):  # the stream's connection is closed here, in this loop
        async for change in changes:
            printer.show(change)
            if change.kind == "end":
                return str(change.data.get("status"))
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

    def _end(self, data: dict[str, Any]) -> None:
        say(("ended: ", "bold"), (data["status"], "green" if data["status"] == "completed"
                                  else "red"), f" · {data['reason']}" if data.get("reason") else "")


def _server_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise click.BadParameter(f"give the server as http(s)://host:port, not {text[:80]!r}",
                                 param_hint="--server")
    return text.rstrip("/")


async def _from_server(base: str, token: str, task_id: str) -> AsyncGenerator[Change]:
    """The server's stream as changes; a dropped connection is taken up again from the last
    event's id for up to :data:`RECONNECT_SECONDS`."""
    import httpx
    from httpx_sse import SSEError, aconnect_sse

    url = f"{base}/api/tasks/{quote(task_id, safe='')}/stream"
    position = Position()
    loop = asyncio.get_running_loop()
    failing_since: float | None = None
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=60.0)) as client:
        while True:
            headers = {"Authorization": f"Bearer {token}", "Last-Event-ID": str(position)}
            try:
                async with aconnect_sse(client, "GET", url, headers=headers) as source:
                    await _check(source.response, task_id)
                    failing_since = None
                    async for event in source.aiter_sse():
                        position = _position(event.id, position)
                        change = _change(event.event, event.data, position)
                        if change is None:
                            continue  # a kind this tether does not know: a newer server's
                        yield change
                        if change.kind == "end":
                            return
            except (httpx.TransportError, SSEError) as exc:
                failing_since = failing_since or loop.time()
                if loop.time() - failing_since > RECONNECT_SECONDS:
                    raise WatchFailed(f"lost the stream from {base} and could not get it back"
                                      f" for {RECONNECT_SECONDS:.0f} s: {exc}") from None
                await asyncio.sleep(1.0)


def _position(text: str, before: Position) -> Position:
    try:
        return Position.parse(text) if text else before
    except tt.InvalidInput as error:
        raise WatchFailed(f"the server sent an event id that is no stream position: {error}"
                          ) from None


def _change(kind: str, data: str, position: Position) -> Change | None:
    """A server's event as a change: None for a kind this tether does not know, and
    WatchFailed for data that is not a JSON object (nothing from outside is trusted)."""
    if kind not in KINDS:
        return None
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        payload = None
    if not isinstance(payload, dict):
        raise WatchFailed(f"the server sent a {kind!r} event whose data is not a JSON object")
    return Change(kind, payload, position)  # type: ignore[arg-type]


async def _check(response: Any, task_id: str) -> None:
    if response.status_code == 200:
        return
    await response.aread()
    try:
        message = orjson.loads(response.content).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        message = None
    raise WatchFailed(message or f"the server answered {response.status_code} for task"
                      f" {task_id!r}")

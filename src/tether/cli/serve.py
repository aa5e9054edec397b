"""``tether serve``: the HTTP API and the console, and with ``--with-worker`` a worker too.

It says where it listens, where the console is and how to sign in. It handles SIGTERM and
Ctrl-C itself rather than leaving them to uvicorn (which would re-raise the signal once it
stopped, killing the process before the worker in it drained its tasks): the first signal
closes the live streams, lets requests in flight finish for :data:`GRACE_SECONDS`, drains
the worker, and prints a last line; a second one exits at once.

:func:`lifespans_until` enters the app's lifespans for it and for ``tether worker``: a
signal that comes while one is still starting (an MCP server that never answers) cuts that
start short, instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import socket
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import click

import tether as tt
from tether.cli.app import probe_store, server_command
from tether.cli.render import say, visible_logs

GRACE_SECONDS = 5
"""How long a stopping server lets open requests finish."""


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to listen on; anything but loopback must be asked for.")
@click.option("--port", type=click.IntRange(0, 65535), default=8700, show_default=True,
              help="Port to listen on (0: any free one, printed at start).")
@click.option("--tokens", envvar="TETHER_TOKENS", default="",
              help="Bearer tokens and roles: 'tok1:operator,tok2:read' (or TETHER_TOKENS);"
                   " 'tok1:operator:alice' names who holds it, as levers record it.")
@click.option("--webhook-secrets", envvar="TETHER_WEBHOOK_SECRETS", default="",
              help="Webhook sources, secrets (16+ bytes) and the event types each may send:"
                   " 'github:SECRET:approval|upstream_ready,billing:SECRET:*'; without a list,"
                   " any type but the levers (or TETHER_WEBHOOK_SECRETS).")
@click.option("--forwarded-allow-ips", default=None,
              help="Proxies whose X-Forwarded-For/-Proto headers are believed (e.g. '10.0.0.5');"
                   " by default none, so no local process can pose as another client or as HTTPS.")
@click.option("--with-worker", is_flag=True, help="Also run a worker in this process.")
@click.option("--concurrency", type=click.IntRange(min=1), default=4, show_default=True,
              help="Tasks that worker runs at once.")
@server_command
async def serve(harness: tt.Harness, host: str, port: int, tokens: str, webhook_secrets: str,
                forwarded_allow_ips: str | None, with_worker: bool, concurrency: int) -> None:
    """Serve the HTTP API and the console (and, with --with-worker, run tasks too).

    With --with-worker the app's lifespans (@harness.lifespan) are entered before the server
    listens and left after its worker drained; one that raises on enter stops the command
    with exit status 1 before anything is served or claimed.
    """
    import uvicorn

    from tether.web.server import ServerConfig, create_app

    config = ServerConfig.from_text(tokens, webhook_secrets)
    if not config.tokens:
        raise click.UsageError("give at least one token (--tokens or TETHER_TOKENS)")
    if with_worker and not harness.agents:
        raise click.UsageError("--with-worker runs tasks, so it needs the app's code: name it"
                               " with --app module:harness or TETHER_APP (the built-in"
                               " examples: --app tether.examples:demo_app)")
    await probe_store(harness, warn=True)
    listening = _listening_socket(host, port)  # a port in use is one line, before anything
    app = create_app(harness, config)
    server = _server_class()(uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=GRACE_SECONDS,
        proxy_headers=forwarded_allow_ips is not None, forwarded_allow_ips=forwarded_allow_ips))
    stop = asyncio.Event()
    signals: list[str] = []
    with visible_logs(harness.log), _stop_signals(server, app.state.streams, stop, signals):
        # The worker's lifespans are entered before the server listens (a lever it applies may
        # need their tools) and left after the worker drained; the API alone enters none.
        async with _lifespans(harness, with_worker, stop, signals):
            if stop.is_set():  # a signal came while the lifespans were entered
                return
            worker = asyncio.create_task(harness.serve(concurrency, stop=stop)) \
                if with_worker else None
            try:
                serving = asyncio.create_task(server.serve(sockets=[listening]))
                await _announce(server, serving, with_worker)
                await serving
            finally:
                stop.set()
                if worker is not None:
                    await worker
                say("tether serve stopped" + (": its worker released its tasks"
                                              if with_worker else ""), err=True)


@contextlib.asynccontextmanager
async def _lifespans(harness: tt.Harness, with_worker: bool, stop: asyncio.Event,
                     signals: list[str]) -> AsyncIterator[None]:
    """The app's lifespans around the server and its worker (``--with-worker`` only)."""
    if not with_worker:
        yield
        return
    if harness.lifespans:
        say(f"entering the app's lifespans ({', '.join(harness.lifespans)})", err=True)
    async with lifespans_until(harness, stop, signals):  # a LifespanFailed: the command's error
        yield
    if harness.lifespans:
        say("left the app's lifespans", err=True)


@contextlib.asynccontextmanager
async def lifespans_until(harness: tt.Harness, stop: asyncio.Event,
                          signals: Sequence[str] = ()) -> AsyncIterator[None]:
    """The app's lifespans (:meth:`tether.Harness.lifespan_context`) for the block, unless
    *stop* is set while they are still starting: then the start in flight is cancelled (its
    lifespan's own cleanup runs, an MCP server being connected to is stopped), the lifespans
    entered before it are left in reverse, and :class:`tether.LifespanFailed` names the one
    that did not finish starting and the signal (the last of *signals*); the block does not
    run. Once they are entered, *stop* is the block's business (the worker drains)."""
    if not harness.lifespans:  # nothing that could hang: the block's own business
        async with harness.lifespan_context():
            yield
        return
    context = harness.lifespan_context()
    entering = asyncio.ensure_future(context.__aenter__())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({entering, stopped}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this command was cancelled: the start goes with it
        entering.cancel()
        with contextlib.suppress(BaseException):
            await entering
        raise
    finally:
        stopped.cancel()
    if not entering.done():
        name = _lifespan_starting(harness)
        entering.cancel()
        with contextlib.suppress(asyncio.CancelledError):  # a LifespanFailed of its own wins
            await entering
        if entering.cancelled():
            what = (f"lifespan {name!r}" if name else
                    f"one of the app's lifespans ({', '.join(harness.lifespans)})")
            raise tt.LifespanFailed(
                f"{what} did not finish starting before {signals[-1] if signals else 'the stop'}"
                ": its start was cancelled and the lifespans started before it were left; the"
                " workers did not start and no task was claimed")
    entering.result()  # the LifespanFailed of a lifespan that raised on enter
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_exit(context)  # entered above: left here, the block's error given
        yield


def _lifespan_starting(harness: tt.Harness) -> str | None:
    """The name of the lifespan whose start is in flight, or None if it cannot be told.

    :class:`tether.Harness` does not say it; the frame of its lifespan task does (the
    ``name`` being entered by ``Lifespans._own``), read only to name it in an error."""
    lifespans = getattr(harness, "_lifespans", None)
    for task in asyncio.all_tasks():
        frame = getattr(task.get_coro(), "cr_frame", None)
        if frame is None or frame.f_code.co_name != "_own" \
                or frame.f_locals.get("self") is not lifespans:
            continue
        name = frame.f_locals.get("name")
        return name if isinstance(name, str) else None
    return None


def _listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound here so that a port in use, or a host this machine does
    not have, is a one-line error rather than uvicorn's traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise tt.ConfigurationError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
            + ("; another server has that port: stop it, or choose another with --port"
               if exc.errno == errno.EADDRINUSE else "")) from None
    return sock


def _server_class() -> type[Any]:
    import uvicorn

    class QuietSignals(uvicorn.Server):
        """uvicorn's server, minus its own signal handling (ours is :func:`_stop_signals`)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return QuietSignals


@contextlib.contextmanager
def _stop_signals(server: Any, streams: Any, stop: asyncio.Event,
                  signals: list[str]) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    handled = (signal.SIGINT, signal.SIGTERM)
    for signum in handled:
        loop.add_signal_handler(signum, _on_signal, server, streams, stop, signals, signum)
    try:
        yield
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)


def _on_signal(server: Any, streams: Any, stop: asyncio.Event, signals: list[str],
               signum: int) -> None:
    name = signal.Signals(signum).name
    if server.should_exit:
        say(f"{name} again: exiting now", err=True)
        os._exit(128 + signum)
    signals.append(name)
    closed = streams.close()
    say(f"{name}: stopping: {closed} live stream(s) closed (readers reconnect to the next"
        f" server), up to {GRACE_SECONDS}s for requests in flight; send it again to exit at"
        " once", err=True)
    server.should_exit = True
    stop.set()


async def _announce(server: Any, serving: asyncio.Task[None], with_worker: bool) -> None:
    """Once the server listens: where it is, where the console is, how to sign in."""
    while not server.started and not serving.done():
        await asyncio.sleep(0.02)
    if not server.started:
        return
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    base = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    say(("tether serve", "bold"), f" listening on {base}",
        " with a worker" if with_worker else " (API only: run `tether worker` to run tasks)")
    say(f"  console: {base}/console  (sign in with one of the --tokens; an operator token"
        " may steer tasks)")
    say(f"  API:     {base}/api/tasks  (Authorization: Bearer <token>)   health: {base}/healthz")
    say("  Ctrl-C or SIGTERM stops it")

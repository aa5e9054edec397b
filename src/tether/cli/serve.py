"""``tether serve``: the HTTP API and the console, and with ``--with-worker`` a worker too.

It says where it listens, where the console is and how to sign in. It handles SIGTERM and
Ctrl-C itself rather than leaving them to uvicorn (which would re-raise the signal once it
stopped, killing the process before the worker in it drained its tasks): the first signal
closes the live streams, lets requests in flight finish for :data:`GRACE_SECONDS`, drains
the worker, and prints a last line; a second one exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from typing import Any

import click

import tether as tt
from tether.cli.app import probe_store, serving_command
from tether.cli.render import say, visible_logs

GRACE_SECONDS = 5
"""How long a stopping server lets open requests finish."""


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to listen on; anything but loopback must be asked for.")
@click.option("--port", type=click.IntRange(0, 65535), default=8700, show_default=True,
              help="Port to listen on (0: any free one, printed at start).")
@click.option("--tokens", envvar="TETHER_TOKENS", default="",
              help="Bearer tokens and roles: 'tok1:operator,tok2:read' (or TETHER_TOKENS).")
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
@serving_command
async def serve(harness: tt.Harness, host: str, port: int, tokens: str, webhook_secrets: str,
                forwarded_allow_ips: str | None, with_worker: bool, concurrency: int) -> None:
    """Serve the HTTP API and the console (and, with --with-worker, run tasks too)."""
    import uvicorn

    from tether.web.server import ServerConfig, create_app

    config = ServerConfig.from_text(tokens, webhook_secrets)
    if not config.tokens:
        raise click.UsageError("give at least one token (--tokens or TETHER_TOKENS)")
    await probe_store(harness, warn=True)
    app = create_app(harness, config)
    server = _server_class()(uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=GRACE_SECONDS,
        proxy_headers=forwarded_allow_ips is not None, forwarded_allow_ips=forwarded_allow_ips))
    stop = asyncio.Event()
    worker = asyncio.create_task(harness.serve(concurrency, stop=stop)) if with_worker else None
    try:
        with visible_logs(harness.log), _stop_signals(server, app.state.streams, stop):
            serving = asyncio.create_task(server.serve())
            await _announce(server, serving, with_worker)
            await serving
    finally:
        stop.set()
        if worker is not None:
            await worker
        say("tether serve stopped" + (": its worker released its tasks" if with_worker else ""),
            err=True)


def _server_class() -> type[Any]:
    import uvicorn

    class QuietSignals(uvicorn.Server):
        """uvicorn's server, minus its own signal handling (ours is :func:`_stop_signals`)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return QuietSignals


@contextlib.contextmanager
def _stop_signals(server: Any, streams: Any, stop: asyncio.Event) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    handled = (signal.SIGINT, signal.SIGTERM)
    for signum in handled:
        loop.add_signal_handler(signum, _on_signal, server, streams, stop, signum)
    try:
        yield
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)


def _on_signal(server: Any, streams: Any, stop: asyncio.Event, signum: int) -> None:
    name = signal.Signals(signum).name
    if server.should_exit:
        say(f"{name} again: exiting now", err=True)
        os._exit(128 + signum)
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

"""The command line's link to the application: load its harness from an import path, run a
command's coroutine with it, and read the options every command shares (JSON, moments,
who is asking)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import getpass
import logging
import os
import re
from collections.abc import Callable, Coroutine, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import click
import orjson

import tether as tt
from tether.apps import load_harness
from tether.cli.render import error, say
from tether.engine.timers import MAX_AHEAD
from tether.store import DEFAULT_URL

T = TypeVar("T")
Command = Callable[..., Coroutine[Any, Any, T]]
DEFAULT_APP = "tether.examples:demo_app"
CACHE_PROBE_SECONDS = 1.0
"""How long a command waits for the Redis cache to answer before warning that it does not."""


class NoStore(tt.ConfigurationError):
    """There is no store where the command looked; a command that only reads never creates
    one."""


def load_app(spec: str, store: str, store_given: bool = True) -> tt.Harness:
    """The application's harness (see :func:`tether.apps.load_harness`); an app that cannot
    be loaded is a ConfigurationError, said in one line like any other (exit 1)."""
    return load_harness(spec, store, store_given)


def app_harness(ctx: click.Context, steers: bool = False, codeless: bool = False
                ) -> tt.Harness:
    """The harness of the app the command line names (``--app``, ``--store``).

    A command that steers tasks (a lever, the server) without an app named explicitly gets
    a harness with no code at all, never the built-in examples: another app's agents and
    tools of the same names would judge the user's tasks by the wrong rules (run the
    examples' reconcile hook on the user's call, say). Such a harness stores the lever, and
    the task's own workers apply it. A *codeless* command (one that only reads the store)
    never imports the app: an app's imports can take seconds."""
    obj = ctx.find_root().obj
    if codeless or (steers and not obj["app_given"]):
        return tt.Harness(obj["store"])
    return load_app(obj["app"], obj["store"], obj["store_given"])


def harness_command(fn: Command[T]) -> Callable[..., T]:
    """Run an async command with the app's harness (closed afterwards); tether's errors
    become one clear line and exit status 1."""
    return _run_with_harness(fn, reads_only=False, serves=False)


def steering_command(fn: Command[T]) -> Callable[..., T]:
    """A :func:`harness_command` that pulls a lever: without ``--app`` (or ``TETHER_APP``) it
    runs with no code of any app (see :func:`app_harness`)."""
    return _run_with_harness(fn, reads_only=False, serves=False, steers=True)


def server_command(fn: Command[T]) -> Callable[..., T]:
    """A :func:`serving_command` whose API pulls levers: without ``--app`` it has no code of
    any app (see :func:`app_harness`)."""
    return _run_with_harness(fn, reads_only=False, serves=True, steers=True)


def store_reading_command(fn: Command[T]) -> Callable[..., T]:
    """A :func:`harness_command` that only reads what the store holds, so it does not import
    the app; and when no store is named and the default one is not there, that is an error
    (:class:`NoStore`), not an empty ``tether.db`` created in passing."""
    return _run_with_harness(fn, reads_only=True, serves=False, codeless=True)


def serving_command(fn: Command[T]) -> Callable[..., T]:
    """A :func:`harness_command` that runs until stopped (a worker, the server): the cache's
    own warnings stay in its log, since Redis may fail again later."""
    return _run_with_harness(fn, reads_only=False, serves=True)


def _run_with_harness(fn: Command[T], *, reads_only: bool, serves: bool,
                      steers: bool = False, codeless: bool = False) -> Callable[..., T]:
    @functools.wraps(fn)
    @click.pass_context
    def wrapper(ctx: click.Context, *args: Any, **kwargs: Any) -> T:
        async def with_harness() -> T:
            harness = app_harness(ctx, steers, codeless)
            try:
                if reads_only and not ctx.find_root().obj["store_given"]:
                    refuse_missing_default_store(harness)
                return await fn(harness, *args, **kwargs)
            finally:
                await harness.close()

        warned = warn_if_cache_unreachable(ctx)
        try:
            with quiet_cache_log(warned and not serves):
                return asyncio.run(with_harness())
        except tt.TetherError as exc:
            error(exc)
            raise SystemExit(1) from None

    return wrapper


def sqlite_file(url: str | None) -> Path | None:
    """The file a SQLite store URL names (None for other stores and in-memory ones)."""
    if url is None or not url.startswith("sqlite:///") or ":memory:" in url:
        return None
    return Path(url.removeprefix("sqlite:///"))


def refuse_missing_store(harness: tt.Harness) -> None:
    """Raise :class:`NoStore` if the harness's store is a SQLite file that does not exist."""
    path = sqlite_file(harness.store_url)
    if path is not None and not path.exists():
        raise NoStore(f"no store at {str(path)!r}: the file does not exist")


def refuse_missing_default_store(harness: tt.Harness) -> None:
    """Raise :class:`NoStore` if the harness uses the default store (``--store`` and
    ``TETHER_STORE`` unset) and there is none in this folder."""
    path = sqlite_file(harness.store_url)
    if harness.store_url == DEFAULT_URL and path is not None and not path.exists():
        raise NoStore(f"no store here: {str(path)!r}, the default store, does not exist; name"
                      " one with --store or TETHER_STORE, or create it with `tether submit`"
                      " or `tether migrate`")


# ---------------------------------------------------------------------- the Redis cache


def warn_if_cache_unreachable(ctx: click.Context) -> bool:
    """Say on stderr, once, that the ``--cache`` Redis does not answer (the command goes on
    with the store alone: the cache holds no truth); True if it said so."""
    url = ctx.find_root().obj.get("cache")
    problem = cache_problem(url) if url else None
    if problem is None:
        return False
    say(("warning:", "yellow"), f" the Redis cache {redact(url)} does not answer ({problem});"
        " reading and writing the store without it", err=True)
    return True


def cache_problem(url: str) -> str | None:
    """Why the Redis at *url* does not answer a PING, or None if it does (or if *url* is not
    a Redis URL or redis-py is missing: opening the store says so)."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return None
    try:
        import redis
    except ImportError:
        return None
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=CACHE_PROBE_SECONDS,
                                      socket_timeout=CACHE_PROBE_SECONDS)
        try:
            client.ping()
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError) as exc:
        return " ".join(str(exc).split()) or type(exc).__name__
    return None


def redact(url: str) -> str:
    """*url* without its password, for messages."""
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", url)


class _DropRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


@contextlib.contextmanager
def quiet_cache_log(quiet: bool) -> Iterator[None]:
    """While a one-shot command runs, leave out the cache's own warnings if the command
    already said the cache does not answer (once is enough)."""
    if not quiet:
        yield
        return
    logger, drop = logging.getLogger("tether.cache"), _DropRecords()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


# ---------------------------------------------------------------------- option values


def json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise click.UsageError(f"{what} is not valid JSON: {exc}") from None


def json_option(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """A click callback: the option's JSON, parsed before the command runs."""
    return json_arg(value, _option_name(param))


def moment(text: str | None, what: str) -> float | datetime | None:
    """Seconds from now, or an ISO-8601 time with a time zone."""
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        return _iso_moment(text, what)
    if not 0 <= seconds <= MAX_AHEAD:  # also refuses NaN
        raise click.UsageError(f"{what} {text!r}: give seconds from now, from 0 to"
                               f" {MAX_AHEAD:,} (ten years)")
    return seconds


def _iso_moment(text: str, what: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise click.UsageError(f"{what} {text!r} is neither seconds from now nor an ISO-8601"
                                 " time such as 2026-12-01T09:00:00+00:00") from None
    if when.tzinfo is None:
        raise click.UsageError(f"{what} {text!r} has no time zone, so it would mean another"
                                 " moment on each machine; add one, as in"
                                 " 2026-12-01T09:00:00+00:00")
    return when


def moment_option(ctx: click.Context, param: click.Parameter, value: str | None
                  ) -> float | datetime | None:
    """A click callback: the option's moment, checked before the command runs."""
    return moment(value, _option_name(param))


def _option_name(param: click.Parameter) -> str:
    return max(param.opts, key=len) if param.opts else str(param.name)


def who() -> str:
    """Who pulls a lever from this command line, as the dialog and the recovery log record
    it: ``cli:`` and the login name."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name (a container with an unnamed uid)
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"cli:{user}"[:200]


STARTUP_PROBE_SECONDS = 2.0
"""How long a worker or the server waits, before it starts, to learn whether its store works."""


async def probe_store(harness: tt.Harness, warn: bool) -> None:
    """Before a worker or the server starts: a store refused for good (an unknown database, a
    login refused, a file that is no database) stops it with its one-line error; a store
    unavailable for now is ridden out (with a warning if *warn*: requests answer 503 until
    the store is back)."""
    try:
        async with asyncio.timeout(STARTUP_PROBE_SECONDS):
            await harness.store.ping()
    except TimeoutError:
        return  # a store this slow is the worker's or the server's to ride out
    except tt.StoreUnavailable as exc:
        if warn:
            say(("warning:", "yellow"), " ", exc, "; serving anyway: requests answer 503 until"
                " the store is back", err=True)

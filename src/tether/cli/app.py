"""The command line's link to the application: load its harness from an import path, run a
command's coroutine with it, and read the options every command shares (JSON, moments,
who is asking)."""

from __future__ import annotations

import asyncio
import functools
import getpass
import os
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any, TypeVar

import click
import orjson

import tether as tt
from tether.apps import load_harness
from tether.cli.render import error

T = TypeVar("T")
DEFAULT_APP = "tether.examples:demo_app"


def load_app(spec: str, store: str, store_given: bool = True) -> tt.Harness:
    """The application's harness (see :func:`tether.apps.load_harness`); a spec that names
    no harness is a usage error of the command line."""
    try:
        return load_harness(spec, store, store_given)
    except tt.ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc


def app_harness(ctx: click.Context) -> tt.Harness:
    """The harness of the app the command line names (``--app``, ``--store``)."""
    obj = ctx.find_root().obj
    return load_app(obj["app"], obj["store"], obj["store_given"])


def harness_command(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an async command with the app's harness (closed afterwards); tether's errors
    become one clear line and exit status 1."""

    @functools.wraps(fn)
    @click.pass_context
    def wrapper(ctx: click.Context, *args: Any, **kwargs: Any) -> T:
        async def with_harness() -> T:
            harness = app_harness(ctx)
            try:
                return await fn(harness, *args, **kwargs)
            finally:
                await harness.close()

        try:
            return asyncio.run(with_harness())
        except tt.TetherError as exc:
            error(exc)
            raise SystemExit(1) from None

    return wrapper


def json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"{what} is not valid JSON: {exc}") from None


def moment(text: str | None, what: str) -> float | datetime | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{what} {text!r} is neither seconds from now nor an ISO-8601"
                                 " time such as 2026-12-01T09:00:00+00:00") from None


def who() -> str:
    """Who pulls a lever from this command line, as the dialog and the recovery log record
    it: ``cli:`` and the login name."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name (a container with an unnamed uid)
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"cli:{user}"[:200]

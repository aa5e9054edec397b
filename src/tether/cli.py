"""The ``tether`` command line.

Commands that run or steer tasks load the application's harness from an
import path (``--app myapp.agents:harness``, as uvicorn and celery do); the
built-in examples are the default. ``--store`` (or ``TETHER_STORE``) picks
the store. Every listing takes ``--json``. Errors are one line and exit 1.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import click
import orjson
from rich.console import Console
from rich.table import Table

import tether as tt
from tether.bundle import dumps_bundle
from tether.store import DEFAULT_URL, open_store

T = TypeVar("T")
console = Console()
DEFAULT_APP = "tether.examples:demo_app"


def load_app(spec: str, store: str, store_given: bool = True) -> tt.Harness:
    """Import ``module:attribute``: a Harness, or a factory called with the store URL.

    A Harness keeps the store it was built with unless ``--store``/``TETHER_STORE`` is given.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.UsageError(f"--app {spec!r} must look like 'package.module:harness'")
    sys.path.insert(0, os.getcwd())
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise click.UsageError(f"cannot load app {spec!r}: {exc}") from exc
    if isinstance(target, tt.Harness):
        if store_given and target._store is None:
            target._store_arg = store
        return target
    if callable(target):
        harness = target(store)
        if isinstance(harness, tt.Harness):
            return harness
    raise click.UsageError(f"app {spec!r} is neither a tether.Harness nor a factory returning one")


def harness_command(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an async command with the app's harness (closed afterwards); tether's errors
    become one clear line and exit status 1."""

    @functools.wraps(fn)
    @click.pass_context
    def wrapper(ctx: click.Context, *args: Any, **kwargs: Any) -> T:
        async def with_harness() -> T:
            harness = _harness(ctx)
            try:
                return await fn(harness, *args, **kwargs)
            finally:
                await harness.close()

        try:
            return asyncio.run(with_harness())
        except tt.TetherError as exc:
            console.print(f"[red]error:[/] {exc}", highlight=False)
            raise SystemExit(1) from None

    return wrapper


def _json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"{what} is not valid JSON: {exc}") from None


def _print_json(data: Any) -> None:
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
                            | orjson.OPT_PASSTHROUGH_DATACLASS, default=_plain).decode())


def _plain(value: Any) -> Any:
    from dataclasses import asdict, is_dataclass

    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    raise TypeError


def local_time(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


@click.group()
@click.option("--store", envvar="TETHER_STORE", default=DEFAULT_URL, show_default=True,
              help="Store URL: sqlite:///path.db, postgresql://user@host/db or memory://")
@click.option("--cache", envvar="TETHER_CACHE", metavar="REDIS_URL",
              help="Keep hot snapshot heads in Redis (redis://host:6379/0).")
@click.option("--app", envvar="TETHER_APP", default=DEFAULT_APP, show_default=True,
              help="Import path of the harness (module:attribute).")
@click.pass_context
def main(ctx: click.Context, store: str, cache: str | None, app: str) -> None:
    """tether: agents that survive being interrupted."""
    if cache:
        os.environ["TETHER_CACHE"] = cache  # every harness this command builds uses it
    source = ctx.get_parameter_source("store")
    ctx.obj = {"store": store, "app": app,
               "store_given": source is not click.core.ParameterSource.DEFAULT}


def _harness(ctx: click.Context) -> tt.Harness:
    return load_app(ctx.obj["app"], ctx.obj["store"], ctx.obj["store_given"])


@main.command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Create or upgrade the store's schema (run it before rolling out a new tether)."""
    async def go() -> list[str]:
        store = open_store(ctx.obj["store"])
        try:
            return await store.migrate()
        finally:
            await store.close()

    try:
        applied = asyncio.run(go())
    except tt.TetherError as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False)
        raise SystemExit(1) from None
    click.echo(f"applied: {', '.join(applied)}" if applied else "schema is up to date")


@main.command()
@click.option("--keep", is_flag=True, help="Keep the demo's folder instead of deleting it.")
def demo(keep: bool) -> None:
    """Show all three kinds of interruption on a throwaway SQLite store."""
    from tether.demo import print_summary, run_demo

    workdir = Path(tempfile.mkdtemp(prefix="tether-demo-"))
    started = time.time()
    try:
        outcome = asyncio.run(run_demo(workdir, console))
        print_summary(console, outcome)
        console.print(f"finished in {time.time() - started:.1f}s")
    finally:
        if keep:
            console.print(f"demo files kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if not outcome.ok:
        raise SystemExit(1)


def _app_argument(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.obj["app"] = value


@main.command()
@click.argument("app", required=False, expose_value=False, callback=_app_argument)
@click.option("--concurrency", default=4, show_default=True, help="Tasks run at once.")
@click.option("--until-idle", is_flag=True, help="Exit when no task has work left.")
@click.option("--drain-timeout", type=click.FloatRange(min=0, min_open=True),
              help="Seconds in-flight steps may take on a graceful stop (default: settings).")
@click.option("--degraded", metavar="REASON",
              help="Start degraded: every task runs its agent's fallback (R3).")
@click.option("--events", envvar="TETHER_EVENTS", metavar="REDIS_URL",
              help="Also take events from the Redis Stream tether:events (consumer group).")
@harness_command
async def worker(harness: tt.Harness, concurrency: int, until_idle: bool,
                 drain_timeout: float | None, degraded: str | None, events: str | None) -> None:
    """Claim, run and recover tasks of APP (module:harness; default --app).

    Any number of workers, in one process or many, may share a store. SIGTERM or
    Ctrl-C drains (E5): no new claims, model calls in flight are cancelled (they are
    redone), side-effecting calls finish within the drain timeout, every task is
    committed and released, and the worker exits 0. A second signal exits at once;
    its tasks are then recovered by other workers when their leases expire.
    """
    if drain_timeout is not None:
        harness.settings = harness.settings.replace(drain_timeout=drain_timeout)
    if degraded:
        harness.degrade({"reason": degraded})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _on_stop_signal, stop, signum, harness)
    click.echo(f"worker {harness.worker_id} serving (concurrency {concurrency});"
               " SIGTERM drains, a second one exits at once", err=True)
    ingest = _stream_ingest(harness, events) if events else None
    feeding = asyncio.create_task(ingest.run(stop)) if ingest else None
    try:
        if until_idle:
            await harness.run_until_idle(concurrency=concurrency, stop=stop)
        else:
            await harness.serve(concurrency=concurrency, stop=stop)
    finally:
        stop.set()
        if feeding is not None and ingest is not None:
            await feeding
            await ingest.close()
    click.echo(f"worker {harness.worker_id} stopped; its tasks were released", err=True)


def _stream_ingest(harness: tt.Harness, url: str) -> Any:
    from tether.streams import StreamIngest  # redis-py only when asked for

    return StreamIngest(harness, url)


def _on_stop_signal(stop: asyncio.Event, signum: int, harness: tt.Harness) -> None:
    name = signal.Signals(signum).name
    if stop.is_set():
        click.echo(f"{name} again: exiting now; other workers recover this worker's tasks when"
                   f" their leases expire (lease_seconds={harness.settings.lease_seconds})",
                   err=True)
        os._exit(128 + signum)
    click.echo(f"{name}: draining (up to {harness.settings.drain_timeout}s for steps in"
               f" flight); send it again to exit at once", err=True)
    stop.set()


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to listen on; anything but loopback must be asked for.")
@click.option("--port", default=8700, show_default=True)
@click.option("--tokens", envvar="TETHER_TOKENS", default="",
              help="Bearer tokens and roles: 'tok1:operator,tok2:read' (or TETHER_TOKENS).")
@click.option("--webhook-secrets", envvar="TETHER_WEBHOOK_SECRETS", default="",
              help="Webhook sources and secrets: 'github:s3cret,...' (or TETHER_WEBHOOK_SECRETS).")
@click.option("--with-worker", is_flag=True, help="Also run a worker in this process.")
@click.option("--concurrency", default=4, show_default=True, help="Tasks that worker runs at once.")
@harness_command
async def serve(harness: tt.Harness, host: str, port: int, tokens: str, webhook_secrets: str,
                with_worker: bool, concurrency: int) -> None:
    """Serve the HTTP API (and, with --with-worker, run tasks too)."""
    import uvicorn

    from tether.server import ServerConfig, create_app

    config = ServerConfig.from_text(tokens, webhook_secrets)
    if not config.tokens:
        raise click.UsageError("give at least one token (--tokens or TETHER_TOKENS)")
    server = uvicorn.Server(uvicorn.Config(create_app(harness, config), host=host, port=port,
                                           log_level="warning"))
    stop = asyncio.Event()
    worker = asyncio.create_task(harness.serve(concurrency, stop=stop)) if with_worker else None
    try:
        await server.serve()
    finally:
        stop.set()
        if worker is not None:
            await worker


@main.command()
@click.argument("agent")
@click.option("--input", "input_json", help="The task's input as JSON.")
@click.option("--id", "task_id", help="Choose the task id (default: generated).")
@click.option("--deadline", metavar="WHEN",
              help="When the task must be done: seconds from now, or an ISO time with a zone.")
@click.option("--not-before", metavar="WHEN", help="Do not start before then (same forms).")
@harness_command
async def submit(harness: tt.Harness, agent: str, input_json: str | None, task_id: str | None,
                 deadline: str | None, not_before: str | None) -> None:
    """Create a task for AGENT."""
    task_id = await harness.submit(agent, _json_arg(input_json, "--input"), task_id=task_id,
                                   deadline=_moment(deadline, "--deadline"),
                                   not_before=_moment(not_before, "--not-before"))
    click.echo(task_id)


def _moment(text: str | None, what: str) -> float | datetime | None:
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


@main.command(name="ls")
@click.option("--status", type=click.Choice([s.value for s in tt.Status]), help="Only this status.")
@click.option("--json", "as_json", is_flag=True)
@harness_command
async def list_tasks(harness: tt.Harness, status: str | None, as_json: bool) -> None:
    """List tasks, newest first."""
    records = await harness.store.list_tasks(tt.Status(status) if status else None)
    if as_json:
        _print_json([{**_plain(r), "status": r.status.value} for r in records])
        return
    table = Table("id", "agent", "status", "version", "updated", "reason")
    table.columns[0].no_wrap = True
    table.columns[4].no_wrap = True
    for r in records:
        reason = r.reason or ""
        table.add_row(r.task_id, r.agent, r.status.value, str(r.head_version), local_time(r.updated_at),
                      reason if len(reason) <= 60 else reason[:59] + "…")
    console.print(table)


@main.command()
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True)
@harness_command
async def show(harness: tt.Harness, task_id: str, as_json: bool) -> None:
    """Where a task is: status, step, stack, current call, recovery state (R2)."""
    info = await harness.get(task_id)
    snap = info.snapshot
    if as_json:
        _print_json({"version": info.version, "reason": info.record.reason,
                     "wake_at": info.record.wake_at, "snapshot": orjson.loads(snap.dumps())})
        return
    console.print(f"[bold]{task_id}[/] {snap.agent}  status [bold]{snap.status.value}[/]"
                  f"  step {snap.step}  version {info.version}")
    if info.record.reason:
        console.print(f"reason: {info.record.reason}")
    if info.record.wake_at is not None:
        console.print(f"due for a look at {local_time(info.record.wake_at)} (a timer, deadline,"
                      " scheduled start or back-off)")
    if snap.deadline_at is not None:
        console.print(f"deadline: {local_time(snap.deadline_at)}")
    if snap.degraded or snap.worker_degraded:
        console.print(f"degraded: {snap.degraded or snap.worker_degraded}")
    for depth, frame in enumerate(snap.stack):
        todo = f" to-do: {[a['kind'] for a in frame.agenda]}" if frame.agenda else ""
        console.print(f"{'  ' * depth}└─ {frame.agent} (steps {frame.steps}){todo}")
    if snap.call:
        console.print(f"current call: {snap.call.tool}({snap.call.args}) key={snap.call.key}"
                      f" status={snap.call.status} attempt={snap.call.attempt}")
    if snap.result is not None:
        console.print(f"result: {snap.result}")


@main.command()
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True)
@harness_command
async def history(harness: tt.Harness, task_id: str, as_json: bool) -> None:
    """The task's full dialog."""
    rows = await harness.history(task_id)
    if as_json:
        _print_json(rows)
        return
    table = Table("#", "role", "content")
    for n, row in enumerate(rows, 1):
        body = row.get("content", row.get("tool_call", row.get("error", "")))
        table.add_row(str(n), str(row.get("role")), str(body)[:120])
    console.print(table)


@main.command()
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True)
@harness_command
async def versions(harness: tt.Harness, task_id: str, as_json: bool) -> None:
    """Kept snapshot versions (R14)."""
    kept = await harness.store.list_versions(task_id)
    if as_json:
        _print_json([{"version": v, "created_at": at, "bytes": size} for v, at, size in kept])
        return
    table = Table("version", "created", "bytes")
    for v, at, size in kept:
        table.add_row(str(v), local_time(at), str(size))
    console.print(table)


@main.command()
@click.argument("task_id")
@click.argument("event_type")
@click.option("--payload", help="Event payload as JSON.")
@click.option("--priority", type=click.IntRange(0, 4), help="Override the protocol's priority.")
@click.option("--source-event-id", help="Sender's id; a repeat is dropped (R6).")
@harness_command
async def emit(harness: tt.Harness, task_id: str, event_type: str, payload: str | None,
               priority: int | None, source_event_id: str | None) -> None:
    """Send an event to a task; returns once it is stored."""
    receipt = await harness.emit(tt.Event(event_type, task_id, _json_arg(payload, "--payload"),
                                          priority=priority, source_event_id=source_event_id))
    click.echo(f"event {receipt.event_id}: {receipt.outcome}"
               + (f" ({receipt.coalesced} older coalesced)" if receipt.coalesced else ""))


@main.command()
@click.argument("task_id")
@click.option("--message", help="A note for the agent, added to the dialog.")
@click.option("--patch", help="JSON object merged into the current frame's scratch data.")
@harness_command
async def resume(harness: tt.Harness, task_id: str, message: str | None, patch: str | None) -> None:
    """Resume a paused, parked or failed task."""
    frame_patch = _json_arg(patch, "--patch")
    if frame_patch is not None and not isinstance(frame_patch, dict):
        raise click.BadParameter("--patch must be a JSON object")
    receipt = await harness.resume(task_id, message=message, frame_patch=frame_patch)
    await _report_lever(harness, task_id, receipt, "resume")


@main.command()
@click.argument("task_id")
@click.option("--to", "version", type=int, required=True, help="A kept version (see `versions`).")
@click.option("--redo-side-effects", is_flag=True, help="Run calls after the version again (E4).")
@harness_command
async def rollback(harness: tt.Harness, task_id: str, version: int, redo_side_effects: bool) -> None:
    """Roll a task back to a kept version."""
    receipt = await harness.rollback(task_id, version, redo_side_effects=redo_side_effects)
    await _report_lever(harness, task_id, receipt, f"rollback to version {version}")


@main.command()
@click.argument("task_id")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True)
@harness_command
async def export(harness: tt.Harness, task_id: str, output: str) -> None:
    """Write the task's handoff bundle (R26) to a JSON file."""
    bundle = await harness.export(task_id)
    Path(output).write_bytes(dumps_bundle(bundle))
    click.echo(f"wrote {output} ({len(bundle['history'])} dialog rows,"
               f" {len(bundle['events'])} events)")


@main.command()
@click.argument("task_id")
@harness_command
async def cancel(harness: tt.Harness, task_id: str) -> None:
    """Cancel a task (a side-effecting call in flight is let finish first)."""
    receipt = await harness.cancel(task_id)
    await _report_lever(harness, task_id, receipt, "cancel")


@main.command()
@click.argument("app")
@click.argument("agent")
@click.option("--input", "input_json", help="The task's input as JSON.")
@click.option("--seeds", default=20, show_default=True, help="How many seeded runs of each kind.")
@click.option("--seed", type=int, help="Run only this seed (to replay a violation).")
@click.option("--only", type=click.Choice(["faults", "kills"]), help="Only one kind of run.")
def torture(app: str, agent: str, input_json: str | None, seeds: int, seed: int | None,
            only: str | None) -> None:
    """Run AGENT of APP under injected faults and worker kills; report what broke.

    Faults: tool errors, slow tools, model errors, events at awkward moments. Kills: a
    worker process SIGKILLed at a named failpoint, then fresh workers finish the task.
    Exit 1 if any violation is found; each comes with the command that replays it.
    """
    from tether.testing import Target
    from tether.testing import torture as run_torture

    target = Target(app, agent, _json_arg(input_json, "--input"))
    first, count = (seed, 1) if seed is not None else (0, seeds)
    started = time.time()
    try:
        with console.status("torturing…") as status:
            report = asyncio.run(run_torture(
                target, seeds=count, first_seed=first, kills=only != "faults",
                faults=only != "kills", progress=lambda line: status.update(line)))
    except tt.TetherError as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False)
        raise SystemExit(1) from None
    console.print(f"{report.runs} runs, {report.kills} worker kills at"
                  f" {len(report.points)} failpoints ({', '.join(sorted(report.points)) or '-'}),"
                  f" outcomes {report.outcomes}, {time.time() - started:.1f}s")
    if report.ok:
        console.print("[green]no violations[/]")
        return
    console.print(f"[red]{len(report.violations)} violation(s)[/]")
    for v in report.violations:
        console.print(f"- seed {v.seed}: [bold]{v.kind}[/]: {v.detail}", highlight=False)
        console.print(f"  replay: {v.replay}", highlight=False, soft_wrap=True)
    raise SystemExit(1)


async def _report_lever(harness: tt.Harness, task_id: str, receipt: tt.EmitReceipt,
                        what: str) -> None:
    """Say what became of a lever: applied (and the status now), queued, or refused and why."""
    event = next(e for e in await harness.store.list_events(task_id)
                 if e.event.id == receipt.event_id)
    info = await harness.get(task_id)
    if event.status == "pending":
        click.echo(f"{task_id}: {what} queued; the worker holding the task applies it at its next"
                   f" step (now {info.record.status.value})")
        return
    records = [r for r in await harness.store.list_recovery_log(task_id)
               if r.get("event_id") == receipt.event_id]
    outcome = records[-1] if records else None
    if event.status == "failed" or (outcome and outcome["resume_strategy"].endswith(
            ("_failed", "_refused", "_ignored"))):
        detail = outcome["detail"] if outcome else event.status
        raise tt.TetherError(f"task {task_id}: {what} was not applied: {detail}")
    click.echo(f"{task_id}: {what} applied; now {info.record.status.value} at version"
               f" {info.version}")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def protocol(ctx: click.Context, as_json: bool) -> None:
    """Print the interruption protocol table (R24)."""
    table = _harness(ctx).protocol.table()
    if as_json:
        _print_json({k: {"priority": int(r.priority), "coalesce": r.coalesce}
                     for k, r in table.items()})
        return
    out = Table("event type", "priority", "coalescing class")
    for name, rule in sorted(table.items(), key=lambda kv: (kv[1].priority, kv[0])):
        out.add_row(name, f"P{int(rule.priority)}", rule.coalesce or "-")
    console.print(out)

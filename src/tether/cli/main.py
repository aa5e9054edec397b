"""The ``tether`` command line.

Commands that run or steer tasks load the application's harness from an
import path (``--app myapp.agents:harness``, as uvicorn and celery do); the
built-in examples are the default. ``--store`` (or ``TETHER_STORE``) picks
the store. Every listing takes ``--json``. Errors are one line and exit 1.

What tasks hold is printed literally and harmlessly (:mod:`tether.cli.render`);
loading the app and running a command with its harness is :mod:`tether.cli.app`;
the levers are :mod:`tether.cli.levers`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import orjson
from rich.console import Console
from rich.text import Text

import tether as tt
from tether.agent import completion_summary
from tether.bundle import dumps_bundle
from tether.cli.app import (
    DEFAULT_APP,
    app_harness,
    harness_command,
    json_option,
    load_app,
    moment_option,
    probe_store,
    quiet_cache_log,
    refuse_missing_store,
    serving_command,
    store_reading_command,
    warn_if_cache_unreachable,
)
from tether.cli.integrity import Report, check_store
from tether.cli.levers import LEVERS
from tether.cli.render import (
    console,
    echo,
    error,
    local_time,
    plain,
    print_json,
    say,
    short_time,
    shown,
    table,
    visible,
    visible_logs,
)
from tether.cli.schedules import schedule
from tether.cli.serve import lifespans_until, serve
from tether.cli.watch import watch
from tether.engine.admission import HELD_BACK
from tether.model import TaskRecord, check_task_id
from tether.store import DEFAULT_URL, LimitUsage, open_store

__all__ = ["load_app", "main"]


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
    ctx.obj = {"store": store, "app": app, "cache": cache,
               "store_given": source is not click.core.ParameterSource.DEFAULT,
               "app_given": ctx.get_parameter_source("app") is not click.core.ParameterSource.DEFAULT}


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
        error(exc)
        raise SystemExit(1) from None
    echo(f"applied: {', '.join(applied)}" if applied else
         "the SQLite schema is created when a store is opened: it is there, up to date"
         if ctx.obj["store"].startswith(("sqlite", "memory")) else "schema is up to date")


@main.command()
@click.option("--keep", is_flag=True, help="Keep the demo's folder instead of deleting it.")
def demo(keep: bool) -> None:
    """Run the four scenarios on a throwaway SQLite store: a user cuts into a batch, a
    worker is killed mid-refund, nested subtasks, a flaky upstream handed to a person."""
    from tether.demo import print_summary, run_demo

    workdir = Path(tempfile.mkdtemp(prefix="tether-demo-"))
    started = time.time()
    styled = Console()  # the demo's own text, with its markup; its data is the examples'
    try:
        outcome = asyncio.run(run_demo(workdir, styled, keep=keep))
        print_summary(styled, outcome)
        styled.print(f"finished in {time.time() - started:.1f}s")
    finally:
        if keep:
            say(f"demo files kept in {workdir}")
            say(f"look at them with: tether --store sqlite:///{workdir / 'tether.db'} ls")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if not outcome.ok:
        raise SystemExit(1)


def _app_argument(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.obj["app"] = value


@main.command()
@click.argument("app", required=False, expose_value=False, callback=_app_argument)
@click.option("--concurrency", type=click.IntRange(min=1), default=4, show_default=True,
              help="Tasks run at once.")
@click.option("--until-idle", is_flag=True, help="Exit when no task has work left.")
@click.option("--drain-timeout", type=click.FloatRange(min=0, min_open=True),
              help="Seconds in-flight steps may take on a graceful stop (default: settings).")
@click.option("--degraded", metavar="REASON",
              help="Start degraded: every task runs its agent's fallback.")
@click.option("--events", envvar="TETHER_EVENTS", metavar="REDIS_URL",
              help="Also take events from the Redis Stream tether:events (consumer group).")
@click.option("--lease-seconds", type=click.FloatRange(min=1.0),
              help="How long this worker's leases last before another worker may take its"
                   " tasks over (default: the app's settings).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True,
              help="What the worker logs: info says each task it takes over from a dead"
                   " worker, and each task handed to a person.")
@serving_command
async def worker(harness: tt.Harness, concurrency: int, until_idle: bool,
                 drain_timeout: float | None, degraded: str | None, events: str | None,
                 lease_seconds: float | None, log_level: str) -> None:
    """Claim, run and recover tasks of APP (module:harness; default --app).

    Any number of workers, in one process or many, may share a store. SIGTERM or
    Ctrl-C drains: no new claims, model calls in flight are cancelled (they are
    redone), side-effecting calls finish within the drain timeout, every task is
    committed and released, and the worker exits 0. A second signal exits at once;
    its tasks are then recovered by other workers when their leases expire.

    The app's lifespans (@harness.lifespan) are entered before the first claim and left
    after the drain. One that raises on enter stops the worker with exit status 1 before
    it claims anything; one that raises on exit makes the exit status 1. SIGTERM or Ctrl-C
    while one is still starting (a server that never answers) cancels that start, leaves
    the lifespans started before it and exits 1, naming it.
    """
    await probe_store(harness, warn=False)  # the worker logs an outage itself, and rides it out
    if drain_timeout is not None:
        harness.settings = harness.settings.replace(drain_timeout=drain_timeout)
    if lease_seconds is not None:
        harness.settings = harness.settings.replace(lease_seconds=lease_seconds)
    if not logging.getLogger().handlers:  # an app that set up logging decides for itself
        harness.log.setLevel(log_level.upper())
    if degraded:
        harness.degrade({"reason": degraded})
    stop = asyncio.Event()
    signals: list[str] = []
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _on_stop_signal, stop, signum, harness, signals)
    with visible_logs(harness.log):
        if harness.lifespans:
            echo(f"worker {harness.worker_id}: entering the app's lifespans"
                 f" ({', '.join(harness.lifespans)})", err=True)
        # A signal while one is still starting cuts that start: a LifespanFailed naming it,
        # as one that raised on enter is, is the command's error.
        async with lifespans_until(harness, stop, signals):
            await _work(harness, concurrency, until_idle, stop, events)
        if harness.lifespans:
            echo(f"worker {harness.worker_id}: left the app's lifespans", err=True)


async def _work(harness: tt.Harness, concurrency: int, until_idle: bool, stop: asyncio.Event,
                events: str | None) -> None:
    """The worker of ``tether worker``, in the app's lifespans: claim and run until stopped
    (or idle), then drain."""
    echo(f"worker {harness.worker_id} serving (concurrency {concurrency});"
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
    echo(f"worker {harness.worker_id} stopped; its tasks were released", err=True)


def _stream_ingest(harness: tt.Harness, url: str) -> Any:
    from tether.streams import StreamIngest  # redis-py only when asked for

    return StreamIngest(harness, url)


def _on_stop_signal(stop: asyncio.Event, signum: int, harness: tt.Harness,
                    signals: list[str]) -> None:
    name = signal.Signals(signum).name
    if stop.is_set():
        click.echo(f"{name} again: exiting now; other workers recover this worker's tasks when"
                   f" their leases expire (lease_seconds={harness.settings.lease_seconds})",
                   err=True)
        os._exit(128 + signum)
    signals.append(name)
    if harness.lifespans and not harness.lifespan_entered:
        click.echo(f"{name}: stopping: the app's lifespans have not finished starting, so the"
                   " start in flight is cancelled; send it again to exit at once", err=True)
        stop.set()
        return
    click.echo(f"{name}: draining (up to {harness.settings.drain_timeout}s for steps in"
               f" flight); send it again to exit at once", err=True)
    stop.set()


@main.command()
@click.argument("agent")
@click.option("--input", "task_input", metavar="JSON", callback=json_option,
              help="The task's input as JSON.")
@click.option("--id", "task_id", help="Choose the task id (default: generated).")
@click.option("--deadline", metavar="WHEN", callback=moment_option,
              help="When the task must be done: seconds from now, or an ISO time with a zone.")
@click.option("--not-before", metavar="WHEN", callback=moment_option,
              help="Do not start before then (same forms).")
@harness_command
async def submit(harness: tt.Harness, agent: str, task_input: Any, task_id: str | None,
                 deadline: float | datetime | None, not_before: float | datetime | None) -> None:
    """Create a task for AGENT.

    A task that stops on a wrong input is repaired with `resume ID --input JSON`: it goes on
    from where it stopped, and what already happened is not repeated.
    """
    _refuse_missing_input(harness, agent, task_input)
    task_id = await harness.submit(agent, task_input, task_id=task_id, deadline=deadline,
                                   not_before=not_before)
    echo(task_id)


def _refuse_missing_input(harness: tt.Harness, agent: str, task_input: Any) -> None:
    """An agent that declares ``input_required = True`` gets no task without an input (it
    would only fail on its first step)."""
    if task_input is None and getattr(harness.agents.get(agent), "input_required", False):
        raise click.UsageError(f"agent {agent!r} needs an input: give --input JSON")


@main.command(name="ls")
@click.option("--status", type=click.Choice([s.value for s in tt.Status]), help="Only this status.")
@click.option("--json", "as_json", is_flag=True)
@store_reading_command
async def list_tasks(harness: tt.Harness, status: str | None, as_json: bool) -> None:
    """List tasks, newest first (`show ID` for one task whole)."""
    records = await harness.reads.tasks(tt.Status(status) if status else None)
    if as_json:
        print_json([{**plain(r), "status": r.status.value} for r in records])
        return
    table(("id", "agent", "status", "ver", "updated", "reason"),
          ((r.task_id, r.agent, shown_status(r), r.head_version, short_time(r.updated_at),
            shown(r.reason or "", one_line=True, limit=200)) for r in records),
          no_wrap=(0, 2, 3, 4), cut=(1, 5), compact=True)


def shown_status(record: TaskRecord) -> str:
    """A task's status as a person reads it: one held back by a limit is not running."""
    if record.lease_owner is None and (record.reason or "").startswith(HELD_BACK):
        return "held back"
    return str(record.status.value)


SHOWN_CHARS = 400
"""How much of an input, a result or a dialog row the text views show (--json shows all)."""


@main.command()
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True)
@store_reading_command
async def show(harness: tt.Harness, task_id: str, as_json: bool) -> None:
    """Where a task is: status, step, stack, current call, recovery state, and the due time
    it waits for."""
    info = await harness.get(task_id)
    snap = info.snapshot
    if as_json:
        print_json({"version": info.version, "etag": info.etag, "reason": info.record.reason,
                    "wake_at": info.record.wake_at, "snapshot": orjson.loads(snap.dumps())})
        return
    say((task_id, "bold"), " ", snap.agent, "  status ", (shown_status(info.record), "bold"),
        f"  step {snap.step}  version {info.version}  etag {info.etag}")
    if info.damaged:
        say(("damaged: ", "red"), f"newer version(s) {', '.join(info.damaged)} cannot be read;"
            f" this is version {info.version}, the newest readable (`tether check` looks at"
            " the store)")
    say("input: ", shown(snap.input, limit=SHOWN_CHARS))
    if info.record.reason:
        say("reason: ", info.record.reason)
    wait = snap.stack[-1].wait if snap.stack else None
    if snap.status is tt.Status.WAITING and wait:
        due = wait.get("due_at")
        say("waiting for: an ", (str(wait.get("event_type")), "bold"), " event",
            f", until {local_time(due)} (then it times out)" if due else ", with no timeout",
            f"; `tether emit {task_id} {wait.get('event_type')} --payload JSON` sends one",
            f" (add \"wait\": \"{wait['id']}\" to an object payload to have it applied only to"
            " this wait)" if wait.get("id") else "")
    if info.record.wake_at is not None:
        say(f"due for a look at {local_time(info.record.wake_at)}: ",
            due_reason(info.record.wake_at, snap, info.record))
    if snap.deadline_at is not None:
        say(f"deadline: {local_time(snap.deadline_at)}")
    if snap.degraded or snap.worker_degraded:
        say("degraded: ", snap.degraded or snap.worker_degraded)
    for depth, frame in enumerate(snap.stack):
        todo = f" to-do: {', '.join(entry.kind for entry in frame.agenda)}" \
            if frame.agenda else ""
        say(f"{'  ' * depth}└─ ", frame.agent, f" (steps {frame.steps})", todo)
    if snap.usage.get("completions"):
        say(f"model: {usage_text(snap.usage)}")
    if snap.call:
        say("current call: ", snap.call.tool, "(", shown(snap.call.args, limit=SHOWN_CHARS),
            f") key={snap.call.key} status={snap.call.status} attempt={snap.call.attempt}")
    if snap.error and snap.error != info.record.reason:
        say("error: ", snap.error)
    if snap.result is not None:
        say("result: ", shown(snap.result, limit=SHOWN_CHARS))
    record = info.record
    if record.lease_owner and record.lease_until:
        say(f"held by {record.lease_owner} until {local_time(record.lease_until)}: if that"
            " worker has died, another takes the task over then")
    if snap.status in (tt.Status.NEEDS_HUMAN, tt.Status.FAILED):
        traced = [r for r in await harness.reads.recovery_log(task_id) if r.get("traceback")]
        if traced:
            say("traceback of the last failure:")
            say(shown(traced[-1]["traceback"]))
    if snap.status is tt.Status.NEEDS_HUMAN:
        say(("what a person can do:", "bold"))
        for line in next_steps(task_id, snap, info.version):
            say("  ", line)


def next_steps(task_id: str, snap: tt.Snapshot, version: int) -> list[str]:
    """The commands that move a task that needs a person, as they apply to this one."""
    steps = []
    if snap.call is not None and snap.call.status == "started":
        steps.append(f"tether decide {task_id} happened --result JSON | not_happened | skip"
                     f"   (say what became of {snap.call.tool}, key {snap.call.key})")
    steps += [f"tether resume {task_id} [--message TEXT] [--input JSON]   (once the cause is"
              " fixed)",
              f"tether rollback {task_id} --to VERSION   (`tether versions {task_id}` lists"
              f" them; this is {version})",
              f"tether fork {task_id} --paused   (a copy to try things on)",
              f"tether export {task_id} -o bundle.json   (everything, for whoever looks next)",
              f"tether cancel {task_id}"]
    return steps


DUE_SAME = 0.001
"""Seconds within which a task's due time is taken to be one of its snapshot's due times."""


def due_reason(wake_at: float, snap: tt.Snapshot, record: TaskRecord | None = None) -> str:
    """Which of the task's due times *wake_at* is, from what its snapshot holds (see
    :func:`tether.engine.timers.wake_time`), or the limit that holds it back."""
    if record is not None and (record.reason or "").startswith(HELD_BACK):
        return f"a look whether the limit lets it go on ({record.reason})"
    for due, reason in _due_times(snap):
        if isinstance(due, int | float) and abs(due - wake_at) < DUE_SAME:
            return reason
    if snap.status is tt.Status.PENDING:
        return "its scheduled start (--not-before)"
    return "events or a lever waiting in its inbox"


def _due_times(snap: tt.Snapshot) -> list[tuple[Any, str]]:
    """The due times a snapshot holds, each with what falls due then."""
    times: list[tuple[Any, str]] = []
    wait = snap.stack[-1].wait if snap.stack else None
    if snap.status is tt.Status.WAITING and wait:
        times.append((wait.get("due_at"), f"the timeout of its wait for {wait.get('event_type')}"
                      " (a timer)"))
    recovery = f" (recovery {snap.recovery.attempts})" if snap.recovery.attempts else ""
    if snap.status is tt.Status.RUNNING and snap.call is not None:
        times.append((snap.call.retry_at,
                      f"the back-off before {snap.call.tool} is tried again{recovery}"))
    if snap.status is tt.Status.RUNNING:
        times.append((snap.recovery.retry_at,
                      f"the back-off before the agent plans again{recovery}"))
    times.append((snap.deadline_at, "its deadline (--deadline)"))
    return times


def usage_text(usage: Mapping[str, int]) -> str:
    """A task's model usage in one line."""
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return (f"{usage.get('completions', 0):,} completions, {prompt + completion:,} tokens"
            f" ({prompt:,} prompt, {completion:,} completion)")


@main.command()
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True)
@store_reading_command
async def history(harness: tt.Harness, task_id: str, as_json: bool) -> None:
    """The task's full dialog, with its recovery records (crashes, retries, reconciles, a
    person's decisions) in time order among the rows (--json: the dialog rows only;
    `tether recovery ID --json` has the records)."""
    rows = await harness.history(task_id)
    if as_json:
        print_json(rows)
        return
    records = await harness.reads.recovery_log(task_id)
    lines: list[tuple[float, int, tuple[Any, ...]]] = [
        (float(row.get("at") or 0.0), n, (n, row.get("role"),
                                          shown(_row_content(row), limit=SHOWN_CHARS)))
        for n, row in enumerate(rows, 1)]
    lines += [(float(r.get("at") or 0.0), len(rows) + n,
               ("·", f"recovery: {r.get('resume_strategy')}",
                shown(r.get("detail") or "", limit=SHOWN_CHARS)))
              for n, r in enumerate(records, 1)]
    table(("#", "role", "content"), (cells for _, _, cells in sorted(lines)))


@main.command()
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True)
@store_reading_command
async def recovery(harness: tt.Harness, task_id: str, as_json: bool) -> None:
    """The task's recovery log: each crash, retry, reconcile, hand-over to a person and
    person's act, with what it was about and who did it."""
    await harness.reads.task(check_task_id(task_id))  # an unknown task is an error
    records = await harness.reads.recovery_log(task_id)
    if as_json:
        print_json(records)
        return
    table(("when", "strategy", "detail"),
          ((local_time(float(r.get("at") or 0.0)), r.get("resume_strategy"),
            shown(r.get("detail") or "", limit=SHOWN_CHARS)) for r in records))


def _row_content(row: Mapping[str, Any]) -> Any:
    """What a dialog row says, in one cell; a model call shows what it cost and how it ended."""
    if row.get("role") == "model":
        return completion_summary(row)
    return row.get("content", row.get("tool_call", row.get("error", "")))


@main.command()
@harness_command
async def gc(harness: tt.Harness) -> None:
    """Delete the finished tasks past their retention and the large values nothing refers
    to, now (workers do it every housekeeping_interval)."""
    swept = await harness.housekeep()
    kept = {status: keep for status, keep in harness.settings.retention().items()
            if keep is not None}
    retention = ("retention: " + ", ".join(f"{s} tasks {k:g}s" for s, k in kept.items())
                 if kept else "retention is off (Settings.retain_completed, retain_failed,"
                 " retain_cancelled are unset): finished tasks are kept for ever")
    echo(f"deleted {len(swept.tasks)} finished task(s) past their retention and"
         f" {swept.blobs} large value(s) nothing refers to; {retention}")


@main.command(name="limits")
@click.option("--json", "as_json", is_flag=True)
@store_reading_command
async def show_limits(harness: tt.Harness, as_json: bool) -> None:
    """Named limits as every worker shares them: each one's size (as the workers admitting
    under it define it), slots in use, tasks held back, admissions in the last minute, and a
    provider's 429 still closing one."""
    usage = await harness.reads.limits()
    if as_json:
        print_json([plain(u) for u in usage])
        return
    if not usage:
        echo("no limit has admitted a call yet")
        return
    table(["limit", "key", "size", "in use", "held back", "last minute", "closed until"],
          [[u.name, u.key or "-", _limit_size(u), u.in_use, u.waiting,
            u.admitted_last_minute, local_time(u.blocked_until) if u.blocked_until else "-"]
           for u in usage], no_wrap=[0, 3, 4, 5])


def _limit_size(limit: LimitUsage) -> str:
    parts = [f"{limit.concurrency} at once"] if limit.concurrency else []
    if limit.rate:
        parts.append(f"{limit.rate[0]} per {limit.rate[1]:g}s")
    if limit.tokens:
        parts.append(f"{limit.tokens[0]} tokens per {limit.tokens[1]:g}s")
    return ", ".join(parts) or "-"


@main.command()
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True)
@store_reading_command
async def versions(harness: tt.Harness, task_id: str, as_json: bool) -> None:
    """Kept snapshot versions, each with its step, status and time, so a person can tell
    which is before the charge (`rollback --to` and `fork --from` take any of them)."""
    from tether.web.timeline import version_labels

    await harness.reads.task(tt.model.check_task_id(task_id))  # an unknown task is an error
    sizes = {v: size for v, _, size in await harness.reads.versions(task_id)}
    labels = await version_labels(harness, task_id)
    if as_json:
        print_json([{"version": k.version, "step": k.step, "status": k.status,
                     "created_at": k.at, "bytes": sizes.get(k.version)} for k in labels])
        return
    table(("version", "step", "status", "created", "bytes"),
          ((k.version, k.step, k.status, local_time(k.at), sizes.get(k.version))
           for k in labels))


@main.command()
@click.argument("task_id")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True)
@store_reading_command
async def export(harness: tt.Harness, task_id: str, output: str) -> None:
    """Write the task's handoff bundle (reason, failed call, dialog, events, recovery log)
    to a JSON file."""
    bundle = await harness.export(task_id)
    Path(output).write_bytes(dumps_bundle(bundle))
    echo(f"wrote {output} ({len(bundle['history'])} dialog rows, {len(bundle['events'])} events)")


@main.command()
@click.argument("app")
@click.argument("agent")
@click.option("--input", "task_input", metavar="JSON", callback=json_option,
              help="The task's input as JSON.")
@click.option("--seeds", type=click.IntRange(min=1), default=20, show_default=True,
              help="How many seeded runs of each kind.")
@click.option("--seed", type=click.IntRange(min=0), help="Run only this seed (to replay a violation).")
@click.option("--only", type=click.Choice(["faults", "kills"]), help="Only one kind of run.")
def torture(app: str, agent: str, task_input: Any, seeds: int, seed: int | None,
            only: str | None) -> None:
    """Run AGENT of APP under injected faults and worker kills; report what broke.

    Faults: tool errors, slow tools, model errors, events at awkward moments. Kills: a
    worker process SIGKILLed at a named failpoint, then fresh workers finish the task.
    Every run is compared with an undisturbed one, which must complete (else exit 1: there
    is nothing to compare with). Exit 1 if any violation is found; each comes with the
    command that replays it.

    WARNING: the app's tools run for real, dozens of times, against whatever they call
    (payments, mail, databases): point the app at test services first.
    """
    from tether.testing import Target
    from tether.testing import torture as run_torture

    target = Target(app, agent, task_input)
    first, count = (seed, 1) if seed is not None else (0, seeds)
    started = time.time()
    try:
        with console().status("torturing…") as status:
            report = asyncio.run(run_torture(
                target, seeds=count, first_seed=first, kills=only != "faults",
                faults=only != "kills", progress=lambda text: status.update(Text(visible(text)))))
    except tt.TetherError as exc:
        error(exc)
        raise SystemExit(1) from None
    say(f"{report.runs} runs, {report.kills} worker kills at {len(report.points)} failpoints"
        f" ({', '.join(sorted(report.points)) or '-'}), outcomes ", report.outcomes,
        f", {time.time() - started:.1f}s")
    if report.ok:
        say(("no violations", "green"))
        return
    say((f"{len(report.violations)} violation(s)", "red"))
    for v in report.violations:
        say(f"- seed {v.seed}: ", (v.kind, "bold"), ": ", v.detail)
        say("  replay: ", v.replay)
    raise SystemExit(1)


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def protocol(ctx: click.Context, as_json: bool) -> None:
    """Print the interruption protocol: each event type's priority, coalescing class, and
    whether it sets aside the not-started calls of the answer being carried out."""
    rules = app_harness(ctx).protocol.table()
    if as_json:
        print_json({k: {"priority": int(r.priority), "coalesce": r.coalesce,
                        "supersedes": r.supersedes} for k, r in rules.items()})
        return
    table(("event type", "priority", "coalescing class", "sets the answer aside"),
          ((name, f"P{int(rule.priority)}", rule.coalesce or "-",
            "yes" if rule.supersedes else "-")
           for name, rule in sorted(rules.items(), key=lambda kv: (kv[1].priority, kv[0]))))


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def check(ctx: click.Context, as_json: bool) -> None:
    """Check the store: its own integrity check, then every kept version of every task loaded
    as a worker would load it. One line per problem, naming the task and version.

    Exit status: 0 nothing wrong, 1 problems found, 2 the store could not be opened.
    """
    async def go() -> Report:
        harness = app_harness(ctx)
        try:
            refuse_missing_store(harness)  # a check creates no store
            return await check_store(harness)
        finally:
            await harness.close()

    try:
        with quiet_cache_log(warn_if_cache_unreachable(ctx)):
            report = asyncio.run(go())
    except tt.TetherError as exc:  # StoreUnreachable, NoStore, or a URL that names no store
        error(exc)
        raise SystemExit(2) from None
    if as_json:
        print_json(report.to_dict())
    else:
        for problem in report.problems:
            echo(problem.line())
        if not report.store_checked:
            echo("(this store has no integrity check of its own; its tasks were checked)")
        summary = f"checked {report.tasks} tasks, {report.versions} versions: "
        say(summary, ("no problems", "green") if report.ok else
            (f"{len(report.problems)} problem(s)" + (
                f", {len(report.unreadable)} task(s) with no readable version"
                if report.unreadable else ""), "red"))
    raise SystemExit(0 if report.ok else 1)


for _lever in LEVERS:
    main.add_command(_lever)
main.add_command(watch)
main.add_command(serve)
main.add_command(schedule)

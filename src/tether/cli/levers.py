"""The command line's levers: send an event, resume, decide, roll back, cancel, fork (R26).

Each lever names who pulled it (``cli:`` and the login name) and says what became of it:
applied (and the status now), queued for the worker holding the task, or not applied and
why (exit status 1).
"""

from __future__ import annotations

from typing import Any

import click

import tether as tt
from tether.cli.app import harness_command, json_arg, json_option, steering_command, who
from tether.cli.render import echo, visible
from tether.engine.calls import DECISIONS
from tether.engine.inbox import MAX_NAME
from tether.harness import TaskInfo
from tether.model import EventStatus
from tether.protocol import CONTROL_EVENTS, RESERVED_EVENTS
from tether.strategies import Strategy


@click.command()
@click.argument("task_id")
@click.argument("event_type")
@click.option("--payload", metavar="JSON", callback=json_option, help="Event payload as JSON.")
@click.option("--priority", type=click.IntRange(0, 4),
              help="0 (most urgent) to 4; needed for a type the protocol does not list.")
@click.option("--source-event-id", type=click.STRING, callback=lambda _c, _p, v: _sender_id(v),
              help="Sender's id; an event repeating one already stored is dropped.")
@harness_command
async def emit(harness: tt.Harness, task_id: str, event_type: str, payload: Any,
               priority: int | None, source_event_id: str | None) -> None:
    """Send an event to a task; returns once it is stored.

    `tether protocol` lists the event types and their priorities."""
    _check_event_type(harness, event_type, priority)
    receipt = await harness.emit(tt.Event(event_type, task_id, payload, priority=priority,
                                          source_event_id=source_event_id))
    echo(f"event {receipt.event_id}: {receipt.outcome}"
         + (f" ({receipt.coalesced} older coalesced)" if receipt.coalesced else ""))


def _json_object(text: str | None, what: str) -> dict[str, Any] | None:
    value = json_arg(text, what)
    if value is not None and not isinstance(value, dict):
        raise click.UsageError(f"{what} must be a JSON object, such as '{{\"source\": \"mirror\"}}'")
    return value


def _sender_id(value: str | None) -> str | None:
    if value is not None and len(value) > MAX_NAME:
        raise click.UsageError(f"--source-event-id is {len(value)} characters long; at most"
                               f" {MAX_NAME}")
    return value


def _check_event_type(harness: tt.Harness, event_type: str, priority: int | None) -> None:
    """Refuse, in the command line's words, an event type `emit` cannot send."""
    if event_type in CONTROL_EVENTS:
        raise tt.ReservedEventType(f"{event_type!r} is a lever, not an event: use"
                                   f" `tether {event_type}` instead")
    if event_type in RESERVED_EVENTS:
        raise tt.ReservedEventType(f"{event_type!r} events are the harness's own timers;"
                                   " no one else may send them")
    known = harness.protocol.table()
    if priority is None and event_type not in known:
        raise tt.UnknownEventType(
            f"event type {event_type!r} is not in the interruption protocol: give --priority"
            f" 0-4 to send it anyway, or add it to the app's protocol (known: {', '.join(sorted(known))})")


@click.command()
@click.argument("task_id")
@click.option("--message", help="A note for the agent, added to the dialog.")
@click.option("--patch", metavar="JSON", callback=lambda _c, _p, v: _json_object(v, "--patch"),
              help="A JSON object merged into the current frame's scratch data (the agent's own"
                   " working state).")
@click.option("--input", "new_input", metavar="JSON",
              callback=lambda _c, _p, v: None if v is None else (json_arg(v, "--input"),),
              help="A corrected input for the task, in place of the one it was submitted with"
                   " (the old one stays in its history).")
@click.option("--earlier-result", is_flag=True,
              help="For a task holding a repeat of a side effect that already succeeded: do not"
                   " run it, answer the agent with the earlier identical call's result.")
@click.option("--etag", help="The etag `tether show` printed; refused if the task is no longer"
                             " as shown, so a resume is never applied to a later stop.")
@steering_command
async def resume(harness: tt.Harness, task_id: str, message: str | None,
                 patch: dict[str, Any] | None, new_input: tuple[Any] | None,
                 earlier_result: bool, etag: str | None) -> None:
    """Resume a paused, parked or failed task.

    A task whose side-effecting call has an unknown outcome is not resumed: say what happened
    with `decide` instead, so the call is never repeated blindly. A task submitted with the
    wrong input is repaired with --input: the agent plans again from where it stopped, and
    what already happened is not repeated. A task holding a repeat of a side effect runs it
    when resumed, or answers it from the earlier call with --earlier-result.
    """
    corrected = {} if new_input is None else {"input": new_input[0]}
    receipt = await harness.resume(task_id, message=message, frame_patch=patch, by=who(),
                                   earlier_result=earlier_result, etag=etag, **corrected)
    await report_lever(harness, task_id, receipt, "resume")


@click.command()
@click.argument("task_id")
@click.argument("outcome", type=click.Choice(DECISIONS))
@click.option("--result", "result", metavar="JSON", callback=json_option,
              help="With 'happened': the call's result, as the agent will see it.")
@click.option("--key", help="The key of the call you looked at (`tether show`); refused if the"
                            " call in doubt is another by now.")
@click.option("--attempt", type=click.IntRange(min=0),
              help="Its attempt, as shown; refused if the call was attempted again since.")
@click.option("--etag", help="The etag `tether show` printed; refused if the task is no longer"
                             " as shown (e.g. its worker died since you saw the call running).")
@steering_command
async def decide(harness: tt.Harness, task_id: str, outcome: str, result: Any,
                 key: str | None, attempt: int | None, etag: str | None) -> None:
    """Say what became of a call whose outcome is unknown, and carry on.

    happened: it took effect (its result is --result); nothing is run again.
    not_happened: it did not; it runs now, with the same idempotency key.
    skip: drop it; the agent sees it was skipped.
    """
    receipt = await harness.decide(task_id, outcome, result, by=who(), key=key, attempt=attempt,
                                   etag=etag)
    await report_lever(harness, task_id, receipt, f"decide {outcome}")


@click.command()
@click.argument("task_id")
@click.option("--to", "version", type=click.IntRange(min=1), required=True,
              help="A kept version (see `versions`).")
@click.option("--redo-side-effects", is_flag=True,
              help="Run the side-effecting calls made after that version again.")
@steering_command
async def rollback(harness: tt.Harness, task_id: str, version: int, redo_side_effects: bool) -> None:
    """Roll a task back to a kept version."""
    receipt = await harness.rollback(task_id, version, redo_side_effects=redo_side_effects,
                                     by=who())
    await report_lever(harness, task_id, receipt, f"rollback to version {version}")


@click.command()
@click.argument("task_id")
@steering_command
async def cancel(harness: tt.Harness, task_id: str) -> None:
    """Cancel a task (a side-effecting call in flight is let finish first)."""
    receipt = await harness.cancel(task_id, by=who())
    await report_lever(harness, task_id, receipt, "cancel")


@click.command()
@click.argument("task_id")
@click.option("--from", "version", type=click.IntRange(min=1),
              help="A kept version (see `versions`); default: the newest.")
@click.option("--id", "new_task_id", help="The fork's id (default: generated).")
@click.option("--redo-side-effects", is_flag=True,
              help="Make the call open at that version again, even if the task made it.")
@click.option("--paused", is_flag=True,
              help="Start the fork paused: look at it first, then `tether resume` it.")
@steering_command
async def fork(harness: tt.Harness, task_id: str, version: int | None, new_task_id: str | None,
               redo_side_effects: bool, paused: bool) -> None:
    """Start a new task from a kept version of TASK_ID, which stays as it is.

    The fork has its own id and idempotency keys and the task's history up to that version;
    a call the task already made is not made again unless --redo-side-effects. A fork of a
    running or waiting version goes on at once (unless --paused). Prints the fork's id, then
    (on stderr) where it came from and what it does now.
    """
    fork_id = await harness.fork(task_id, version, new_task_id=new_task_id,
                                 redo_side_effects=redo_side_effects, paused=paused, by=who())
    echo(fork_id)
    record = await harness.reads.task(fork_id)
    source = await harness.reads.task(task_id)
    note = (f"forked from {task_id} v{version or source.head_version}; it is"
            f" {record.status.value}")
    if record.status is tt.Status.PAUSED:
        note += f": `tether resume {fork_id}` starts it"
    click.echo(visible(note), err=True)


@click.command()
@click.argument("task_id")
@click.option("--yes", is_flag=True, help="Do not ask; delete.")
@steering_command
async def delete(harness: tt.Harness, task_id: str, yes: bool) -> None:
    """Delete a task and everything it stored, for good.

    Refused while a worker holds the task: cancel a running task first. Finished tasks are
    also deleted by the workers once past their retention (Settings.retain_completed, ...).
    """
    record = await harness.reads.task(task_id)
    if not yes and not click.confirm(f"delete task {task_id} ({record.status.value}) and"
                                     " everything it stored?", err=True):
        raise SystemExit(1)
    await harness.delete(task_id, by=who())
    echo(f"{task_id}: deleted")


LEVERS = (emit, resume, decide, rollback, cancel, fork, delete)


def _who_applies(harness: tt.Harness, info: TaskInfo) -> str:
    """Who will apply a lever left queued: the worker holding the task, or, when this process
    lacks the task's code, a worker that has it."""
    held = info.record.holder()
    if held is not None:
        return f"worker {held}, which holds the task, applies it at its next step"
    lacking = harness.lacks_code(info.snapshot)
    if lacking:
        hint = ("the app named here is not the task's" if harness.agents
                else "name the task's app with --app to apply it from here")
        return ("this process does not have the task's code (" + "; ".join(lacking) + "), so"
                f" it does not apply the lever itself: a worker running the task's app applies it"
                f" ({hint})")
    return "a worker applies it when it next claims the task"


async def report_lever(harness: tt.Harness, task_id: str, receipt: tt.EmitReceipt,
                       what: str) -> None:
    """Say what became of a lever: applied (and the status now), queued, or refused and why."""
    event = next(e for e in await harness.reads.events(task_id)
                 if e.event.id == receipt.event_id)
    info = await harness.get(task_id)
    if event.status == EventStatus.PENDING:
        echo(f"{task_id}: {what} queued; {_who_applies(harness, info)}"
             f" (now {info.record.status.value})")
        return
    records = [r for r in await harness.reads.recovery_log(task_id)
               if r.get("event_id") == receipt.event_id]
    outcome = records[-1] if records else None
    if event.status == EventStatus.FAILED or (outcome and Strategy.is_refusal(
            outcome["resume_strategy"])):
        detail = outcome["detail"] if outcome else event.status
        raise tt.TetherError(f"task {task_id}: {what} was not applied: {detail}")
    echo(f"{task_id}: {what} applied; now {info.record.status.value} at version {info.version}")

"""The command line's levers: send an event, resume, decide, roll back, cancel (R26).

Each lever names who pulled it (``cli:`` and the login name) and says what became of it:
applied (and the status now), queued for the worker holding the task, or not applied and
why (exit status 1).
"""

from __future__ import annotations

import click

import tether as tt
from tether.cli.app import harness_command, json_arg, who
from tether.cli.render import echo
from tether.engine.decisions import DECISIONS
from tether.model import EventStatus
from tether.strategies import Strategy


@click.command()
@click.argument("task_id")
@click.argument("event_type")
@click.option("--payload", help="Event payload as JSON.")
@click.option("--priority", type=click.IntRange(0, 4), help="Override the protocol's priority.")
@click.option("--source-event-id", help="Sender's id; a repeat is dropped (R6).")
@harness_command
async def emit(harness: tt.Harness, task_id: str, event_type: str, payload: str | None,
               priority: int | None, source_event_id: str | None) -> None:
    """Send an event to a task; returns once it is stored."""
    receipt = await harness.emit(tt.Event(event_type, task_id, json_arg(payload, "--payload"),
                                          priority=priority, source_event_id=source_event_id))
    echo(f"event {receipt.event_id}: {receipt.outcome}"
         + (f" ({receipt.coalesced} older coalesced)" if receipt.coalesced else ""))


@click.command()
@click.argument("task_id")
@click.option("--message", help="A note for the agent, added to the dialog.")
@click.option("--patch", help="JSON object merged into the current frame's scratch data.")
@harness_command
async def resume(harness: tt.Harness, task_id: str, message: str | None, patch: str | None) -> None:
    """Resume a paused, parked or failed task.

    A task whose side-effecting call has an unknown outcome is not resumed: say what happened
    with `decide` instead, so the call is never repeated blindly.
    """
    frame_patch = json_arg(patch, "--patch")
    if frame_patch is not None and not isinstance(frame_patch, dict):
        raise click.BadParameter("--patch must be a JSON object")
    receipt = await harness.resume(task_id, message=message, frame_patch=frame_patch, by=who())
    await report_lever(harness, task_id, receipt, "resume")


@click.command()
@click.argument("task_id")
@click.argument("outcome", type=click.Choice(DECISIONS))
@click.option("--result", "result_json", metavar="JSON",
              help="With 'happened': the call's result, as the agent will see it.")
@harness_command
async def decide(harness: tt.Harness, task_id: str, outcome: str, result_json: str | None) -> None:
    """Say what became of a call whose outcome is unknown, and carry on (R10, R26).

    happened: it took effect (its result is --result); nothing is run again.
    not_happened: it did not; it runs now, with the same idempotency key.
    skip: drop it; the agent sees it was skipped.
    """
    receipt = await harness.decide(task_id, outcome, json_arg(result_json, "--result"), by=who())
    await report_lever(harness, task_id, receipt, f"decide {outcome}")


@click.command()
@click.argument("task_id")
@click.option("--to", "version", type=int, required=True, help="A kept version (see `versions`).")
@click.option("--redo-side-effects", is_flag=True, help="Run calls after the version again (E4).")
@harness_command
async def rollback(harness: tt.Harness, task_id: str, version: int, redo_side_effects: bool) -> None:
    """Roll a task back to a kept version."""
    receipt = await harness.rollback(task_id, version, redo_side_effects=redo_side_effects,
                                     by=who())
    await report_lever(harness, task_id, receipt, f"rollback to version {version}")


@click.command()
@click.argument("task_id")
@harness_command
async def cancel(harness: tt.Harness, task_id: str) -> None:
    """Cancel a task (a side-effecting call in flight is let finish first)."""
    receipt = await harness.cancel(task_id, by=who())
    await report_lever(harness, task_id, receipt, "cancel")


LEVERS = (emit, resume, decide, rollback, cancel)


async def report_lever(harness: tt.Harness, task_id: str, receipt: tt.EmitReceipt,
                       what: str) -> None:
    """Say what became of a lever: applied (and the status now), queued, or refused and why."""
    event = next(e for e in await harness.reads.events(task_id)
                 if e.event.id == receipt.event_id)
    info = await harness.get(task_id)
    if event.status == EventStatus.PENDING:
        echo(f"{task_id}: {what} queued; the worker holding the task applies it at its next"
             f" step (now {info.record.status.value})")
        return
    records = [r for r in await harness.reads.recovery_log(task_id)
               if r.get("event_id") == receipt.event_id]
    outcome = records[-1] if records else None
    if event.status == EventStatus.FAILED or (outcome and Strategy.is_refusal(
            outcome["resume_strategy"])):
        detail = outcome["detail"] if outcome else event.status
        raise tt.TetherError(f"task {task_id}: {what} was not applied: {detail}")
    echo(f"{task_id}: {what} applied; now {info.record.status.value} at version {info.version}")

"""``tether schedule``: cron schedules that start tasks (add, ls, pause, resume, run, delete).

Workers start the runs: each looks every second for schedules that are due (see the guide,
section 16, for missed runs and time zones).
"""

from __future__ import annotations

from typing import Any

import click

import tether as tt
from tether.cli.app import harness_command, json_option, store_reading_command
from tether.cli.render import echo, local_time, plain, print_json, table
from tether.store import ScheduleRecord


@click.group()
def schedule() -> None:
    """Cron schedules that start tasks, shared by every worker."""


@schedule.command()
@click.argument("name")
@click.option("--cron", required=True, metavar="EXPR",
              help="Five fields (minute hour day month weekday), e.g. '0 9 * * 1-5'; a sixth"
                   " gives seconds.")
@click.option("--agent", required=True, help="The agent each run's task is for.")
@click.option("--input", "task_input", metavar="JSON", callback=json_option,
              help="Each run's task input, as JSON.")
@click.option("--timezone", "timezone", default="UTC", show_default=True,
              help="The IANA time zone the cron expression is read in (e.g. Europe/Paris).")
@click.option("--catch-up", type=click.IntRange(0, 100), default=0, show_default=True,
              help="Runs missed while no worker ran to start late (the most recent ones);"
                   " 0 skips them.")
@click.option("--paused", is_flag=True, help="Create it paused.")
@harness_command
async def add(harness: tt.Harness, name: str, cron: str, agent: str, task_input: Any,
              timezone: str, catch_up: int, paused: bool) -> None:
    """Create schedule NAME, or replace its definition."""
    record = await harness.schedule(name, cron, agent, task_input, timezone=timezone,
                                    catch_up=catch_up, paused=paused)
    echo(f"{record.name}: {record.cron} ({record.timezone}) starts {record.agent};"
         f" next run at {_when(record)}")


@schedule.command(name="ls")
@click.option("--json", "as_json", is_flag=True)
@store_reading_command
async def list_schedules(harness: tt.Harness, as_json: bool) -> None:
    """Every schedule, with its next run."""
    found = await harness.reads.schedules()
    if as_json:
        print_json([plain(record) for record in found])
        return
    if not found:
        echo("no schedules (add one with `tether schedule add`)")
        return
    table(("name", "cron", "zone", "agent", "state", "next run", "last run"),
          ((s.name, s.cron, s.timezone, s.agent, "paused" if s.paused else "active",
            _when(s), local_time(s.last_run_at) if s.last_run_at else "-") for s in found),
          no_wrap=(0, 4), compact=True)


@schedule.command()
@click.argument("name")
@harness_command
async def pause(harness: tt.Harness, name: str) -> None:
    """Stop starting runs until resumed."""
    await harness.pause_schedule(name)
    echo(f"{name}: paused")


@schedule.command()
@click.argument("name")
@harness_command
async def resume(harness: tt.Harness, name: str) -> None:
    """Start runs again from the next time on (runs that fell while paused are skipped)."""
    record = await harness.pause_schedule(name, paused=False)
    echo(f"{name}: active; next run at {_when(record)}")


@schedule.command()
@click.argument("name")
@harness_command
async def run(harness: tt.Harness, name: str) -> None:
    """Start one run now, outside the schedule's times; prints the task id."""
    echo(await harness.run_schedule_now(name))


@schedule.command()
@click.argument("name")
@harness_command
async def delete(harness: tt.Harness, name: str) -> None:
    """Delete the schedule (the tasks it started stay)."""
    await harness.delete_schedule(name)
    echo(f"{name}: deleted")


def _when(record: ScheduleRecord) -> str:
    if record.paused or record.next_at is None:
        return "- (paused)"
    return local_time(record.next_at)

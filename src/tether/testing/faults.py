"""Fault injection: wrap a harness's tools and agents so they fail the way production does.

A :class:`FaultPlan` says how often each fault happens; :func:`install` wraps
every registered tool and agent of a harness, drawing from one seeded random
generator, so a run is reproducible from its seed. Every real execution of a
tool is written to a :class:`Ledger` (a small SQLite file, so child processes
killed mid-call record what they did), which is how repeated side effects are
found afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

import tether as tt
from tether.tools import ToolContext, in_thread, is_async, what_it_does


@dataclass(frozen=True)
class FaultPlan:
    """How often each fault is injected (probabilities per call, 0 to 1)."""

    tool_error: float = 0.15
    """The tool raises before doing anything (a dependency refused the request)."""
    slow_tool: float = 0.1
    """The tool does its work, then answers late: past its timeout if it has one (raised as
    the timeout tether would raise, without waiting that long), else just slowly."""
    slow_seconds: float = 0.05
    model_error: float = 0.1
    """The agent's plan (the model call) raises."""
    awkward_event: float = 0.2
    """While a tool runs, a progress signal, a duplicate resume or a user message arrives."""

    @classmethod
    def none(cls) -> FaultPlan:
        return cls(0, 0, 0, 0, 0)


class InjectedFault(RuntimeError):
    """A failure tether.testing made up; seeing it in a reason is expected."""


class Ledger:
    """Every real tool execution: (tool, idempotency key, arguments, side effect?)."""

    def __init__(self, path: str) -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout = 10000")
        self._db.execute("CREATE TABLE IF NOT EXISTS runs (tool TEXT, key TEXT, args TEXT,"
                         " side_effect INTEGER)")

    def record(self, tool: str, key: str, args: dict[str, Any], side_effect: bool) -> None:
        what = what_it_does(args)
        self._db.execute("INSERT INTO runs VALUES (?, ?, ?, ?)",
                         (tool, key, orjson.dumps(what, option=orjson.OPT_SORT_KEYS).decode(),
                          int(side_effect)))

    def keys_by_args(self) -> Counter[tuple[str, str]]:
        """For the tools without side effects (those have a check of their own): under how
        many keys each call was made. More keys than an uninterrupted run uses means the
        agent planned the call again: it lost its place."""
        return Counter({(t, a): n for t, a, n in self._db.execute(
            "SELECT tool, args, COUNT(DISTINCT key) FROM runs WHERE NOT side_effect"
            " GROUP BY tool, args")})

    def side_effects_by_key(self) -> Counter[tuple[str, str]]:
        return Counter((t, k) for t, k in self._db.execute(
            "SELECT tool, key FROM runs WHERE side_effect"))

    def side_effects_by_args(self) -> Counter[tuple[str, str]]:
        return Counter((t, a) for t, a in self._db.execute(
            "SELECT tool, args FROM runs WHERE side_effect"))

    def close(self) -> None:
        self._db.close()


def install(harness: tt.Harness, plan: FaultPlan, rng: random.Random, ledger: Ledger) -> None:
    """Wrap every tool and agent of *harness* with *plan*'s faults and the *ledger*."""
    for tool in harness.tools.values():
        tool.fn = _faulty_tool(harness, tool, plan, rng, ledger)
    for agent in harness.agents.values():
        _faulty_agent(agent, plan, rng)


def _faulty_tool(harness: tt.Harness, tool: tt.Tool, plan: FaultPlan, rng: random.Random,
                 ledger: Ledger) -> Any:
    real = tool.__wrapped__  # the app's own function (install may wrap a tool again)
    if not is_async(real):  # a plain def: run in a thread, as Tool.run does
        real = in_thread(real, tool.name)

    async def run(ctx: ToolContext, **args: Any) -> Any:
        if rng.random() < plan.awkward_event:
            await _awkward_event(harness, ctx.task_id, rng)
        if rng.random() < plan.tool_error:
            raise InjectedFault(f"injected: {tool.name} refused by its dependency")
        ledger.record(tool.name, ctx.idempotency_key, args, tool.side_effect)
        result = await real(ctx, **args)
        if rng.random() < plan.slow_tool:
            if tool.timeout is not None:  # the work was done, the answer never came in time
                raise tt.ToolTimeout(f"injected: {tool.name} answered after its"
                                     f" {tool.timeout}s timeout")
            await asyncio.sleep(plan.slow_seconds)
        return result

    return run


async def _awkward_event(harness: tt.Harness, task_id: str, rng: random.Random) -> None:
    choice = rng.choice(["progress", "resume", "user_message"])
    payload: Any = {"pct": rng.randint(0, 100)} if choice == "progress" else (
        "by the way, carry on" if choice == "user_message" else None)
    # a closed task or a full inbox is an answer, not a fault of the harness
    with contextlib.suppress(tt.TetherError):
        await harness.emit(tt.Event(choice, task_id, payload,
                                    source_event_id=f"torture-{rng.randint(0, 3)}"))


def _faulty_agent(agent: tt.Agent, plan: FaultPlan, rng: random.Random) -> None:
    real_plan = agent.plan

    async def planned(task: tt.TaskView) -> tt.Action | Sequence[tt.Action]:
        if rng.random() < plan.model_error:
            raise InjectedFault(f"injected: model call for {agent.name} failed (503)")
        return await real_plan(task)

    agent.plan = planned  # type: ignore[method-assign]

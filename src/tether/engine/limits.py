"""What a task spends, and the bounds that stop a runaway agent before it spends more (R12).

A model that loops is the costly failure of agents in production: one run paid 115 refunds,
each under its own idempotency key because the model asked for it each time. Besides the step
limit (``recovery.over_step_limit``) two bounds hold, each a setting: the model completions a
task pays for (``max_completions``) and how often one side-effecting call, the same tool
with the same arguments, may run (``max_identical_side_effects``). Over either the task goes
to a person naming it; a person's resume grants the same budget again.

The completions an agent records while planning (``TaskView.record_completion``) are
written here, by the runner: a ``model`` row in the dialog and the task's usage totals.
"""

from __future__ import annotations

from tether.agent import TaskView, completion_usage
from tether.engine.task import RunningTask, hand_to_person
from tether.model import CallState, Snapshot
from tether.strategies import Strategy
from tether.tools import args_hash, what_it_does

SIDE_EFFECTS_KEPT = 256
"""Distinct side-effecting calls counted per task; the oldest are forgotten beyond it, so the
head stays small in a long task (a loop repeats recent calls)."""


def record_completions(task: RunningTask, view: TaskView) -> None:
    """Write the completions a plan paid for: dialog rows and usage totals."""
    usage = task.snap.usage
    for record in view.completions:
        for name, value in completion_usage(record).items():
            usage[name] = usage.get(name, 0) + value
            task.counters[f"model_{name}"] += value  # this process's, for /metrics
        task.append_history({"role": "model", **record})
    view.completions.clear()


def tokens_of(view: TaskView) -> int:
    """The tokens the completions a plan recorded used (prompt and completion)."""
    return sum(usage["prompt_tokens"] + usage["completion_tokens"]
               for usage in map(completion_usage, view.completions))


def over_completion_limit(task: RunningTask) -> bool:
    """Whether the task has paid for its budget of completions; if so it goes to a person."""
    usage = task.snap.usage
    used = usage.get("completions", 0) - usage.get("budget_start", 0)
    limit = task.settings.max_completions
    if used < limit:
        return False
    hand_to_person(task, f"the task paid for {used} model completions, its limit"
                         f" (max_completions={limit}); look at what it is doing, then resume it"
                         f" for {limit} more", strategy=Strategy.COMPLETION_LIMIT)
    return True


def repeated_side_effect(task: RunningTask, call: CallState) -> bool:
    """Count a new side-effecting call; True, with the task handed to a person and the call
    not run, when it is one identical call too many."""
    seen = task.snap.side_effects
    key = f"{call.tool}:{args_hash(call.tool, what_it_does(call.args))[:16]}"
    count = seen.pop(key, 0) + 1  # re-inserted below: the newest calls are kept
    limit = task.settings.max_identical_side_effects
    seen[key] = min(count, limit)
    while len(seen) > SIDE_EFFECTS_KEPT:
        del seen[next(iter(seen))]
    if count <= limit:
        return False
    hand_to_person(task, f"the agent asked for {call.tool} with the same arguments a"
                         f" {_ordinal(count)} time (max_identical_side_effects={limit}); it did"
                         " not run. If it should, resume the task",
                   strategy=Strategy.REPEATED_SIDE_EFFECT)
    return True


def grant_again(snap: Snapshot) -> None:
    """A person's resume: the same budget of completions and repeats again."""
    snap.usage["budget_start"] = snap.usage.get("completions", 0)
    snap.side_effects.clear()


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"

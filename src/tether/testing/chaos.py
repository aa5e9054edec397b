"""``tether torture``: run a user's own agent under faults and kills, and say what broke.

Three kinds of run, each from a seed so any failure can be replayed:

- a *baseline*: the task with no faults, for the result to compare against;
- *fault runs* in this process: tool errors, slow tools, model errors and events
  arriving at awkward moments (:mod:`tether.testing.faults`);
- *kill runs*: a worker process is SIGKILLed at a named failpoint (chosen by
  the seed), then fresh workers finish the task.

Violations are reported in plain words: a side effect repeated, an accepted event
left unapplied, a task stuck with no way out, a restart changing the result.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

import tether as tt
from tether import apps
from tether.model import EventStatus
from tether.testing.faults import FaultPlan, Ledger, install

SETTLED = frozenset({tt.Status.COMPLETED, tt.Status.FAILED, tt.Status.CANCELLED,
                     tt.Status.NEEDS_HUMAN, tt.Status.WAITING, tt.Status.PAUSED})
KILL_POINTS = ("before_plan_recorded", "after_resume_point", "after_tool_before_commit",
               "mid_checkpoint", "after_checkpoint")
"""Points every worker passes while running a task; ``during_recovery`` is aimed at the first
rescuer, and tools may call ``inside_tool`` themselves."""
FAST = {"lease_seconds": 0.5, "poll_interval": 0.02, "recovery_backoff": 0.01}


@dataclass(frozen=True)
class Violation:
    seed: int
    kind: str
    detail: str
    replay: str


@dataclass
class TortureReport:
    runs: int = 0
    kills: int = 0
    points: set[str] = field(default_factory=set)
    outcomes: dict[str, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass(frozen=True)
class Target:
    """What to torture: an app (``module:harness`` or a factory), one agent, one input."""

    app: str
    agent: str
    input: Any = None

    def replay(self, seed: int, kind: str) -> str:
        data = orjson.dumps(self.input).decode()
        return (f"tether torture {self.app} {self.agent} --input '{data}' --seed {seed}"
                f" --only {kind}")


def load_harness(app: str, store: str) -> tt.Harness:
    """A fresh harness of *app* on *store*: a factory is called, a Harness gets the store."""
    harness = apps.load_harness(app, store, store_given=True)
    harness.settings = harness.settings.replace(**FAST)
    return harness


async def torture(target: Target, seeds: int = 20, first_seed: int = 0, kills: bool = True,
                  faults: bool = True, plan: FaultPlan | None = None,
                  progress: Callable[[str], None] | None = None) -> TortureReport:
    """Run the baseline, then *seeds* fault runs and kill runs; collect violations."""
    report = TortureReport()
    with tempfile.TemporaryDirectory(prefix="tether-torture-") as folder:
        base = await _baseline(target, Path(folder))
        for seed in range(first_seed, first_seed + seeds):
            if faults:
                await _fault_run(target, seed, Path(folder), plan or FaultPlan(), base, report)
            if kills:
                await _kill_run(target, seed, Path(folder), base, report)
            if progress:
                progress(f"seed {seed}: {len(report.violations)} violation(s) so far")
    return report


@dataclass(frozen=True)
class Baseline:
    status: tt.Status
    result: Any
    side_effects: dict[tuple[str, str], int]
    keys: dict[tuple[str, str], int]
    """Under how many keys each call (tool, arguments) is made in an uninterrupted run."""


async def _baseline(target: Target, folder: Path) -> Baseline:
    """The task with no faults, run by a worker process of its own: an agent that keeps its
    progress in process memory must not carry it over into the runs compared with this."""
    run = folder / "baseline"
    run.mkdir(parents=True, exist_ok=True)
    task_id = await _submit(target, run)
    info = await _finish(target, run, task_id)
    if info.record.status is not tt.Status.COMPLETED:
        raise tt.TetherError(
            f"the task does not complete even without faults or kills: it ended"
            f" {info.record.status.value}"
            + (f" ({info.record.reason})" if info.record.reason else "")
            + "; torture compares every run with an undisturbed one that completes, so there"
            " is nothing to compare with (is --input what the agent takes?)")
    ledger = Ledger(str(run / "ledger.db"))
    try:
        return Baseline(info.record.status, _masked(info.snapshot.result, task_id),
                        dict(ledger.side_effects_by_args()), dict(ledger.keys_by_args()))
    finally:
        ledger.close()


async def _submit(target: Target, run: Path) -> str:
    harness = load_harness(target.app, f"sqlite:///{run / 'tether.db'}")
    try:
        return await harness.submit(target.agent, target.input)
    finally:
        await harness.close()


async def _finish(target: Target, run: Path, task_id: str) -> tt.TaskInfo:
    """Fresh worker processes until the task settles with no worker holding it."""
    store = f"sqlite:///{run / 'tether.db'}"
    for _ in range(30):
        _worker(target.app, run, "")
        harness = load_harness(target.app, store)
        try:
            info = await harness.get(task_id)
        finally:
            await harness.close()
        if info.record.status in SETTLED and info.record.lease_owner is None:
            return info
        await asyncio.sleep(FAST["lease_seconds"])
    return info


@dataclass
class Outcome:
    status: tt.Status
    result: Any
    ledger: Ledger
    stuck: bool
    pending: list[str]


async def _run_in_process(target: Target, folder: Path, plan: FaultPlan, seed: int) -> Outcome:
    folder.mkdir(parents=True, exist_ok=True)
    harness = load_harness(target.app, f"sqlite:///{folder / 'tether.db'}")
    ledger = Ledger(str(folder / "ledger.db"))
    install(harness, plan, random.Random(seed), ledger)
    task_id = await harness.submit(target.agent, target.input)
    stuck = False
    try:
        await harness.run_until_idle(timeout=30)
    except TimeoutError:
        stuck = True
    info = await harness.get(task_id)
    pending = await _unapplied(harness, task_id, info.record.status)
    await harness.close()
    return Outcome(info.record.status, _masked(info.snapshot.result, task_id), ledger, stuck,
                   pending)


async def _unapplied(harness: tt.Harness, task_id: str, status: tt.Status) -> list[str]:
    """Accepted events still pending on a task that can no longer apply them."""
    if status not in (tt.Status.COMPLETED, tt.Status.CANCELLED, tt.Status.FAILED):
        return []
    return [f"{e.event.type} #{e.event.id}" for e in await harness.reads.events(task_id)
            if e.status == EventStatus.PENDING and e.event.type not in ("rollback", "resume")]


async def _fault_run(target: Target, seed: int, folder: Path, plan: FaultPlan, base: Baseline,
                     report: TortureReport) -> None:
    outcome = await _run_in_process(target, folder / f"faults-{seed}", plan, seed)
    report.runs += 1
    _tally(report, outcome.status)
    _check(report, target, seed, "faults", outcome, base, compare_result=False)


async def _kill_run(target: Target, seed: int, folder: Path, base: Baseline,
                    report: TortureReport) -> None:
    rng = random.Random(seed)
    run = folder / f"kills-{seed}"
    run.mkdir(parents=True, exist_ok=True)
    task_id = await _submit(target, run)
    point = rng.choice(KILL_POINTS)
    spec = f"{point}@{rng.randint(1, 3)}"
    killed = _worker(target.app, run, spec) == -9
    if killed:
        report.kills += 1
        report.points.add(point)
        if rng.random() < 0.5 and _worker(target.app, run, "during_recovery@1") == -9:
            report.kills += 1  # the rescuer dies too, while recovering
            report.points.add("during_recovery")
            spec += ", then during_recovery@1"
    info = await _finish(target, run, task_id)
    harness = load_harness(target.app, f"sqlite:///{run / 'tether.db'}")
    try:
        pending = await _unapplied(harness, task_id, info.record.status)
    finally:
        await harness.close()
    ledger = Ledger(str(run / "ledger.db"))
    outcome = Outcome(info.record.status, _masked(info.snapshot.result, task_id), ledger,
                      info.record.status not in SETTLED, pending)
    report.runs += 1
    _tally(report, info.record.status)
    _check(report, target, seed, "kills", outcome, base, compare_result=True,
           context=f" (worker killed at {spec})" if killed else "")



_KEY = re.compile(r"<task>:[0-9a-f]{16}:\d+(?:~[\w.-]+)?")


def _masked(result: Any, task_id: str) -> Any:
    """*result* with tether's own ids put out of the comparison: each run is a task of its
    own, so its id, and the idempotency keys made from it, differ from the baseline's
    whatever the agent did (as framework call ids are left out of a call's arguments)."""
    text = orjson.dumps(result, option=orjson.OPT_SORT_KEYS).decode().replace(task_id, "<task>")
    return orjson.loads(_KEY.sub("<tether key>", text))


def _worker(app: str, folder: Path, failpoints: str) -> int:
    env = {**os.environ, "TETHER_FAILPOINTS": failpoints}
    return subprocess.run(
        [sys.executable, "-m", "tether.testing.child", app, str(folder)], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120).returncode


def _tally(report: TortureReport, status: tt.Status) -> None:
    report.outcomes[status.value] = report.outcomes.get(status.value, 0) + 1


def _check(report: TortureReport, target: Target, seed: int, kind: str, outcome: Outcome,
           base: Baseline, compare_result: bool, context: str = "") -> None:
    def violation(what: str, detail: str) -> None:
        report.violations.append(Violation(seed, what, detail + context,
                                           target.replay(seed, kind)))

    for (tool, key), count in outcome.ledger.side_effects_by_key().items():
        if count > 1:
            violation("side effect repeated", f"{tool} ran {count} times under key {key}")
    for (tool, args), count in outcome.ledger.side_effects_by_args().items():
        expected = base.side_effects.get((tool, args), 0)
        if count > expected and expected > 0:
            violation("side effect repeated",
                      f"{tool}({args}) ran {count} times; an uninterrupted run does it {expected}")
    if outcome.stuck:
        violation("task stuck", f"the task did not settle (status {outcome.status.value})")
    if outcome.pending:
        violation("event lost", f"accepted events never applied: {', '.join(outcome.pending)}")
    if compare_result:
        for (tool, args), keys in outcome.ledger.keys_by_args().items():
            expected = base.keys.get((tool, args), 0)
            if 0 < expected < keys:
                violation("re-planned work it had done",
                          f"{tool}({args:.200}) was planned {keys} times (a new key each time);"
                          f" an uninterrupted run plans it {expected} time(s). Does the agent"
                          " keep its progress outside the task (a global, the agent object)?")
    if compare_result and outcome.status is tt.Status.COMPLETED and \
            base.status is tt.Status.COMPLETED and outcome.result != base.result:
        violation("result changed by a restart",
                  f"got {outcome.result!r:.200}, an uninterrupted run gives {base.result!r:.200}")
    outcome.ledger.close()


def run_child(app: str, folder: str) -> None:
    """The worker process of a kill run: record every tool execution, run until idle."""

    async def main() -> None:
        harness = load_harness(app, f"sqlite:///{Path(folder) / 'tether.db'}")
        ledger = Ledger(str(Path(folder) / "ledger.db"))
        install(harness, FaultPlan.none(), random.Random(0), ledger)
        deadline = time.time() + 60
        try:
            await harness.run_until_idle(timeout=max(1.0, deadline - time.time()))
        finally:
            await harness.close()

    asyncio.run(main())

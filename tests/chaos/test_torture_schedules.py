"""Seeded random kill schedules: the torture suite's random half (issue 3 §1, R1, R6, R10, R14, R19).

Each seed builds a *plan* with ``random.Random(seed)``: several refund tasks (a mix of
keyed, reconciled and blind refunds and lookups, on a fake payment provider's ledger
that no crash can roll back), a stream of events the parent emits at random moments
(with ``source_event_id``\\ s, some of them re-deliveries of earlier ones), and one
schedule entry per worker incarnation -- either a failpoint ``point@n`` armed in the
child (``TETHER_FAILPOINTS``), or an aimed kill: the parent SIGKILLs the child a random
0-300 ms after letting it start work. Workers are real child processes
(``tests/chaos/app.py``, drain mode) started one after another until the tasks settle.
To keep it fast, the next child starts (and waits at a gate) while the current one
works, the lease is short, and the gate opens only when the dead worker's leases have
run out, so an aimed kill lands in real work, not in interpreter start-up or lease
waiting.

After each seed, :func:`check` (THE invariant checker) compares the store and the
ledger with an uninterrupted run of the same tasks:

- keyed / reconciled refunds happened exactly once; a blind refund at most once, and if
  its outcome was in doubt its task sits in needs_human naming the call (and nothing
  after it ran);
- a task handed to a person stays parked until a person acts;
- every accepted event ends applied, coalesced or ignored (pending only on a task parked
  for a person, who will see it), each applied event is in the dialog exactly once, and
  a re-delivery is answered as a duplicate of the first;
- completed tasks' results and tool results equal the uninterrupted run's;
- every kept snapshot version loads, and the dialog is as long as the head says.

Negative controls (bottom): the same runner against a child with ONE guard switched off
(``TETHER_CHAOS_BREAK``) must make the checker report the specific violation.

Knobs: ``TETHER_TORTURE_SEEDS=N`` or ``--torture-seeds N`` runs seeds 1..N (default
9); ``TETHER_TORTURE_KILLS`` armed incarnations per seed (default 30);
``TETHER_TORTURE_SEED=S .venv/bin/pytest tests/chaos/test_torture_schedules.py -k replay``
replays one seed (a failing seed prints exactly that line). The session ends with a
``tether torture:`` summary line (kills, points covered, seeds; see conftest.py).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _child import ChildProcess

import tether as tt
from tether.failpoints import POINTS

HERE = Path(__file__).resolve().parent
APP_PATH = HERE / "app.py"
_spec = importlib.util.spec_from_file_location("tether_chaos_app_torture", APP_PATH)
assert _spec is not None and _spec.loader is not None
app = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(app)

KILLED = -signal.SIGKILL
CHILD_TIMEOUT = 20.0
LEASE = 0.15

CI_SEEDS = 9
KILLS_PER_SEED = int(os.environ.get("TETHER_TORTURE_KILLS", "30"))
CI_KILL_FLOOR = 200
SEED_KILL_FLOOR = 8  # a seed whose tasks park early (blind refunds in doubt) has less to kill
REPLAY_COMMAND = ("TETHER_TORTURE_SEED={seed} .venv/bin/pytest"
                  " tests/chaos/test_torture_schedules.py -k replay")

WORKER_ENV = {
    "TETHER_CHAOS_LEASE": str(LEASE),
    "TETHER_CHAOS_POLL": "0.02",
    # a task killed again and again before it moves on must still be recovered here, not
    # parked by the crash-loop budget (which test_crash_loops covers). Aimed kills every few
    # hundred ms can hit one task's first step a dozen times in a row (seen: 12, with its quick
    # lookup's result deferred to the next commit), so the budget is set out of reach.
    "TETHER_CHAOS_MAX_RECOVERIES": "1000",
    "TETHER_CHAOS_DEFER": "1",          # the production default: quick lookups defer their result
    # tools take a moment, before and after the provider pays, so aimed kills land in them
    "TETHER_CHAOS_TOOL_DELAY": "0.06",
    "TETHER_CHAOS_TOOL_DELAY_AFTER": "0.06",
}

# Failpoints a refund worker passes, and the range of n drawn for each (passes per process).
WORKER_POINTS: dict[str, tuple[int, int]] = {
    "before_plan_recorded": (1, 5),
    "after_resume_point": (1, 5),
    "inside_tool": (1, 5),
    "after_tool_before_commit": (1, 5),
    "mid_checkpoint": (1, 9),
    "after_checkpoint": (1, 9),
    "during_recovery": (1, 2),
}
EVENT_TYPES = ("user_message", "follow_up", "retry", "progress", "heartbeat")
SUPERSEDING = ("user_message", "follow_up")
"""The event types that set aside a call recorded but not started (a newer message)."""
TOOLS = ("refund_keyed", "refund_reconciled", "lookup")

assert set(WORKER_POINTS) | {"event_stored"} <= set(POINTS)


# ---------------------------------------------------------------------- plans


@dataclass(frozen=True)
class Incarnation:
    """One worker process: how it is meant to die, and what the parent emits meanwhile."""

    kind: str                        # "failpoint" | "timed" | "clean" | "stall"
    spec: str | None = None          # failpoint: "point@n"
    delay: float = 0.0               # timed (failpoint: backstop): SIGKILL this long after
                                     # the gate opens; 0 for a failpoint: no backstop
    emits: tuple[tuple[float, int], ...] = ()  # (seconds after the gate opens, event index)

    def describe(self) -> str:
        backstop = f" (else kill at +{self.delay * 1000:.0f}ms)" if self.delay else ""
        what = {"failpoint": f"failpoint {self.spec}{backstop}",
                "timed": f"kill at +{self.delay * 1000:.0f}ms",
                "clean": "no kill", "stall": "SIGSTOP inside the slow tool"}[self.kind]
        return what + (f", emits {[i for _, i in self.emits]}" if self.emits else "")


@dataclass(frozen=True)
class Plan:
    seed: int
    tasks: dict[str, list[list[Any]]]
    events: list[dict[str, Any]]     # Event kwargs; a re-delivery repeats an earlier one
    incarnations: list[Incarnation]
    emit_kill: int | None = None     # this event is first sent by an emitter killed mid-store
    env: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        lines = [f"seed {self.seed}: tasks"]
        lines += [f"  {tid}: {calls}" for tid, calls in self.tasks.items()]
        lines += [f"  worker {i + 1}: {inc.describe()}" for i, inc in enumerate(self.incarnations)]
        return "\n".join(lines)


def make_plan(seed: int, kills: int = KILLS_PER_SEED, n_tasks: int = 14) -> Plan:
    """Everything random about a run, drawn from ``random.Random(seed)`` alone."""
    rng = random.Random(seed)
    tasks: dict[str, list[list[Any]]] = {}
    for t in range(n_tasks):
        task_id = f"s{seed}-t{t}"
        n = rng.randint(3, 7)
        blind_at = rng.randrange(n) if rng.random() < 0.25 else None
        calls = []
        for i in range(n):
            tool = "refund_blind" if i == blind_at else rng.choice(TOOLS)
            calls.append([tool, f"{task_id}-{i}", 0 if tool == "lookup" else rng.randint(1, 500)])
        tasks[task_id] = calls

    events: list[dict[str, Any]] = []

    def new_event() -> int:
        if events and rng.random() < 0.25:  # a re-delivery: same event, same source_event_id
            events.append(dict(rng.choice(events)))
        else:
            events.append({"type": rng.choice(EVENT_TYPES), "task_id": rng.choice(list(tasks)),
                           "payload": {"n": len(events)},
                           "source_event_id": f"s{seed}-e{len(events)}"})
        return len(events) - 1

    incarnations = []
    for _ in range(kills):
        emits = tuple(sorted((round(rng.uniform(0.0, 0.3), 3), new_event())
                             for _ in range(rng.choice((0, 1, 1, 2)))))
        if rng.random() < 0.5:
            point = rng.choice(sorted(WORKER_POINTS))
            low, high = WORKER_POINTS[point]
            # a backstop: if the point is not passed n times soon (n too high for what is
            # left), the parent kills the worker anyway instead of letting it finish everything
            incarnations.append(Incarnation("failpoint", f"{point}@{rng.randint(low, high)}",
                                            delay=round(rng.uniform(0.3, 0.6), 3), emits=emits))
        else:
            incarnations.append(Incarnation("timed", delay=round(rng.uniform(0.0, 0.3), 3),
                                            emits=emits))
    # the first event is a user message first sent by an emitter killed inside the store
    events.insert(0, {"type": "user_message", "task_id": rng.choice(list(tasks)),
                      "payload": {"text": "are you done?"}, "source_event_id": f"s{seed}-first"})
    incarnations = [Incarnation(i.kind, i.spec, i.delay, tuple((at, n + 1) for at, n in i.emits))
                    for i in incarnations]
    return Plan(seed, tasks, events, incarnations, emit_kill=0)


# ---------------------------------------------------------------------- child processes


class Child(ChildProcess):
    """One app.py process of a schedule."""

    def __init__(self, workdir: Path, mode: str, env: dict[str, str], label: str) -> None:
        super().__init__([sys.executable, str(APP_PATH), mode], env, workdir, label,
                         CHILD_TIMEOUT)
        self.gate = workdir / f"{label}.gate"


def child_env(db: Path, ledger: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k != "TETHER_FAILPOINTS" and not k.startswith("TETHER_CHAOS")}
    env.update(TETHER_CHAOS_DB=str(db), TETHER_CHAOS_LEDGER=str(ledger), PYTHONUNBUFFERED="1",
               TETHER_CHAOS_DEADLINE=str(CHILD_TIMEOUT), **WORKER_ENV)
    env.update(extra)
    return env


# ---------------------------------------------------------------------- the runner


@dataclass(frozen=True)
class Violation:
    kind: str
    task: str
    detail: str
    order: str | None = None

    def __str__(self) -> str:
        return f"[{self.kind}] {self.task}: {self.detail}"


@dataclass
class Receipt:
    index: int
    source_event_id: str
    task_id: str
    accepted: bool
    outcome: str
    event_id: int | None


@dataclass
class Outcome:
    plan: Plan
    kills: Counter[str] = field(default_factory=Counter)
    incarnations: int = 0
    receipts: list[Receipt] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)  # how stored events ended, + refusals
    seconds: float = 0.0

    @property
    def total_kills(self) -> int:
        return sum(self.kills.values())

    def report(self) -> str:
        lines = [f"seed {self.plan.seed}: {len(self.violations)} violation(s) after"
                 f" {self.total_kills} kills in {self.incarnations} workers:"]
        lines += [f"  {v}" for v in self.violations]
        lines.append(self.plan.describe())
        if self.plan.seed >= 0:
            lines.append("replay: " + REPLAY_COMMAND.format(seed=self.plan.seed))
        return "\n".join(lines)


def baseline_results(plan: Plan, workdir: Path) -> dict[str, Any]:
    """The tasks' results in one uninterrupted in-process run (own store, own ledger)."""
    db, ledger = workdir / "baseline.db", workdir / "baseline-ledger.db"

    async def go() -> dict[str, Any]:
        harness = app.build_harness(db, ledger)
        try:
            for task_id, calls in plan.tasks.items():
                await harness.submit("refunder", {"calls": calls}, task_id=task_id)
            await harness.run_until_idle(timeout=30)
            infos = {task_id: await harness.get(task_id) for task_id in plan.tasks}
        finally:
            await harness.close()
        assert all(i.record.status is tt.Status.COMPLETED for i in infos.values())
        return {task_id: info.snapshot.result for task_id, info in infos.items()}

    results = asyncio.run(go())
    for task_id, calls in plan.tasks.items():  # the checker's yardstick must itself be right
        assert results[task_id] == app.expected_summary(calls), task_id
    return results


class Run:
    """Drives one plan: workers one after another (the next one warming up meanwhile)."""

    def __init__(self, plan: Plan, workdir: Path) -> None:
        self.plan = plan
        self.dir = workdir
        self.db = workdir / "tether.db"
        self.ledger = workdir / "provider.db"
        self.loop = asyncio.Runner()
        self.harness = app.build_harness(self.db, self.ledger)
        self.out = Outcome(plan)
        self.zombies: list[Child] = []
        self._spawned = 0
        self.backstop = False
        self._started: list[Child] = []

    def run(self, coro: Any) -> Any:
        return self.loop.run(coro)

    def spawn(self, inc: Incarnation, mode: str = "drain", extra: dict[str, str] | None = None,
              gated: bool = True) -> Child:
        self._spawned += 1
        label = f"w{self._spawned}"
        env = dict(self.plan.env)
        if inc.kind == "failpoint":
            assert inc.spec is not None
            env["TETHER_FAILPOINTS"] = inc.spec
        if inc.kind == "stall":
            env.update(TETHER_CHAOS_SLOW_TOOL="refund_blind", TETHER_CHAOS_SLOW="1.0",
                       TETHER_CHAOS_CONCURRENCY="1")
        env.update(extra or {})
        if gated:
            env["TETHER_CHAOS_GATE"] = str(self.dir / f"{label}.gate")
        child = Child(self.dir, mode, child_env(self.db, self.ledger, env), label)
        self._started.append(child)
        return child

    # -------------------------------------------------------------- events

    def emit(self, index: int) -> None:
        spec = self.plan.events[index]
        try:
            receipt = self.run(self.harness.emit(tt.Event(**spec)))
        except tt.TetherError as error:  # e.g. the task finished meanwhile: refused, not lost
            self.out.receipts.append(Receipt(index, spec["source_event_id"], spec["task_id"],
                                             False, type(error).__name__, None))
            return
        self.out.receipts.append(Receipt(index, spec["source_event_id"], spec["task_id"],
                                         receipt.accepted, receipt.outcome, receipt.event_id))

    def start_emitter(self, index: int) -> Child:
        """An emitter armed to die inside the store's transaction (``event_stored``); it
        waits at its gate and is let go while the first worker is busy."""
        return self.spawn(Incarnation("failpoint", "event_stored@1"), mode="emit",
                          extra={"TETHER_CHAOS_EVENT": json.dumps(self.plan.events[index])})

    def finish_emitter(self, child: Child, index: int) -> None:
        """It must have died there, leaving nothing half-stored; then the sender retries."""
        spec = self.plan.events[index]
        code = child.wait()
        if code != KILLED:
            self.out.violations.append(Violation(
                "emitter_survived", spec["task_id"], f"emitter exited {code}, not by SIGKILL"
                f" at event_stored; stdout {child.seen}; {child.stderr()}"))
            return
        self.out.kills["event_stored"] += 1
        stored = [e for e in self.run(self.harness.store.list_events(spec["task_id"]))
                  if e.event.source_event_id == spec["source_event_id"]]
        if stored:
            self.out.violations.append(Violation(
                "half_stored_event", spec["task_id"], f"an emit killed before its commit left"
                f" event {stored[0].event.id} ({spec['source_event_id']}) stored"))
        self.emit(index)  # the retry must be taken as new, not answered as a "duplicate"

    # -------------------------------------------------------------- leases

    def wait_claimable(self) -> None:
        """Until no unsettled task is still leased by a dead (or stopped) worker."""
        end = time.monotonic() + 10
        while True:
            now = time.time()
            leased = [r.lease_until for r in self.run(self.harness.store.list_tasks())
                      if r.status.value not in app.SETTLED and r.lease_owner is not None
                      and r.lease_until is not None and r.lease_until > now]
            if not leased:
                return
            assert time.monotonic() < end, "leases never ran out"
            time.sleep(min(0.05, max(leased) - now + 0.005))

    def all_settled(self) -> bool:
        counts = self.run(self.harness.store.count_by_status())
        return all(status in app.SETTLED for status in counts)

    # -------------------------------------------------------------- the schedule

    def go(self) -> Outcome:
        started = time.monotonic()
        try:
            self._go()
            self.out.violations += self.run(check(self.plan, self.harness, self.ledger,
                                                  baseline_results(self.plan, self.dir),
                                                  self.out))
        finally:
            for child in self._started:  # only the processes this run started, each by pid
                if child.proc.poll() is None:
                    child.kill()
            self.run(self.harness.close())
            self.loop.close()
            self.out.seconds = time.monotonic() - started
        return self.out

    def _go(self) -> None:
        plan = self.plan

        async def submit_all() -> None:
            for task_id, calls in plan.tasks.items():
                await self.harness.submit("refunder", {"calls": calls}, task_id=task_id)

        self.run(submit_all())
        clean = Incarnation("clean")
        schedule = list(plan.incarnations)
        spare = self.spawn(schedule[0] if schedule else clean)
        emitter = self.start_emitter(plan.emit_kill) if plan.emit_kill is not None else None
        k = 0
        while True:
            inc = schedule[k] if k < len(schedule) else clean
            current = spare
            current.expect("READY")
            if emitter is not None:
                emitter.expect("READY")
            self.wait_claimable()
            spare = self.spawn(schedule[k + 1] if k + 1 < len(schedule) else clean)
            self.out.incarnations += 1
            self.backstop = False
            code = self._live(current, inc, emitter)
            if emitter is not None:
                assert plan.emit_kill is not None
                self.finish_emitter(emitter, plan.emit_kill)
                emitter = None
            if code == "stalled":
                self.zombies.append(current)
            elif code == KILLED:
                fired = inc.spec is not None and not self.backstop
                self.out.kills[inc.spec.partition("@")[0] if fired else "timed"] += 1
            elif code != 0:
                self.out.violations.append(Violation(
                    "worker_failed", "-", f"{current.label} ({inc.describe()}) exited {code}:"
                    f" {current.stderr()}"))
                return
            if code != "stalled" and self.zombies:
                self._wake_zombies()
                if code == 0 and not self.all_settled():
                    code = "zombie changed things"
            if code == 0:
                return
            k += 1
            if k > len(schedule) + 5:
                self.out.violations.append(Violation(
                    "never_settled", "-", f"tasks still unsettled after {k} workers"))
                return

    def _live(self, child: Child, inc: Incarnation, emitter: Child | None = None) -> int | str:
        """Let *child* work; kill it on schedule, emit the incarnation's events meanwhile
        (and let *emitter* go too, to die storing its event while the worker runs)."""
        emits = list(inc.emits)
        child.gate.touch()
        opened = time.monotonic()
        if emitter is not None:
            emitter.gate.touch()
        if inc.kind == "stall":
            child.expect("IN_TOOL")
            child.stop_outside_write_lock(self.db)
            for _, index in emits:
                self.emit(index)
            return "stalled"
        while child.proc.poll() is None:
            elapsed = time.monotonic() - opened
            while emits and emits[0][0] <= elapsed:
                self.emit(emits.pop(0)[1])
            if (inc.kind == "timed" or (inc.kind == "failpoint" and inc.delay)) \
                    and elapsed >= inc.delay:
                child.signal(signal.SIGKILL)
                self.backstop = inc.kind == "failpoint"
                break
            if elapsed > CHILD_TIMEOUT:
                break
            time.sleep(0.004)
        code = child.wait()
        for _, index in emits:  # the rest arrive while no worker runs
            self.emit(index)
        return code

    def _wake_zombies(self) -> None:
        """Workers stopped past their lease come back to life (and find they lost it)."""
        for zombie in self.zombies:
            zombie.signal(signal.SIGCONT)
        for zombie in self.zombies:
            zombie.wait()
        self.zombies = []


# ---------------------------------------------------------------------- THE checker


async def check(plan: Plan, h: tt.Harness, ledger: Path, baseline: dict[str, Any],
                out: Outcome) -> list[Violation]:
    """Every invariant the schedule must not break, as a list of violations (empty: all hold)."""
    problems: list[Violation] = []
    paid = app.refund_counts(ledger)
    looked_up = app.lookup_counts(ledger)
    expected_orders: set[str] = set()
    keep = h.settings.keep_versions

    def bad(kind: str, task: str, detail: str, order: str | None = None) -> None:
        problems.append(Violation(kind, task, detail, order))

    def paid_once(task: str, calls: list[list[Any]]) -> None:
        for tool, order, _ in calls:
            if tool == "lookup":
                if looked_up[order] < 1:
                    bad("lookup_lost", task, f"lookup {order} never ran", order)
            elif paid[order] == 0:
                bad("refund_lost", task, f"{tool} {order} was never paid", order)
            elif paid[order] > 1:
                bad("refund_repeated", task, f"{tool} {order} paid {paid[order]} times", order)

    def set_aside_by(task_id: str, history: list[dict[str, Any]], events: list[Any]) -> None:
        """A call answered "not run" was set aside by a newer message the task applied (R4):
        its key names that event, and nothing else may keep a call from running."""
        newer = {e.event.id for e in events
                 if e.status == "applied" and e.event.type in SUPERSEDING}
        for row in history:
            if row.get("role") == "tool" and row.get("not_run"):
                kind, _, rest = str(row.get("key")).partition(":")
                because = rest.partition(":")[0]
                if kind != "not-run" or not because.isdigit() or int(because) not in newer:
                    bad("set_aside_unexplained", task_id, f"call {row.get('name')} answered"
                        f" not run by {row.get('key')}, which names no applied newer message")

    for task_id, calls in plan.tasks.items():
        expected_orders.update(order for tool, order, _ in calls if tool != "lookup")
        info = await h.get(task_id)
        status, snap = info.record.status.value, info.snapshot
        out.statuses[status] += 1

        # snapshots: every kept version loads; the head is one of them
        versions = [v for v, _, _ in await h.store.list_versions(task_id)]
        if info.record.head_version not in versions or len(versions) > keep:
            bad("versions", task_id, f"head {info.record.head_version}, kept {versions}")
        for version in versions:
            try:
                _, data = await h.store.load_head(task_id, version)
                tt.Snapshot.loads(data, task_id, version)
            except tt.TetherError as error:
                bad("snapshot_unloadable", task_id, f"version {version}: {error}")

        # the dialog: as long as the head says, tool results in order, each event once
        history = await h.history(task_id)
        if len(history) != snap.history_len:
            bad("history_len", task_id, f"history has {len(history)} rows, head says"
                f" {snap.history_len}")
        results = app.answered(history)
        expected_results = [app.lookup_result(o) if t == "lookup" else app.refund_result(o, a)
                            for t, o, a in calls]
        if results != expected_results[:len(results)]:
            bad("history_results", task_id, f"tool results {results} are not a prefix of the"
                f" uninterrupted run's {expected_results}")
        rows_per_event = Counter(row.get("event_id") for row in history if "event_id" in row)
        events = await h.store.list_events(task_id)
        out.events.update(e.status for e in events)
        for stored in events:
            rows = rows_per_event[stored.event.id]
            dialog_event = stored.priority <= 2 and stored.event.type not in ("rollback",)
            want = 1 if stored.status == "applied" and dialog_event else 0
            if rows != want:
                bad("event_in_dialog", task_id, f"event {stored.event.id} ({stored.event.type},"
                    f" {stored.status}) is in the dialog {rows} times, expected {want}")
            if stored.status == "pending" and status != "needs_human":
                bad("event_pending", task_id, f"event {stored.event.id} ({stored.event.type}) is"
                    f" still pending on a {status} task: never applied")
            elif stored.status not in ("pending", "applied", "coalesced", "ignored"):
                bad("event_status", task_id, f"event {stored.event.id} ended {stored.status}")
        set_aside_by(task_id, history, events)
        sources = Counter(e.event.source_event_id for e in events)
        for source, count in sources.items():
            if source is not None and count > 1:
                bad("event_stored_twice", task_id, f"source_event_id {source} stored {count} times")

        # a task handed to a person stays parked until a person acts (R26)
        log = await h.store.list_recovery_log(task_id)
        strategies = [r["resume_strategy"] for r in log]
        if "needs_human" in strategies:
            last = len(strategies) - 1 - strategies[::-1].index("needs_human")
            if status != "needs_human" and "human_resume" not in strategies[last:]:
                reason = log[last]["detail"]
                bad("parked_task_ran_on", task_id, f"handed to a person ({reason}) but went on to"
                    f" {status} without one")

        # the outcome
        if status == "completed":
            if snap.result != baseline[task_id]:
                bad("result_mismatch", task_id, f"result {snap.result} != uninterrupted"
                    f" {baseline[task_id]}")
            if results != expected_results:
                bad("history_results", task_id, f"completed with tool results {results}")
            paid_once(task_id, calls)
        elif status == "needs_human":
            at = len(results)
            call = snap.call
            reason = info.record.reason or ""
            if at >= len(calls) or call is None or calls[at][0] != "refund_blind" \
                    or call.tool != "refund_blind" or call.args.get("order") != calls[at][1]:
                bad("parked_wrongly", task_id, f"needs_human at call {at} ({call}): {reason}")
                continue
            tool, order, _ = calls[at]
            if "outcome unknown" not in reason or tool not in reason or order not in reason:
                bad("parked_unnamed", task_id, f"reason does not name the call {tool}({order}):"
                    f" {reason!r}", order)
            record = await h.store.get_idempotency(call.key)
            if record is None or record.status != "started":
                bad("parked_record", task_id, f"idempotency record of {call.key}: {record}")
            paid_once(task_id, calls[:at])
            if paid[order] > 1:
                bad("refund_repeated", task_id, f"blind {order} paid {paid[order]} times", order)
            for later_tool, later, _ in calls[at + 1:]:
                if paid[later] or looked_up[later]:
                    bad("ran_after_park", task_id, f"{later_tool} {later} ran after the task"
                        " parked on an in-doubt call", later)
        else:
            bad("not_settled", task_id, f"ended {status} ({info.record.reason})")

    for order, count in paid.items():
        if order not in expected_orders:
            bad("refund_unexpected", "-", f"{order} paid {count} times; no task asked", order)

    # events: accepted ones are stored; a re-delivery is the first one's duplicate
    first: dict[str, Receipt] = {}
    out.events.update(r.outcome for r in out.receipts if not r.accepted)
    for receipt in out.receipts:
        original = first.get(receipt.source_event_id)
        if receipt.accepted:
            if original is not None and original.accepted:
                bad("event_accepted_twice", receipt.task_id, f"{receipt.source_event_id} was"
                    f" accepted as {original.event_id} and again as {receipt.event_id}")
            first.setdefault(receipt.source_event_id, receipt)
            if original is not None and not original.accepted:
                first[receipt.source_event_id] = receipt
            stored = [e for e in await h.store.list_events(receipt.task_id)
                      if e.event.id == receipt.event_id]
            if not stored:
                bad("event_lost", receipt.task_id, f"accepted event {receipt.event_id}"
                    f" ({receipt.source_event_id}) is not stored")
        elif receipt.outcome == "duplicate":
            if original is None or not original.accepted or original.event_id != receipt.event_id:
                bad("dedup_wrong", receipt.task_id, f"{receipt.source_event_id} answered as a"
                    f" duplicate of {receipt.event_id}, first taken as {original}")
        elif receipt.outcome != "TaskClosed":
            bad("event_refused", receipt.task_id, f"{receipt.source_event_id} refused:"
                f" {receipt.outcome}")
        else:
            first.setdefault(receipt.source_event_id, receipt)
    return problems


def run_plan(plan: Plan, workdir: Path) -> Outcome:
    workdir.mkdir(parents=True, exist_ok=True)
    return Run(plan, workdir).go()


# ---------------------------------------------------------------------- seeds


def configured_seeds(config: pytest.Config) -> list[int]:
    n = config.getoption("--torture-seeds", default=None) or \
        int(os.environ.get("TETHER_TORTURE_SEEDS", str(CI_SEEDS)))
    return list(range(1, int(n) + 1))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "torture_seed" in metafunc.fixturenames:
        metafunc.parametrize("torture_seed", configured_seeds(metafunc.config))


def record(stats: dict[str, Any], out: Outcome) -> None:
    stats["seeds"].append(out.plan.seed)
    stats["kills"].update(out.kills)
    stats["incarnations"] += out.incarnations
    stats["seconds"] += out.seconds
    stats["violations"] += len(out.violations)
    stats["statuses"].update(out.statuses)
    stats["events"].update(out.events)


def assert_clean(out: Outcome) -> None:
    assert out.violations == [], out.report()


@pytest.mark.timeout(120)
def test_torture_seed(torture_seed: int, tmp_path: Path, torture_stats: dict[str, Any]) -> None:
    out = run_plan(make_plan(torture_seed), tmp_path)
    record(torture_stats, out)
    assert_clean(out)
    # the schedule really killed workers (a torture run that kills nobody proves nothing)
    assert out.total_kills >= SEED_KILL_FLOOR, out.report()
    assert out.kills["event_stored"] == 1, out.report()


def test_replay_plans_are_a_function_of_the_seed() -> None:
    """Replaying a seed replays its plan: the same tasks, events and kill schedule."""
    assert make_plan(1234) == make_plan(1234)
    assert make_plan(1234) != make_plan(1235)
    plan = make_plan(7)
    kinds = Counter(i.kind for i in plan.incarnations)
    assert kinds["failpoint"] and kinds["timed"]
    assert all(i.spec.partition("@")[0] in POINTS for i in plan.incarnations if i.spec)
    assert any(e == plan.events[j] for i, e in enumerate(plan.events) for j in range(i))


REPLAY_SEED = os.environ.get("TETHER_TORTURE_SEED")
if REPLAY_SEED is not None:

    @pytest.mark.timeout(300)
    def test_replay(tmp_path: Path, torture_stats: dict[str, Any]) -> None:
        """``TETHER_TORTURE_SEED=S pytest tests/chaos/test_torture_schedules.py -k replay``."""
        out = run_plan(make_plan(int(REPLAY_SEED)), tmp_path)
        record(torture_stats, out)
        print(out.plan.describe())
        print(f"kills {dict(out.kills)}; statuses {dict(out.statuses)}")
        assert_clean(out)


@pytest.mark.timeout(300)
def test_torture_totals(torture_stats: dict[str, Any], pytestconfig: pytest.Config,
                        tmp_path: Path) -> None:
    """After the seeds: the CI run kills at least 200 workers and covers every point. Run
    alone (no seed ran before it in this session) it runs one seed of its own first, so it
    never depends on the order tests run in."""
    if not torture_stats["seeds"]:
        out = run_plan(make_plan(1), tmp_path)
        record(torture_stats, out)
        assert_clean(out)
    seeds = torture_stats["seeds"]
    kills = sum(torture_stats["kills"].values())
    assert kills >= SEED_KILL_FLOOR * len(seeds), torture_stats
    if len(seeds) >= CI_SEEDS:
        assert kills >= CI_KILL_FLOOR, torture_stats
        covered = set(torture_stats["kills"])
        assert covered >= {*WORKER_POINTS, "event_stored", "timed"}, covered


# ---------------------------------------------------------------------- the checker can fail


def test_checker_reports_each_kind_of_damage(tmp_path: Path) -> None:
    """The checker itself must be able to fail: run a small plan with no kill, prove it clean,
    then damage the store and the ledger one way each and expect each to be named."""
    tasks = {"c1": [["refund_keyed", "c1-0", 5], ["lookup", "c1-1", 0]],
             "c2": [["refund_reconciled", "c2-0", 7], ["refund_keyed", "c2-1", 9]]}
    events = [{"type": "user_message", "task_id": "c1", "payload": {"n": 0},
               "source_event_id": "c-e0"},
              {"type": "follow_up", "task_id": "c2", "payload": {"n": 1},
               "source_event_id": "c-e1"}]
    plan = Plan(-1, tasks, events, [Incarnation("clean", emits=((0.0, 0), (0.0, 1)))])
    out = run_plan(plan, tmp_path)
    assert out.violations == [], out.report()
    assert out.statuses == {"completed": 2}
    db, ledger = tmp_path / "tether.db", tmp_path / "provider.db"

    def sql(path: Path, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return app.ledger_query(path, query, params)

    # c1: a refund paid twice, a lost event, a dialog row gone
    sql(ledger, "INSERT INTO refunds (order_id, amount, tool, pid, at) VALUES ('c1-0', 5,"
        " 'refund_keyed', 0, 0)")
    sql(db, "UPDATE events SET status = 'pending' WHERE source_event_id = 'c-e0'")
    sql(db, "DELETE FROM history WHERE task_id = 'c1' AND seq = (SELECT max(seq) FROM history"
        " WHERE task_id = 'c1')")
    # c2: a different result in the head, an older version garbled, a refund never paid
    [(head_version, head)] = sql(db, "SELECT s.version, s.head FROM snapshots s JOIN tasks t ON"
                                 " t.task_id = s.task_id AND t.head_version = s.version WHERE"
                                 " s.task_id = 'c2'")
    data = json.loads(bytes(head))
    data["result"]["total_refunded"] += 1
    sql(db, "UPDATE snapshots SET head = ? WHERE task_id = 'c2' AND version = ?",
        (json.dumps(data).encode(), head_version))
    sql(db, "UPDATE snapshots SET head = x'00ff' WHERE task_id = 'c2' AND version = ?",
        (head_version - 1,))
    sql(ledger, "DELETE FROM refunds WHERE order_id = 'c2-1'")
    # a sender whose re-delivery was taken as a new event
    out.receipts.append(Receipt(1, "c-e1", "c2", True, "stored", 999))

    async def recheck() -> list[Violation]:
        harness = app.build_harness(db, ledger)
        try:
            return await check(plan, harness, ledger, {t: app.expected_summary(c)
                                                       for t, c in tasks.items()}, out)
        finally:
            await harness.close()

    found = {(v.kind, v.task) for v in asyncio.run(recheck())}
    assert found >= {("refund_repeated", "c1"), ("event_pending", "c1"), ("history_len", "c1"),
                     ("result_mismatch", "c2"), ("snapshot_unloadable", "c2"),
                     ("refund_lost", "c2"), ("event_accepted_twice", "c2"),
                     ("event_lost", "c2")}, found


def test_a_call_set_aside_by_a_newer_message_runs_when_asked_for_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user message that reaches the inbox while the agent plans (here: sent from the plan
    itself, through a second harness on the same file) sets the planned call aside before it
    starts (R3, R4): the dialog answers it "not run", naming the message, and the next plan
    asks for it again. The checker takes that as explained; CI's seed 9 met this race by
    timing, as a lookup that never ran, when the test agent counted its calls in its scratch."""
    tasks = {"m1": [["lookup", "m1-0", 0], ["refund_keyed", "m1-1", 5]]}
    plan = Plan(-2, tasks, [], [])
    db, ledger = tmp_path / "tether.db", tmp_path / "provider.db"
    planned = app.Refunder.plan
    sent: list[int] = []

    async def plan_while_a_message_arrives(self: Any, task: tt.TaskView) -> tt.Action:
        action = await planned(self, task)
        if not sent:
            sender = app.build_harness(db, ledger)
            try:
                receipt = await sender.emit(tt.Event("user_message", task.task_id, {"n": 0}))
            finally:
                await sender.close()
            assert receipt.event_id is not None
            sent.append(receipt.event_id)
        return action

    monkeypatch.setattr(app.Refunder, "plan", plan_while_a_message_arrives)

    async def go() -> tuple[list[Violation], list[dict[str, Any]]]:
        harness = app.build_harness(db, ledger)
        try:
            await harness.submit("refunder", {"calls": tasks["m1"]}, task_id="m1")
            await harness.run_until_idle(timeout=30)
            found = await check(plan, harness, ledger, {"m1": app.expected_summary(tasks["m1"])},
                                Outcome(plan))
            return found, await harness.history("m1")
        finally:
            await harness.close()

    found, history = asyncio.run(go())
    assert found == []
    [not_run] = [r for r in history if r.get("role") == "tool" and r.get("not_run")]
    assert not_run["name"] == "lookup" and not_run["key"].startswith(f"not-run:{sent[0]}:")
    assert app.lookup_counts(ledger)["m1-0"] == 1


# ---------------------------------------------------------------------- negative controls

# One task: a lookup, a reconciled refund (every call pays; only reconcile can tell) and a
# blind refund. Both workers are armed to die at the 2nd tool call they make (after paying).
CONTROL_CALLS = [["lookup", "n-0", 0], ["refund_reconciled", "n-1", 20],
                 ["refund_blind", "n-2", 30]]
# The same plus a keyed refund after the blind one, for the stalled-worker control.
FENCE_CALLS = [*CONTROL_CALLS, ["refund_keyed", "n-3", 40]]


def control_plan(broken: str | None, incarnations: list[Incarnation],
                 calls: list[list[Any]] = CONTROL_CALLS) -> Plan:
    env = {"TETHER_CHAOS_BREAK": broken} if broken else {}
    return Plan(-1, {"n": calls}, [], incarnations, env=env)  # a fixed plan, not a seed


KILL_IN_REFUNDS = [Incarnation("failpoint", "inside_tool@2"),
                   Incarnation("failpoint", "inside_tool@2")]


# guard switched off -> the orders the checker must report as paid more than once
REPEATS = {
    # worker 2 re-runs the in-doubt reconciled refund blindly (and dies in the blind one,
    # which worker 3 then re-runs blindly too)
    "idempotency": {"n-1", "n-2"},
    # no resume point: a refund's start is never committed before it pays, so the worker
    # after each kill plans the refund afresh and pays it again (n-1, then n-2)
    "resume_point": {"n-1", "n-2"},
}


@pytest.mark.parametrize("broken", sorted(REPEATS))
def test_negative_control_without_a_guard_the_checker_sees_refunds_repeated(
        tmp_path: Path, broken: str) -> None:
    """With the guard on, the schedule keeps every invariant: worker 2 reconciles the refund
    worker 1 paid and finishes. With it off -- no idempotency check (an in-doubt call re-runs
    blindly) or no resume point before a tool call -- the same kills make the provider pay
    twice, and the checker must say exactly that."""
    guarded = run_plan(control_plan(None, KILL_IN_REFUNDS), tmp_path / "guarded")
    assert guarded.violations == [], guarded.report()
    assert guarded.kills == {"inside_tool": 1}, guarded.report()
    assert guarded.statuses == {"completed": 1}, guarded.report()

    out = run_plan(control_plan(broken, KILL_IN_REFUNDS), tmp_path / "broken")
    assert out.kills == {"inside_tool": 2}, out.report()
    found = {(v.kind, v.order) for v in out.violations}
    assert found == {("refund_repeated", order) for order in REPEATS[broken]}, out.report()


def test_negative_control_without_the_lease_fence_a_stale_worker_overrides_a_person(
        tmp_path: Path) -> None:
    """Worker 1 is stopped (SIGSTOP) inside the blind refund, past its lease. Worker 2 takes
    the task over and, the refund being in doubt, parks it for a person. Then worker 1 wakes
    up and tries to record the refund's result. Fenced, that write is refused and the task
    stays parked. Unfenced, the stale write lands: the task leaves needs_human with no person
    involved and the next worker pays the keyed refund after it -- the checker must report
    the parked task running on."""
    stall = [Incarnation("stall")]
    guarded = run_plan(control_plan(None, stall, FENCE_CALLS), tmp_path / "guarded")
    assert guarded.violations == [], guarded.report()
    assert guarded.statuses == {"needs_human": 1}, guarded.report()

    out = run_plan(control_plan("fence", stall, FENCE_CALLS), tmp_path / "broken")
    kinds = {v.kind for v in out.violations}
    assert kinds == {"parked_task_ran_on"}, out.report()
    assert out.statuses == {"completed": 1}, out.report()

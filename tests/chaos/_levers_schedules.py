"""Seeded schedules of levers under fire, run against a :class:`~_levers_site.Site`, and the
invariant checks after each round (imported as ``_levers_schedules``).

A *schedule* is drawn from ``random.Random(seed)`` alone: two tasks (steps of the app's
``levers`` agent), one *scenario* that sets up an exact interleaving with the app's gates,
and a run of random operations on the schedule's tasks (and the forks it makes):

- levers: ``submit``, ``resume``, ``decide`` (happened / not_happened / skip, from an honest
  person who looks at the task, then at the provider, and never says not_happened about an
  order shown paid), ``rollback`` and ``fork`` (with and without redo_side_effects),
  ``cancel``, ``delete`` (and ``resubmit`` of a deleted id), ``purge``, ``approve`` (an event,
  or an approval filed outside tether for ``check_wait``). Each is sent by one of: the
  console with the app's code, the console without it (``tt.Harness(store)``, nothing
  registered), the CLI with ``--app``, the CLI without it;
- nemeses: ``arm`` (SIGKILL a worker and start one that SIGKILLs itself at a named failpoint),
  ``lever_dies`` (a lever pulled from a console with the code that SIGKILLs itself at a named
  failpoint meanwhile), ``stop`` (SIGSTOP a worker past its lease, then SIGCONT), pauses.

Scenarios (the interleavings issue 26 names, made exact with gates, not timing):

- ``live_decide``: a blind ``refund`` is held in flight before paying; a hasty person decides
  ``not_happened`` (they looked: not paid); the call is let pay and its worker SIGKILLed
  before it commits (defect 2);
- ``fork_retry``: a ``transfer`` waiting out its retry backoff is forked (defect 5);
- ``fork_in_flight``: a paying call held in flight is forked, then let go (defect 8);
- ``stop_in_tool``: a worker holding a paying call in flight is frozen past its lease until
  another worker has taken the call over, then woken (the zombie must not pay again).

Many schedules run at once on one site (a *round*), sharing its workers; then the nemeses
stop, a healthy worker drains every task, and each schedule is checked:

1. no idempotency key's effect ran twice (the ledger holds each (key, order) at most once);
2. no task is lost or stuck: each ends completed, failed or cancelled, or parked in
   needs_human / paused / waiting with a reason a person can act on, and no lever it was
   sent is left pending;
3. no decision was applied to a state it was not made about: each ``human_decision`` in a
   task's recovery log settled the call (key, attempt, dialog branch) the person looked at,
   and that call was not running under a live lease when they looked.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from _levers_site import LEASE, Site, levers_app

import tether as tt
from tether import blobs
from tether.protocol import CONTROL_EVENTS

SENDERS = ("app", "bare", "cli-app", "cli-bare")
SENDER_WEIGHTS = (6, 5, 1, 1)
SCENARIOS = ("live_decide", "fork_retry", "fork_in_flight", "stop_in_tool")
OPS = {  # random operations and their weights
    "approve": 1.0, "resume": 1.2, "decide": 2.2, "rollback": 1.2, "fork": 1.0, "cancel": 0.4,
    "delete": 0.4, "resubmit": 0.3, "purge": 0.3, "arm": 0.9, "lever_dies": 0.4,
    "stop": 0.3, "pause": 1.5, "settle": 0.8,
}
NEMESES = frozenset({"arm", "stop", "pause", "purge"})
WORKER_POINTS = {  # failpoint: range of n (passes in one worker process)
    "before_plan_recorded": (1, 4), "after_resume_point": (1, 3),
    "after_tool_before_commit": (1, 3), "inside_tool": (1, 3), "mid_checkpoint": (1, 6),
    "after_checkpoint": (1, 6), "during_recovery": (1, 2), "during_rollback": (1, 1),
}
CONSOLE_POINTS = {"after_checkpoint": (1, 1), "during_rollback": (1, 1),
                  "during_recovery": (1, 1), "event_stored": (1, 1), "mid_checkpoint": (1, 1)}
PARKED = frozenset({"needs_human", "paused", "waiting"})
FINAL = frozenset({"completed", "failed", "cancelled"})
GATES = {"live_decide": ("before", "after"), "fork_retry": ("fail",), "fork_in_flight": ("before",),
         "stop_in_tool": ("before",)}
SCENARIO_WAIT = 10.0
DRAIN_TIMEOUT = 60.0


# ---------------------------------------------------------------------- plans


@dataclass(frozen=True)
class Op:
    kind: str
    task: int = 0          # which of the schedule's tasks (modulo how many it has by then)
    sender: str = "app"
    args: tuple[tuple[str, Any], ...] = ()

    def arg(self, name: str, default: Any = None) -> Any:
        return dict(self.args).get(name, default)

    def describe(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self.args)
        if self.kind in NEMESES:
            return f"{self.kind}({extra})"
        return f"{self.kind}(task {self.task}, via {self.sender}{', ' + extra if extra else ''})"


@dataclass(frozen=True)
class Plan:
    seed: int
    tasks: tuple[tuple[str, ...], ...]
    scenario: str
    step: int              # the scenario's step in task 0
    ops: tuple[Op, ...]

    def describe(self) -> str:
        lines = [f"schedule seed {self.seed}: scenario {self.scenario} at task 0 step {self.step}"]
        lines += [f"  task {i}: {list(steps)}" for i, steps in enumerate(self.tasks)]
        lines += [f"  op {i}: {op.describe()}" for i, op in enumerate(self.ops)]
        return "\n".join(lines)


def _steps(rng: random.Random, need: str | None) -> tuple[list[str], int]:
    """A task's steps, and where the scenario's call is: early, after nothing that could hold
    the task up before it (a wait for approval, a refund in doubt)."""
    at = rng.choice((0, 0, 1, 2))
    steps = [rng.choice(("lookup", "charge")) for _ in range(at)]
    steps.append(need or rng.choice(levers_app.PAYING))
    steps += [rng.choice(("lookup", "refund", "charge", "charge", "transfer", "wait", "refund"))
              for _ in range(rng.randint(1, 3))]
    return steps, at


def make_plan(seed: int, n_ops: int | None = None, scenario: str | None = None) -> Plan:
    """Everything random about a schedule, from the seed alone."""
    rng = random.Random(seed)
    scenario = scenario or rng.choice(SCENARIOS)
    need = {"live_decide": "refund", "fork_retry": "transfer",
            "stop_in_tool": rng.choice(("refund", "charge"))}.get(scenario)
    first, at = _steps(rng, need)
    second, _ = _steps(rng, None)
    ops = [Op("submit", 0, rng.choice(("app", "app", "app", "cli-app"))),
           Op(scenario, 0, rng.choices(SENDERS, SENDER_WEIGHTS)[0], (("step", at),
              ("redo", rng.random() < 0.2))),
           Op("submit", 1, rng.choice(("app", "app", "cli-app")))]
    kinds, weights = zip(*OPS.items(), strict=True)
    for _ in range(n_ops if n_ops is not None else rng.randint(4, 7)):
        kind = rng.choices(kinds, weights)[0]
        args = _args(rng, kind)
        sender = rng.choices(SENDERS, SENDER_WEIGHTS)[0]
        if dict(args).get("persona") == "hasty":
            sender = rng.choice(("app", "bare"))  # a hasty look and answer, seconds apart at most
        ops.append(Op(kind, rng.randrange(4), sender, args))
    return Plan(seed, (tuple(first), tuple(second)), scenario, at, tuple(ops))


def _args(rng: random.Random, kind: str) -> tuple[tuple[str, Any], ...]:
    if kind == "decide":
        return (("persona", rng.choice(("careful", "careful", "hasty"))),
                ("skip", rng.random() < 0.25))
    if kind in ("rollback", "fork"):
        return (("pick", round(rng.random(), 3) if kind == "rollback" or rng.random() < 0.6
                 else None), ("redo", rng.random() < 0.35))
    if kind == "resume":
        return (("message", "carry on" if rng.random() < 0.3 else None),)
    if kind == "approve":
        return (("outside", rng.random() < 0.3),)
    if kind == "arm":
        point = rng.choice(sorted(WORKER_POINTS))
        low, high = WORKER_POINTS[point]
        return (("slot", rng.choice((1, 2))), ("spec", f"{point}@{rng.randint(low, high)}"))
    if kind == "lever_dies":
        point = rng.choice(sorted(CONSOLE_POINTS))
        low, high = CONSOLE_POINTS[point]
        # not fork: a fork whose writer dies between its two steps stays leased for FORK_LEASE
        # (a minute), and the drain would wait that out
        lever = rng.choice(("resume", "rollback", "rollback", "decide", "cancel"))
        return (("spec", f"{point}@{rng.randint(low, high)}"), ("lever", lever),
                *_args(rng, lever))
    if kind == "stop":
        return (("slot", rng.choice((1, 2))), ("lease", round(rng.uniform(1.3, 2.5), 2)))
    if kind == "pause":
        return (("seconds", round(rng.uniform(0.05, 0.4), 3)),)
    return ()


# ---------------------------------------------------------------------- running one


@dataclass
class Run:
    plan: Plan
    site: Site
    prefix: str
    ids: list[str] = field(default_factory=list)
    nonces: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    created: set[str] = field(default_factory=set)   # known to have been stored
    gone: set[str] = field(default_factory=set)      # deleted or purged (and not resubmitted)
    armed: Any = None                                # the one-off console of lever_dies
    decisions: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    slow: list[tuple[float, str]] = field(default_factory=list)
    started: float = field(default_factory=time.time)

    @property
    def seed(self) -> int:
        return self.plan.seed

    def task_id(self, op: Op) -> str:
        return self.ids[op.task % len(self.ids)]

    def by(self, i: int) -> str:
        return f"levers:{self.seed}:{i}"

    def note(self, i: int, op: Op, what: str) -> None:
        self.log.append(f"  op {i} {op.describe()}: {what}")

    def order(self, task_id: str, step: int) -> str:
        return f"{task_id}.{self.nonces[task_id]}.{step}"


async def run_schedule(run: Run, round_start: float) -> None:
    for i, op in enumerate(run.plan.ops):
        began = time.monotonic()
        try:
            what = await _do(run, i, op, round_start)
        except Exception as exc:  # a lever refused is an answer; this is the test's own failure
            what = f"TEST ERROR {type(exc).__name__}: {exc}"
            run.counts["test_errors"] += 1
        run.counts[op.kind] += 1
        took = time.monotonic() - began
        run.slow.append((took, f"seed {run.seed} op {i} {op.kind}: {what[:120]}"))
        run.note(i, op, f"{what} [{took:.2f}s]")


async def _do(run: Run, i: int, op: Op, round_start: float) -> str:
    site = run.site
    if op.kind == "submit":
        task_id = f"{run.prefix}-t{op.task}"
        run.ids.append(task_id)
        return await _submit(run, i, op, task_id, list(run.plan.tasks[op.task]))
    if op.kind in SCENARIOS:
        return await SCENARIO_RUNNERS[op.kind](run, i, op)
    if op.kind == "pause":
        await asyncio.sleep(op.arg("seconds"))
        return "ok"
    if op.kind == "arm":
        await site.arm(op.arg("slot"), op.arg("spec"))
        return "armed"
    if op.kind == "lever_dies":
        run.armed = await site.armed_console(op.arg("spec"))
        try:
            inner = Op(op.arg("lever"), op.task, "armed", op.args)
            return "from an armed console: " + await _do(run, i, inner, round_start)
        finally:
            await site.done_with_armed(run.armed)
            run.armed = None
    if op.kind == "stop":
        worker = site.workers[op.arg("slot")]
        async with site.frozen(worker, wait=False) as stopped:
            if stopped:
                await asyncio.sleep(LEASE * op.arg("lease"))
        return "frozen and woken" if stopped else "skipped (another freeze under way)"
    if op.kind == "purge":
        reply = await (await site.console("app")).request("purge", before=round_start)
        if reply.get("ok"):
            site.purged.update(reply["purged"])
            return f"purged {len(reply['purged'])}"
        return _refused(reply)
    task_id = run.task_id(op)
    if op.kind == "settle":
        await _settle(site, task_id, 3.0)
        return "ok"
    if op.kind == "resubmit":
        if task_id not in run.gone:
            return "skipped (not deleted)"
        what = await _submit(run, i, op, task_id, list(run.plan.tasks[op.task % 2]), again=True)
        if await _exists(site, task_id):
            run.gone.discard(task_id)
        return what
    if op.kind == "approve":
        return await _approve(run, i, op, task_id)
    if op.kind == "decide":
        return await _decide(run, i, op, task_id, op.arg("persona"), op.arg("skip"))
    if op.kind == "fork":
        return await _fork(run, i, op, task_id, op.arg("pick"), op.arg("redo"))
    return await _lever(run, i, op, task_id)


async def _console(run: Run, sender: str) -> Any:
    """The console a lever is sent from: the shared ones, or this op's armed one."""
    return run.armed if sender == "armed" else await run.site.console(sender)


def _refused(reply: dict[str, Any]) -> str:
    return f"refused: {reply.get('error_type')}: {str(reply.get('error'))[:160]}"


async def _submit(run: Run, i: int, op: Op, task_id: str, steps: list[str],
                  again: bool = False) -> str:
    nonce = f"n{run.seed}x{i}"
    run.nonces[task_id] = nonce
    task_input = {"steps": steps, "nonce": nonce}
    if not again and op.task == 0:  # the scenario's gates are up before its call can start
        order = run.order(task_id, run.plan.step)
        for phase in GATES[run.plan.scenario]:
            run.site.gate(order, phase)
    if op.sender == "cli-app":
        code, out = await run.site.cli(True, "submit", "levers", "--input",
                                       json.dumps(task_input), "--id", task_id)
        what = f"exit {code}" + ("" if code == 0 else f": {out[-200:]}")
    else:
        reply = await (await run.site.console("app")).request("submit", input=task_input,
                                                              task=task_id)
        what = ("resubmitted" if again else "submitted") if reply.get("ok") else _refused(reply)
    if await _exists(run.site, task_id):  # a sender that died may or may not have stored it
        run.created.add(task_id)
    return what


async def _approve(run: Run, i: int, op: Op, task_id: str) -> str:
    if op.arg("outside"):
        run.site.approve_outside(task_id, run.by(i))
        return "filed outside tether"
    payload = {"by": run.by(i)}
    if op.sender.startswith("cli"):
        code, out = await run.site.cli(op.sender == "cli-app", "emit", task_id, "approval",
                                       "--priority", "1", "--payload", json.dumps(payload))
        return f"exit {code}: {out.strip()[-160:]}"
    reply = await (await _console(run, op.sender)).request(
        "emit", task=task_id, type="approval", payload=payload, priority=1)
    return reply.get("outcome", "") if reply.get("ok") else _refused(reply)


async def _observe(site: Site, task_id: str) -> dict[str, Any] | None:
    assert site.reader is not None
    try:
        return levers_app.observe(await site.reader.get(task_id))
    except tt.TetherError:
        return None


async def _decide(run: Run, i: int, op: Op, task_id: str, persona: str, skip: bool) -> str:
    site = run.site
    if not op.sender.startswith("cli"):
        reply = await (await _console(run, op.sender)).request(
            "decide", task=task_id, persona=persona, skip=skip, by=run.by(i))
        if not reply.get("ok"):
            return _refused(reply)
        if not reply.get("sent"):
            return f"not sent: {reply.get('why')}"
        _record_decision(run, i, op, task_id, reply, reply["obs"], reply.get("payload"),
                         bypass=site.unsafe)
        return f"{reply['outcome']} sent ({reply.get('event_status')})"
    seen = await _observe(site, task_id)
    if seen is None:
        return "not sent: no such task"
    assert site.reader is not None
    queued = sum(1 for e in await site.reader.reads.events(task_id)
                 if str(e.status) == "pending" and e.event.type in CONTROL_EVENTS)
    why = levers_app.why_not_decide(seen, persona, queued)
    if why is not None:
        return f"not sent: {why}"
    call = seen["call"]
    outcome, result, paid = levers_app.honest_answer(call, skip, site.dir)
    args = ["decide", task_id, outcome, "--etag", seen["etag"]]
    if result is not None:
        args += ["--result", json.dumps(result)]
    before = {e.event.id for e in await site.reader.reads.events(task_id)} if site.reader else set()
    code, out = await site.cli(op.sender == "cli-app", *args)
    assert site.reader is not None
    try:
        events = await site.reader.reads.events(task_id)
    except tt.TetherError:
        events = []
    for stored in events:
        if stored.event.type == "decide" and stored.event.id not in before:
            _record_decision(run, i, op, task_id, {"outcome": outcome, "paid_seen": paid,
                                                   "event_id": stored.event.id}, seen,
                             stored.event.payload, bypass=False)
    return f"{outcome}: exit {code}: {out.strip()[-200:]}"


def _record_decision(run: Run, i: int, op: Op, task_id: str, reply: dict[str, Any],
                     seen: dict[str, Any], payload: Any, bypass: bool) -> None:
    """What the decision was made about: the call the person looked at (key, attempt, dialog
    branch, whether a worker held it live). What the harness bound it to, if it says, is kept
    for the report."""
    call = seen["call"] or {}
    about = {"key": call.get("key"), "attempt": call.get("attempt"), "branch": seen["branch"],
             "live": seen["live"], "version": seen["version"]}
    bound = None
    if isinstance(payload, dict) and "attempt" in payload:
        bound = {k: payload.get(k) for k in ("key", "attempt", "branch", "version")}
    run.decisions[(task_id, int(reply["event_id"]))] = {
        "op": i, "sender": op.sender, "outcome": reply["outcome"], "about": about,
        "bound": bound, "bypass": bypass, "paid_seen": reply.get("paid_seen"),
        "status_seen": seen["status"]}


async def _fork(run: Run, i: int, op: Op, task_id: str, at: float | None, redo: bool) -> str:
    site = run.site
    fork_id = f"{run.prefix}-f{len(run.ids)}"
    if op.sender.startswith("cli"):
        args = ["fork", task_id, "--id", fork_id]
        if at is not None:
            version = await _pick_version(site, task_id, at)
            if version is None:
                return "skipped (no versions)"
            args += ["--from", str(version)]
        if redo:
            args.append("--redo-side-effects")
        code, out = await site.cli(op.sender == "cli-app", *args)
        ok = code == 0
        what = f"exit {code}: {out.strip()[-200:]}"
    else:
        reply = await (await _console(run, op.sender)).request(
            "fork", task=task_id, pick=at, redo=redo, new_task=fork_id, by=run.by(i))
        ok = bool(reply.get("ok"))
        what = f"forked at v{reply.get('version')}" if ok else _refused(reply)
    if ok or await _exists(site, fork_id):
        run.ids.append(fork_id)
        run.nonces[fork_id] = run.nonces[task_id]
        run.created.add(fork_id)
    return what


async def _exists(site: Site, task_id: str) -> bool:
    assert site.reader is not None
    try:
        await site.reader.store.get_task(task_id)
        return True
    except tt.TaskNotFound:
        return False


async def _pick_version(site: Site, task_id: str, at: float) -> int | None:
    assert site.reader is not None
    try:
        versions = sorted(v for v, *_ in await site.reader.reads.versions(task_id))
    except tt.TetherError:
        return None
    return versions[min(len(versions) - 1, int(at * len(versions)))] if versions else None


async def _lever(run: Run, i: int, op: Op, task_id: str) -> str:
    """resume, rollback, cancel or delete, from any sender."""
    site = run.site
    if op.sender.startswith("cli"):
        args: list[str] = [op.kind, task_id]
        if op.kind == "resume" and op.arg("message"):
            args += ["--message", op.arg("message")]
        if op.kind == "rollback":
            version = await _pick_version(site, task_id, op.arg("pick"))
            if version is None:
                return "skipped (no versions)"
            args += ["--to", str(version)] + (["--redo-side-effects"] if op.arg("redo") else [])
        if op.kind == "delete":
            args.append("--yes")
        code, out = await site.cli(op.sender == "cli-app", *args)
        if op.kind == "delete" and not await _exists(site, task_id):
            run.gone.add(task_id)
        return f"exit {code}: {out.strip()[-200:]}"
    extra: dict[str, Any] = {}
    if op.kind == "resume":
        extra["message"] = op.arg("message")
    if op.kind == "rollback":
        extra = {"pick": op.arg("pick"), "redo": op.arg("redo")}
    reply = await (await _console(run, op.sender)).request(op.kind, task=task_id, by=run.by(i),
                                                          **extra)
    if op.kind == "delete" and not await _exists(site, task_id):
        run.gone.add(task_id)
    if not reply.get("ok"):
        return _refused(reply)
    return f"{reply.get('event_status') or 'done'}" + (
        f" (to v{reply['version']})" if "version" in reply else "")


async def _settle(site: Site, task_id: str, timeout: float) -> dict[str, Any] | None:
    end = time.monotonic() + timeout
    while True:
        seen = await _observe(site, task_id)
        if seen is None or (seen["status"] in PARKED | FINAL and not seen["live"]) \
                or time.monotonic() > end:
            return seen
        await asyncio.sleep(0.05)


async def _until(check: Any, timeout: float = SCENARIO_WAIT, every: float = 0.04) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = await check()
        if found:
            return found
        await asyncio.sleep(every)
    return None


# ---------------------------------------------------------------------- scenarios


async def _live_decide(run: Run, i: int, op: Op) -> str:
    """Defect 2: a decision about a live call, then the worker pays and dies uncommitted."""
    site, task_id = run.site, run.ids[0]
    order = run.order(task_id, op.arg("step"))
    try:
        pid = await _reached(run, task_id, order, "before")
        if pid is None:
            return "the call never reached its gate"
        sender = op.sender if op.sender in ("app", "bare") else "app"
        said = await _decide(run, i, Op("decide", 0, sender), task_id, "hasty", False)
        site.ungate(order, "before")
        paid = await _reached(run, task_id, order, "after")
        killed = paid is not None and await site.kill_pid(paid)
        return f"decided while live: {said}; paid and {'killed' if killed else 'not killed'}"
    finally:
        site.ungate(order)


async def _fork_retry(run: Run, i: int, op: Op) -> str:
    """Defect 5: fork a version whose transfer waits out its retry backoff. Its first attempt
    is held before it fails, so the backoff starts when this lets it go."""
    site, task_id = run.site, run.ids[0]
    order = run.order(task_id, op.arg("step"))
    try:
        if await _reached(run, task_id, order, "fail") is None:
            return "the transfer never reached its gate"
        site.ungate(order, "fail")

        async def waiting() -> bool:
            seen = await _observe(site, task_id)
            call = None if seen is None else seen["call"]
            return bool(call and call["tool"] == "transfer" and call["status"] == "failed"
                        and call.get("retry_at"))

        if not await _until(waiting, 5.0):
            return "the transfer never waited out a retry"
        sender = op.sender if op.sender in ("app", "bare") else "app"  # within the backoff
        return "forked while retry-waiting: " + await _fork(run, i, Op("fork", 0, sender),
                                                          task_id, None, op.arg("redo"))
    finally:
        site.ungate(order)


async def _reached(run: Run, task_id: str, order: str, phase: str) -> int | None:
    """The pid of the worker holding the task's call at its gate, once it is there; None if
    the task parks or ends before it gets there (a nemesis got in the way)."""
    site = run.site
    end = time.monotonic() + SCENARIO_WAIT
    while time.monotonic() < end:
        pid = site.at_gate(order, phase, task_id)
        if pid is not None:
            return pid
        seen = await _observe(site, task_id)
        if seen is None or (seen["status"] in PARKED | FINAL and not seen["live"]):
            return None
        await asyncio.sleep(0.03)
    return None


async def _fork_in_flight(run: Run, i: int, op: Op) -> str:
    """Defect 8: fork while the source's call is in flight, then let the source finish."""
    site, task_id = run.site, run.ids[0]
    order = run.order(task_id, op.arg("step"))
    try:
        pid = await _reached(run, task_id, order, "before")
        if pid is None:
            return "the call never reached its gate"
        return "forked in flight: " + await _fork(run, i, Op("fork", 0, op.sender), task_id,
                                                  None, op.arg("redo"))
    finally:
        site.ungate(order)


async def _stop_in_tool(run: Run, i: int, op: Op) -> str:
    """A worker frozen inside a paying call past its lease, woken after a takeover."""
    site, task_id = run.site, run.ids[0]
    order = run.order(task_id, op.arg("step"))
    try:
        pid = await _reached(run, task_id, order, "before")
        worker = None if pid is None else site.worker_by_pid(pid)
        if worker is None:
            return "the call never reached its gate"
        async with site.frozen(worker) as stopped:
            if not stopped:
                return "could not freeze the worker"
            site.clear_marker(order, "before", task_id)

            async def taken_over() -> bool:
                seen = await _observe(site, task_id)
                if seen is None:
                    return True
                owner = seen["lease_owner"]
                return (owner is not None and f":{pid}:" not in owner) or (
                    owner is None and seen["status"] in PARKED | FINAL)

            took = await _until(taken_over, 8.0)
            if took and run.plan.tasks[0][op.arg("step")] == "charge":
                # the new holder reconciles (not paid), makes the call and stops at the gate
                await _until(lambda: _async(site.at_gate(order, "before", task_id)), 3.0)
            site.ungate(order, "before")
            if took and run.plan.tasks[0][op.arg("step")] == "charge":
                await _until(lambda: _async(levers_app.order_paid(order, site.dir)), 3.0)
            status = (await _observe(site, task_id) or {}).get("status") if took \
                else "not taken over"
        return f"froze pid {pid}; taken over: {bool(took)}; then {status}"
    finally:
        site.ungate(order)


async def _async(value: Any) -> Any:
    return value


SCENARIO_RUNNERS = {"live_decide": _live_decide, "fork_retry": _fork_retry,
                    "fork_in_flight": _fork_in_flight, "stop_in_tool": _stop_in_tool}


# ---------------------------------------------------------------------- the drain and checks


async def drain(site: Site, task_ids: list[str], timeout: float = DRAIN_TIMEOUT) -> list[str]:
    """Stop the nemeses and let the healthy workers finish; the ids still not settled."""
    site.ungate_all()
    for worker in site.workers.values():
        worker.signal(signal.SIGCONT)  # nobody stays frozen
    began = time.monotonic()
    unsettled = list(task_ids)
    noted = False
    while True:
        unsettled = [t for t in unsettled if not await _settled(site, t)]
        waited = time.monotonic() - began
        if unsettled and waited > 10 and not noted:
            noted = True
            seen = [(t, await _observe(site, t)) for t in unsettled[:6]]
            site.notes.append(f"drain still waiting after 10s for {len(unsettled)}: {seen}")
            await site.ask_holders([s["lease_owner"] for _, s in seen if s and s["lease_owner"]])
        if not unsettled or waited > timeout:
            return unsettled
        await asyncio.sleep(0.1)


async def _settled(site: Site, task_id: str) -> bool:
    """Nothing more will happen to the task without a person: parked or finished, no worker
    holding it, no lever queued. A parked task leased by a process that is dead (a fork whose
    lever process died while writing it: ``FORK_LEASE`` is a minute) counts as settled."""
    assert site.reader is not None
    try:
        record = await site.reader.store.get_task(task_id)
    except tt.TaskNotFound:
        return True
    if record.status.value not in PARKED | FINAL:
        return False
    live = record.lease_owner is not None and (record.lease_until or 0) > time.time()
    if live and not site.holder_dead(record.lease_owner):
        return False
    pending = [e for e in await site.reader.reads.events(task_id)
               if str(e.status) == "pending" and e.event.type in CONTROL_EVENTS]
    return not pending


@dataclass
class Violation:
    invariant: int
    seed: int
    task: str
    detail: str


async def check(runs: list[Run]) -> list[Violation]:
    """The three invariants, per schedule, from the ledger and the store."""
    if not runs:
        return []
    site = runs[0].site
    assert site.reader is not None
    found: list[Violation] = []
    owner = {task_id: run for run in runs for task_id in run.ids}
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in levers_app.read_effects(site.dir):
        by_key[(row["key"], row["order"])].append(row)
    for (key, order), rows in by_key.items():
        if len(rows) > 1:
            seeds = {owner[r["task"]].seed for r in rows if r["task"] in owner}
            for seed in seeds or {-1}:
                found.append(Violation(1, seed, rows[0]["task"], (
                    f"{rows[0]['tool']} key={key} order={order} paid {len(rows)} times: "
                    + "; ".join(f"task {r['task']} attempt {r['attempt']} fence {r['fence']}"
                                f" pid {r['pid']}" for r in rows))))
    for run in runs:
        for task_id in sorted(run.created):
            found += await _check_task(run, task_id)
    return found


async def _check_task(run: Run, task_id: str) -> list[Violation]:
    site = run.site
    assert site.reader is not None
    out: list[Violation] = []
    # a worker re-checks a waiting task now and then (R16: one started since the drain, a
    # wait's due time), holding it a moment: a lease seen now is waited out, not taken for a
    # stuck task. The task is judged on one read, taken once it is settled (or 20 s on).
    end = time.monotonic() + 20.0
    while True:
        settled = await _settled(site, task_id)
        try:
            info = await site.reader.get(task_id)
        except tt.TaskNotFound:
            if task_id not in run.gone and task_id not in site.purged:
                out.append(Violation(2, run.seed, task_id, "the task is gone, though no lever"
                                     " deleted or purged it"))
            return out
        except tt.TetherError as exc:
            out.append(Violation(2, run.seed, task_id, f"cannot be read: {exc}"))
            return out
        record, snap = info.record, info.snapshot
        status = record.status.value
        live = record.lease_owner is not None and (record.lease_until or 0) > time.time() \
            and not site.holder_dead(record.lease_owner)
        if (settled and not live) or time.monotonic() > end:
            break
        await asyncio.sleep(0.1)
    if status not in PARKED | FINAL or live:
        out.append(Violation(2, run.seed, task_id, f"stuck {status} after the drain"
                             f" (lease {record.lease_owner}, reason {record.reason!r})"))
    elif status in PARKED:
        log = await site.reader.reads.recovery_log(task_id)
        reason = record.reason or snap.error or (
            f"waits for {snap.frame.wait['event_type']}" if status == "waiting" and snap.frame.wait
            else None)
        if not reason and status == "paused" and log:
            # a fork of a finished version, or a rollback to one, waits paused for a resume:
            # its row has no reason, its recovery log says what it is
            reason = f"{log[-1]['resume_strategy']}: {log[-1]['detail']}"
            run.counts["paused, reason only in the recovery log"] += 1
        if not reason:
            out.append(Violation(2, run.seed, task_id, f"{status} with no reason a person can"
                                 " act on"))
    for stored in await site.reader.reads.events(task_id):
        if str(stored.status) == "pending" and stored.event.type in CONTROL_EVENTS:
            out.append(Violation(2, run.seed, task_id, f"lever {stored.event.type}"
                                 f" #{stored.event.id} was never applied or refused"
                                 f" (task {status})"))
    for entry in await site.reader.reads.recovery_log(task_id):
        if entry.get("resume_strategy") != "human_decision":
            continue
        out += await _check_decision(run, task_id, entry)
    return out


async def _check_decision(run: Run, task_id: str, entry: dict[str, Any]) -> list[Violation]:
    site = run.site
    assert site.reader is not None
    made = run.decisions.get((task_id, int(entry.get("event_id") or 0)))
    if made is None:
        run.counts["decisions_unattributed"] += 1
        return []
    run.counts["decisions_applied"] += 1
    about = made["about"]
    version = int(entry["checkpoint_version"])
    try:
        _, head = await blobs.load_head(site.reader.store, task_id, version)
        snap = tt.Snapshot.loads(head, task_id, version)
    except tt.TetherError as exc:
        run.counts["decisions_unchecked"] += 1
        del exc
        return []
    call = snap.call
    state = None if call is None else {
        "key": call.key, "attempt": call.attempt, "status": str(call.status),
        "branch": snap.history_segments[-1][0] if snap.history_segments else 0}
    problems = []
    if about["live"]:
        problems.append("the call was running under a live worker's lease when the person"
                        " looked")
    if state is None or state["status"] != "started":
        problems.append(f"no call was in doubt at version {version} ({state})")
    else:
        for name in ("key", "attempt", "branch"):
            if about.get(name) is not None and about[name] != state[name]:
                problems.append(f"{name} {about[name]!r} was looked at, {state[name]!r} was"
                                " settled")
    if not problems:
        return []
    return [Violation(3, run.seed, task_id, (
        f"decision {made['outcome']!r} (op {made['op']} via {made['sender']}, event"
        f" #{entry.get('event_id')}) applied at version {version}: {'; '.join(problems)};"
        f" made about {about} ({made['status_seen']}, order paid: {made['paid_seen']}),"
        f" bound by the harness to {made['bound']}"))]

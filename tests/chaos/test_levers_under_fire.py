"""Levers under fire (issue 26; R10, R21, R26, E4): people's levers, sent from processes with
and without the app's code, against real workers that are SIGKILLed at named failpoints and
frozen past their lease, on SQLite, PostgreSQL and PostgreSQL behind the Redis cache.

Jepsen's shape: seeded random schedules of operations and nemeses (see ``_levers_schedules``)
run many at a time against long-lived ``tether worker`` processes
(``--app tests.chaos._levers_app:harness``); every payment is counted by a provider outside
tether (``_levers_app``: an fsynced append-only ledger); after each round a healthy worker
drains every task and each schedule is checked:

1. (R10, E4) no idempotency key's effect ran twice;
2. (R21, R26) no task is lost or stuck without a reason a person can act on;
3. (R10, R26) no decision was applied to a state it was not made about.

The negative control runs the same schedules on a tether with the protections switched off
(``_levers_unsafe``: decisions not bound to their observation, forks sharing their source's
keys, decisions written past the harness's refusal of a live call) and must find a violation.

Replay: a failure prints each schedule's seed, plan and what became of every operation, and
``LEVERS_SEED=<seed>[,<seed>...] .venv/bin/python -m pytest
tests/chaos/test_levers_under_fire.py -k on_sqlite`` (or ``'on_postgres and not redis'``,
``redis_cache``) runs those schedules again, as one round: the same operations, the
interleaving is the machine's. ``LEVERS_SCHEDULES=N`` sets how many schedules each backend
runs; ``LEVERS_VERBOSE=1`` prints every schedule and what became of each operation.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from _levers_schedules import Plan, Run, Violation, check, drain, make_plan, run_schedule
from _levers_site import Site

import services

pytestmark = pytest.mark.timeout(420)

# (backend, first seed, schedules): at least 200 a run in all
BACKENDS = {"sqlite": (1_000, 70), "postgres": (2_000, 65), "postgres_redis": (3_000, 65)}
PER_ROUND = 27
REPLAY_K = {"sqlite": "on_sqlite", "postgres": "on_postgres and not redis",
            "postgres_redis": "redis_cache"}
NEGATIVE_SEEDS = range(9_000, 9_012)
NEGATIVE_SCENARIOS = ("live_decide", "fork_retry")


def _seeds(backend: str) -> list[int]:
    wanted = os.environ.get("LEVERS_SEED")
    if wanted:
        return [int(s) for s in wanted.split(",") if s.strip()]
    first, count = BACKENDS[backend]
    return list(range(first, first + int(os.environ.get("LEVERS_SCHEDULES", count))))


async def _run(site: Site, plans: list[Plan]) -> tuple[list[Run], list[Violation], list[str]]:
    nonce = uuid.uuid4().hex[:6]
    runs: list[Run] = []
    found: list[Violation] = []
    unsettled: list[str] = []
    await site.start()
    try:
        for at in range(0, len(plans), PER_ROUND):
            round_start = time.time()
            batch = [Run(plan, site, f"{nonce}-s{plan.seed}") for plan in plans[at:at + PER_ROUND]]
            await asyncio.gather(*(run_schedule(run, round_start) for run in batch))
            ran = time.time()
            unsettled += await drain(site, [t for run in batch for t in sorted(run.created)])
            drained = time.time()
            found += await check(batch)
            site.rounds.append((ran - round_start, drained - ran, time.time() - drained))
            runs += batch
    finally:
        await site.close()
    return runs, found, unsettled


def _report(site: Site, runs: list[Run], found: list[Violation], seconds: float) -> str:
    ops: Counter[str] = Counter()
    for run in runs:
        ops.update(run.counts)
    lines = [f"levers under fire on {site.kind}: {len(runs)} schedules in {seconds:.1f}s;"
             f" kills {dict(site.kills)}; freezes {site.stops}; CLI runs {site.cli_runs};"
             f" operations {dict(sorted(ops.items()))};"
             f" rounds (run, drain, check seconds) {[tuple(round(x, 1) for x in r) for r in site.rounds]};"
             f" violations {dict(Counter(v.invariant for v in found))}"]
    lines += [f"  process trouble: {error}" for error in site.errors]
    lines += [f"  note: {note}" for note in site.notes]
    lengths = sorted(round(sum(t for t, _ in run.slow), 1) for run in runs)
    if lengths:
        lines.append(f"  schedule lengths (s): median {lengths[len(lengths) // 2]}, max {lengths[-1]}")
    slowest = sorted((item for run in runs for item in run.slow), reverse=True)[:8]
    lines += [f"  slow: {took:.1f}s {what}" for took, what in slowest]
    by_seed = {run.seed: run for run in runs}
    for seed in sorted({v.seed for v in found}):
        run = by_seed.get(seed)
        lines.append(f"--- seed {seed} (replay: LEVERS_SEED={seed} .venv/bin/python -m pytest"
                     f" tests/chaos/test_levers_under_fire.py -k '{REPLAY_K[site.kind]}')")
        lines += [f"  invariant {v.invariant}: task {v.task}: {v.detail}"
                  for v in found if v.seed == seed]
        if run is not None:
            lines.append(run.plan.describe())
            lines += run.log
    return "\n".join(lines)


async def _levers_under_fire(site: Site) -> None:
    began = time.monotonic()
    plans = [make_plan(seed) for seed in _seeds(site.kind)]
    runs, found, _ = await _run(site, plans)
    report = _report(site, runs, found, time.monotonic() - began)
    print(report)
    if os.environ.get("LEVERS_VERBOSE"):
        for run in runs:
            print(run.plan.describe())
            print("\n".join(run.log))
    assert not found and not site.errors, report


async def test_r10_r21_r26_e4_levers_under_fire_on_sqlite(tmp_path: Path) -> None:
    """R10/R21/R26/E4 on SQLite: no key paid twice, no task lost or stuck, no decision applied
    to a state it was not made about, whoever pulls the levers while workers die."""
    await _levers_under_fire(Site.make("sqlite", tmp_path, f"sqlite:///{tmp_path / 'tether.db'}"))


@pytest.mark.postgres
async def test_r10_r21_r26_e4_levers_under_fire_on_postgres(tmp_path: Path, pg_url: str) -> None:
    """The same invariants on PostgreSQL, workers sharing nothing but the database."""
    await _levers_under_fire(Site.make("postgres", tmp_path, pg_url))


@pytest.mark.postgres
@pytest.mark.redis
async def test_r10_r21_r26_e4_levers_under_fire_on_postgres_with_the_redis_cache(
        tmp_path: Path, pg_url: str) -> None:
    """The same on PostgreSQL with every worker and lever process behind the Redis cache."""
    cache = services.redis_url()
    await _levers_under_fire(Site.make("postgres_redis", tmp_path, pg_url, cache=cache))


async def test_r10_e4_negative_control_levers_without_their_protections_pay_twice(
        tmp_path: Path) -> None:
    """NEGATIVE CONTROL: with decisions not bound to their observation, decisions written past
    the harness's refusal of a live call, and forks sharing their source's keys, the same
    schedules find a key paid twice (a stale decision applied, or a fork re-running its
    source's call)."""
    began = time.monotonic()
    site = Site.make("sqlite", tmp_path, f"sqlite:///{tmp_path / 'tether.db'}", unsafe=True)
    plans = [make_plan(seed, scenario=NEGATIVE_SCENARIOS[n % len(NEGATIVE_SCENARIOS)])
             for n, seed in enumerate(NEGATIVE_SEEDS)]
    runs, found, _ = await _run(site, plans)
    report = _report(site, runs, found, time.monotonic() - began)
    print(report)
    assert any(v.invariant == 1 for v in found), (
        "the negative control found no key paid twice: the test cannot tell protected levers"
        " from unprotected ones\n" + report)

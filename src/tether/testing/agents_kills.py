"""The kill half of the model-agent conformance suite (see :mod:`tether.testing.agents`).

A worker process runs the case's agent and is SIGKILLed: by a failpoint (``TETHER_FAILPOINTS``)
or by the test while the model's answer streams. The fake model runs in the test process and
counts every completion any process asked for; the shop's ledger file counts every refund any
process paid. Then this process, as a fresh worker, takes the task over (it waits out the dead
worker's lease) and runs it to the end.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tether as tt
from tether.model import CallStatus
from tether.testing.agents_forkserver import forkserver
from tether.testing.agents_suite import LOOKUP, REFUND
from tether.testing.agents_worker import KILL_SETTINGS
from tether.testing.agents_world import (
    AGENT,
    PROMPT,
    TASK,
    AdapterCase,
    Endpoint,
    Shop,
    found,
    refunded,
    strategies,
    tool_results,
    wait_until,
)
from tether.testing.fake_openai import FakeOpenAI, Reply, reply

KILLED = -signal.SIGKILL
WORKER_TIMEOUT = 60.0
BASE = 2
"""Completions of the uninterrupted task: the answer (lookup, refund), then the final one."""


def model(slow_first: bool = False) -> Callable[[dict[str, Any]], Reply]:
    """The fake model's answers, by what it is asked (as a model answers the same prompt the
    same way, so an answer asked for again is the same answer): the two calls while no call
    was answered, then the final answer. *slow_first*: the first answer hangs after its first
    chunk (a kill lands inside it)."""
    asked: list[dict[str, Any]] = []

    def answer(body: dict[str, Any]) -> Reply:
        asked.append(body)
        if slow_first and len(asked) == 1:
            return reply("I will look into this for you now, one moment please.", chunks=8,
                         hang=60)
        if not any(m.get("role") == "tool" for m in body.get("messages") or []):
            return reply(tool_calls=[LOOKUP, REFUND])
        return reply("Refunded.")

    return answer


@dataclass(frozen=True)
class KillPoint:
    """Where a worker is killed, and what the store and the ledger show at that moment: the
    test checks the kill landed there before it checks the recovery."""

    spec: str
    where: str
    asked: int
    """Completions the fake had been asked for when the worker died."""
    lost: int
    """Of those, answers paid for but not yet committed (the only ones asked again)."""
    paid: int
    """Refunds the provider had taken."""
    in_doubt: bool = False
    """The refund had started (its resume point committed) and was not recorded as done."""

    def __str__(self) -> str:
        return self.spec


KILL_POINTS = (
    KillPoint("mid_checkpoint@1", "while the first answer is committed", 1, 1, 0),
    KillPoint("before_plan_recorded@1", "the answer received, before its first call and the"
              " commit that writes both", 1, 1, 0),
    KillPoint("after_checkpoint@1", "the answer committed with the lookup's resume point",
              1, 0, 0),
    KillPoint("after_resume_point@2", "the refund's resume point committed, before it ran",
              1, 0, 0, in_doubt=True),
    KillPoint("inside_tool@1", "inside the refund, after the provider took it", 1, 0, 1,
              in_doubt=True),
    KillPoint("after_tool_before_commit@2", "the refund returned, its result not committed",
              1, 0, 1, in_doubt=True),
    KillPoint("mid_checkpoint@4", "while the refund's result is committed", 1, 0, 1,
              in_doubt=True),
    KillPoint("after_checkpoint@4", "the refund's result committed", 1, 0, 1),
    KillPoint("mid_checkpoint@5", "while the second answer is committed", 2, 1, 1),
)
"""The dangerous instants of one task (two calls in one answer, then a final answer). Under
:data:`KILL_SETTINGS` its checkpoints are, in order: 1 the answer with the lookup's resume
point (an answer whose first call can start at once is written in one commit with that
call's resume point), 2 lookup's result, 3 the refund's resume point, 4 the refund's result,
5 the second answer, 6 the end. Each test first checks that the kill landed where it says
(what the fake was asked, what the store and the ledger hold), so an engine that commits
otherwise fails with "the kill did not land ..." rather than testing some other instant."""


class KillRun:
    """Task :data:`TASK` of a case in *folder*, run by worker processes that get killed, then
    finished here."""

    def __init__(self, case: AdapterCase, folder: Path, shop: Shop, fake: FakeOpenAI) -> None:
        self.case, self.folder, self.shop, self.fake = case, folder, shop, fake
        self.store = f"sqlite:///{folder / 'tether.db'}"
        self.server = forkserver((*case.preload, "tether.testing.agents_worker"))
        self.started = 0

    def harness(self) -> tt.Harness:
        return self.case.harness(self.store, self.shop, Endpoint(self.fake.url), KILL_SETTINGS)

    async def submit(self) -> None:
        async with self.harness() as h:
            await h.submit(AGENT, PROMPT, task_id=TASK)

    def start(self, failpoints: str | None) -> int:
        """A worker process, armed at *failpoints*; its pid."""
        self.started += 1
        log = self.folder / f"worker-{self.started}.log"
        return self.server.start(
            "tether.testing.agents_worker:main",
            [self.case.ref, self.shop.to_json(), self.store, self.fake.url, "1",
             str(WORKER_TIMEOUT / 2)],
            {"TETHER_FAILPOINTS": failpoints} if failpoints else {}, str(log))

    async def wait(self, pid: int) -> int:
        code = await asyncio.to_thread(self.server.wait, pid, WORKER_TIMEOUT)
        log = self.folder / f"worker-{self.started}.log"
        assert code in (0, KILLED), log.read_text()[-3000:] if log.exists() else code
        return code

    async def kill_at(self, failpoints: str) -> None:
        code = await self.wait(self.start(failpoints))
        assert code == KILLED, f"the worker was not killed at {failpoints}: it exited {code}"

    async def kill_during_request(self) -> None:
        """A worker SIGKILLed once the fake has its first request (the reply hangs there)."""
        pid = self.start(None)
        await wait_until(lambda: self.fake.completions >= 1 or not self.server.running(pid),
                         "the worker's first request")
        assert self.fake.completions == 1, "the worker ended before asking the model"
        os.kill(pid, signal.SIGKILL)
        assert await self.wait(pid) == KILLED

    async def look(self) -> tt.TaskInfo:
        async with tt.Harness(self.store) as h:
            return await h.get(TASK)


def committed(info: tt.TaskInfo) -> int:
    """Completions whose answers are in the store."""
    return int(info.snapshot.usage.get("completions", 0))


def refund_in_doubt(info: tt.TaskInfo) -> bool:
    call = info.snapshot.call
    return call is not None and call.status == CallStatus.STARTED and call.tool.endswith("refund")


class AgentKillConformance:
    """What every model adapter must do when its worker process is SIGKILLed. Needs a
    ``case`` fixture giving an :class:`AdapterCase`."""

    pytestmark = [pytest.mark.asyncio]

    @pytest.mark.parametrize("point", KILL_POINTS, ids=str)
    async def test_r01_r10_a_kill_at_each_failpoint_costs_no_extra_completion(
            self, case: AdapterCase, tmp_path: Path, point: KillPoint) -> None:
        """R1, R10, R13: a worker SIGKILLed at each failpoint of a task (an answer with
        lookup and refund, then the final answer). Only an answer not yet committed when it
        died is asked for again; every committed one is never paid twice (completions = 2
        + lost). The refund is paid exactly once: one the kill left in doubt is settled by
        its reconcile hook (a refund the provider took is found and never repeated, one it
        never took runs under the same key), and the model's next request answers the
        refund with the tool's value or the hook's."""
        with FakeOpenAI(route=model()) as fake:
            run = KillRun(case, tmp_path, Shop(str(tmp_path / "ledger.db")), fake)
            await run.submit()
            await run.kill_at(point.spec)
            at_kill = await run.look()
            ledger = run.shop.ledger
            assert (fake.completions, fake.completions - committed(at_kill),
                    ledger.count("refund"), refund_in_doubt(at_kill)) == (
                point.asked, point.lost, point.paid, point.in_doubt), \
                f"the kill did not land {point.where}"
            async with run.harness() as h:
                await h.run_until_idle(timeout=WORKER_TIMEOUT)
                info = await h.get(TASK)
                log = await strategies(h)
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            assert info.snapshot.result == "Refunded."
            assert fake.completions == BASE + point.lost
            assert ledger.count("refund") == 1, f"the refund was paid {ledger.count('refund')} times"
            assert ledger.count("reconcile") == int(point.in_doubt), "the hook was not asked once"
            hook_found = point.in_doubt and point.paid == 1
            asked_hook = "reconcile" if hook_found else "reconcile_not_done"
            assert (asked_hook in log) == point.in_doubt, log
            last = fake.requests[-1]  # asking for the final answer, after both calls
            results = tool_results(last)
            assert len(results) == 2, results  # each call of the answer answered once
            assert results[-1] == (found("A1", 5) if hook_found else refunded("A1", 5))
            assert last["messages"][-1]["role"] == "tool", last

    async def test_r01_r10_a_kill_while_the_answer_streams_asks_for_it_once_more(
            self, case: AdapterCase, tmp_path: Path) -> None:
        """R1, R10: a worker SIGKILLed while the model's answer streams (the fake hangs after
        the first chunk, so the kill lands inside): that answer was never committed, so it
        is asked for once more (one extra request, no extra committed answer), and the
        refund is paid once."""
        with FakeOpenAI(route=model(slow_first=True)) as fake:
            run = KillRun(case, tmp_path, Shop(str(tmp_path / "ledger.db")), fake)
            await run.submit()
            await run.kill_during_request()
            assert committed(await run.look()) == 0
            async with run.harness() as h:
                await h.run_until_idle(timeout=WORKER_TIMEOUT)
                info = await h.get(TASK)
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            assert info.snapshot.result == "Refunded."
            assert fake.completions == 1 + BASE and committed(info) == BASE
            assert run.shop.ledger.count("refund") == 1

    async def test_r10_r13_r21_a_rescuer_killed_while_it_recovers_changes_nothing(
            self, case: AdapterCase, tmp_path: Path) -> None:
        """R10, R13, R21: the worker dies with the refund in doubt, and the worker that takes
        the task over dies too, while it recovers (``during_recovery``). A third finishes:
        the hook is asked once, the refund paid once, no completion asked again."""
        with FakeOpenAI(route=model()) as fake:
            run = KillRun(case, tmp_path, Shop(str(tmp_path / "ledger.db")), fake)
            await run.submit()
            await run.kill_at("after_resume_point@2")
            await run.kill_at("during_recovery@1")
            async with run.harness() as h:
                await h.run_until_idle(timeout=WORKER_TIMEOUT)
                info = await h.get(TASK)
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            assert fake.completions == BASE
            assert (run.shop.ledger.count("refund"), run.shop.ledger.count("reconcile")) == (1, 1)

    @pytest.mark.parametrize(("spec", "paid", "decision"), [
        ("inside_tool@1", 1, "happened"), ("after_resume_point@2", 0, "not_happened")],
        ids=["after_the_provider_took_it", "before_it_ran"])
    async def test_r10_r26_a_killed_refund_without_reconcile_goes_to_a_person(
            self, case: AdapterCase, tmp_path: Path, spec: str, paid: int,
            decision: str) -> None:
        """R10, R26: without a reconcile hook, tether cannot know whether a refund cut by a
        kill was taken: the task goes to a person (needs_human) naming the call, and the
        refund is not run again, whether the provider took it or not. The person's decision
        settles it: "happened" runs nothing, "not_happened" runs it once, under its key."""
        with FakeOpenAI(route=model()) as fake:
            run = KillRun(case, tmp_path, Shop(str(tmp_path / "ledger.db"), reconcile=False),
                          fake)
            await run.submit()
            await run.kill_at(spec)
            ledger = run.shop.ledger
            assert ledger.count("refund") == paid
            async with run.harness() as h:
                await h.run_until_idle(timeout=WORKER_TIMEOUT)
                info = await h.get(TASK)
                assert info.record.status is tt.Status.NEEDS_HUMAN, info.record.reason
                assert "refund" in (info.record.reason or ""), info.record.reason
                assert ledger.count("refund") == paid and fake.completions == 1
                await h.decide(TASK, decision, refunded("A1", 5) if paid else None)
                await h.run_until_idle(timeout=WORKER_TIMEOUT)
                info = await h.get(TASK)
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            assert ledger.count("refund") == 1 and fake.completions == BASE

"""The in-process half of the model-agent conformance suite (see :mod:`tether.testing.agents`).

Each test runs one task of the case's agent against :class:`FakeOpenAI` in this process, with
a real SQLite store; what reaches the model is read from the fake's recorded requests, what
the tools did from the shop's ledger file.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tether as tt
from tether.engine.answers import NOT_RUN
from tether.testing.agents_world import (
    AGENT,
    PROMPT,
    TASK,
    AdapterCase,
    Endpoint,
    Shop,
    Wire,
    found,
    index_of,
    refunded,
    strategies,
    text_of,
    tool_results,
    wait_until,
)
from tether.testing.fake_openai import FakeOpenAI, Reply, call, failure, reply

FAST = tt.Settings(recovery_backoff=0.01, poll_interval=0.01)
STOP = "STOP: do NOT refund A1"
LOOKUP = call("lookup", {"order": "A1"}, "c_lookup")
REFUND = call("refund", {"order": "A1", "amount": 5}, "c_refund")
NO_STREAMING = ("Unsupported value: 'stream' does not support true with this model."
                " Supported values are: false.")
"""What OpenAI answered a streamed request to a model that could not stream (HTTP 400)."""


def refuse_streams(body: dict[str, Any]) -> Reply | None:
    """A fake model's route: a streamed request is refused as a model without streaming does."""
    return failure(400, NO_STREAMING) if body.get("stream") else None


@dataclass
class Scene:
    """One task of the case's agent, submitted, with the fake model and the shop."""

    h: tt.Harness
    fake: FakeOpenAI
    shop: Shop
    wire: Wire

    async def run(self, timeout: float = 30.0) -> tt.TaskInfo:
        await self.h.run_until_idle(timeout=timeout)
        return await self.h.get(TASK)

    async def status(self) -> tt.Status:
        return (await self.h.store.get_task(TASK)).status


@asynccontextmanager
async def scene(case: AdapterCase, folder: Path, script: list[Reply], *,
                route: Callable[[dict[str, Any]], Reply | None] | None = None,
                settings: tt.Settings = FAST, can_stream: bool = True,
                **shop: Any) -> AsyncIterator[Scene]:
    with FakeOpenAI(script, route=route) as fake:
        world = Shop(str(folder / "ledger.db"), **shop)
        wire = Wire()
        h = case.harness(f"sqlite:///{folder / 'tether.db'}", world,
                         Endpoint(fake.url, can_stream=can_stream, wire=wire), settings)
        try:
            await h.submit(AGENT, PROMPT, task_id=TASK)
            yield Scene(h, fake, world, wire)
        finally:
            await h.close()


class AgentConformance:
    """What every model adapter must do in-process. Needs a ``case`` fixture giving an
    :class:`AdapterCase`; ``tmp_path`` is pytest's."""

    pytestmark = [pytest.mark.asyncio]

    async def test_r17_a_task_runs_to_the_end_with_each_call_answered_once(
            self, case: AdapterCase, tmp_path: Path) -> None:
        """R17 (the control every other test builds on): an answer with two calls, lookup
        then refund, runs both, each once; the model's next request answers each call once,
        the refund's with what the tool returned; two completions in all."""
        async with scene(case, tmp_path, [reply(tool_calls=[LOOKUP, REFUND]),
                                          reply("Refunded.")]) as s:
            info = await s.run()
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            assert info.snapshot.result == "Refunded."
            assert s.fake.completions == 2
            assert (s.shop.ledger.count("lookup"), s.shop.ledger.count("refund")) == (1, 1)
            results = tool_results(s.fake.requests[1])
            assert len(results) == 2 and results[-1] == refunded("A1", 5), results

    # ------------------------------------------------------------------ P0 (property 3)

    async def test_e1_r03_a_p0_cuts_a_streaming_answer_and_the_task_goes_on_after_resume(
            self, case: AdapterCase, tmp_path: Path) -> None:
        """E1, R3, R4, R15: a user_interrupt (P0) while the answer streams cuts it at once
        (the model hangs after its first chunk, so nothing but the P0 ends it); the task
        pauses with the text received so far in the dialog, marked cut off. Resumed, the
        next request shows that text as cut off before the person's words, and the task
        goes on: the refund is paid once and the task completes."""
        full = "Let me look at order A1 very carefully before I refund anything. " * 8
        script = [reply(full, chunks=40, hang=60), reply(tool_calls=[REFUND]),
                  reply("Refunded.")]
        async with scene(case, tmp_path, script) as s:
            worker = asyncio.create_task(s.run(timeout=60))
            try:
                await asyncio.wait_for(s.wire.text_read.wait(), 30)
            except TimeoutError:
                raise AssertionError("no streamed text reached the adapter's client: does the"
                                     " case stream, through endpoint.openai_client() or"
                                     " endpoint.http_client()?") from None
            await s.h.emit(tt.Event("user_interrupt", TASK, "stop, wrong customer"))
            info = await asyncio.wait_for(worker, 30)
            assert info.record.status is tt.Status.PAUSED, info.record.reason
            cut = [r for r in await s.h.history(TASK) if r.get("cut_off")]
            assert len(cut) == 1, cut
            partial = text_of(cut[0])
            assert partial and full.startswith(partial) and len(partial) < len(full), (partial, full)
            await s.h.resume(TASK, "go on")
            info = await s.run()
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            assert info.snapshot.result == "Refunded." and s.shop.ledger.count("refund") == 1
            assert s.fake.completions == 3
            shown = s.fake.requests[1]
            kept = index_of(shown, "assistant", partial)
            said = index_of(shown, "user", "go on")
            assert kept and "cut off" in text_of(shown["messages"][kept[0]]), shown
            assert said and kept[0] < said[0], shown

    # ------------------------------------------------------------------ P1 (property 4)

    async def test_r03_r04_a_message_between_answers_reaches_the_next_request(
            self, case: AdapterCase, tmp_path: Path) -> None:
        """R3, R4: a P1 user_message sent while the answer's last call runs is applied when
        the call returns: the next request holds the call's result, then the message;
        nothing was set aside."""
        script = [reply(tool_calls=[LOOKUP]), reply("A1 was paid 40; I will not refund it.")]
        async with scene(case, tmp_path, script) as s:
            s.shop.hold_lookups()

            async def user() -> None:
                await asyncio.wait_for(s.shop.looking.wait(), 30)
                await s.h.emit(tt.Event("user_message", TASK, STOP))
                s.shop.go_on.set()

            info, _ = await asyncio.gather(s.run(), user())
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            assert s.fake.completions == 2 and s.shop.ledger.count("lookup") == 1
            asked = s.fake.requests[1]
            said = index_of(asked, "user", STOP)
            answered = [i for i, m in enumerate(asked["messages"]) if m.get("role") == "tool"]
            assert said and len(answered) == 1 and answered[0] < said[0], asked
            assert not index_of(asked, "tool", NOT_RUN)
            assert "answer_set_aside" not in await strategies(s.h)

    async def test_r03_r04_a_message_between_the_calls_of_one_answer_reaches_the_model_first(
            self, case: AdapterCase, tmp_path: Path) -> None:
        """R3, R4, R17 ("an answer is the engine's"): the model answers lookup then refund; a
        P1 user_message sent while lookup runs reaches the model before the refund: the
        refund is answered "not run" (tether.engine.answers.NOT_RUN) before the message and
        never runs; the recovery log says answer_set_aside."""
        script = [reply(tool_calls=[LOOKUP, REFUND]), reply("OK, I will not refund A1.")]
        async with scene(case, tmp_path, script) as s:
            s.shop.hold_lookups()

            async def user() -> None:
                await asyncio.wait_for(s.shop.looking.wait(), 30)
                await s.h.emit(tt.Event("user_message", TASK, STOP))
                s.shop.go_on.set()

            info, _ = await asyncio.gather(s.run(), user())
            assert s.shop.ledger.count("refund") == 0, "the refund was paid after the stop"
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            assert s.fake.completions == 2 and s.shop.ledger.count("lookup") == 1
            asked = s.fake.requests[1]
            said, not_run = index_of(asked, "user", STOP), index_of(asked, "tool", NOT_RUN)
            assert said and len(not_run) == 1 and not_run[0] < said[0], asked
            assert len(tool_results(asked)) == 2, asked  # lookup's result, the refund's not-run
            assert "answer_set_aside" in await strategies(s.h)

    async def test_r03_r04_a_message_while_the_model_answers_sets_the_whole_answer_aside(
            self, case: AdapterCase, tmp_path: Path) -> None:
        """R3, R4, R17: a P1 user_message stored while the model is still answering (the
        fake holds its answer until the message is stored) is seen before any call of that
        answer: both calls are answered "not run" before the message, neither runs."""
        stored = threading.Event()

        def hold_first(body: dict[str, Any]) -> Reply | None:
            stored.wait(30)  # the first request; later ones find it set
            return None

        script = [reply(tool_calls=[LOOKUP, REFUND]), reply("OK, I will not refund A1.")]
        async with scene(case, tmp_path, script, route=hold_first) as s:
            async def user() -> None:
                await wait_until(lambda: s.fake.completions == 1, "the first request")
                await s.h.emit(tt.Event("user_message", TASK, STOP))
                stored.set()

            info, _ = await asyncio.gather(s.run(), user())
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            assert (s.shop.ledger.count("lookup"), s.shop.ledger.count("refund")) == (0, 0)
            assert s.fake.completions == 2
            asked = s.fake.requests[1]
            said, not_run = index_of(asked, "user", STOP), index_of(asked, "tool", NOT_RUN)
            assert said and len(not_run) == 2 and not_run[-1] < said[0], asked

    # ------------------------------------------------------------------ approvals (property 5)

    @pytest.mark.parametrize(("answer", "paid"), [
        (True, 1), ({"approved": False, "reason": "not that order"}, 0)],
        ids=["approved", "denied"])
    async def test_r26_a_call_that_needs_approval_waits_for_a_person(
            self, case: AdapterCase, tmp_path: Path, answer: Any, paid: int) -> None:
        """R26, R16: a refund that needs approval waits (the task is waiting, no worker
        holds it, nothing is paid) until an ``approval`` event comes; approved, it is paid
        once and the model gets its result; denied, it is not paid and the model is told,
        with the person's reason."""
        case.require("approvals")
        script = [reply(tool_calls=[REFUND]), reply("Done.")]
        async with scene(case, tmp_path, script, needs_approval=True) as s:
            info = await s.run()
            assert info.record.status is tt.Status.WAITING, info.record.reason
            assert s.shop.ledger.count("refund") == 0 and s.fake.completions == 1
            await s.h.emit(tt.Event("approval", TASK, answer))
            info = await s.run()
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            assert s.shop.ledger.count("refund") == paid and s.fake.completions == 2
            [result] = tool_results(s.fake.requests[1])
            assert (result == refunded("A1", 5)) if paid else ("not that order" in result), result

    async def test_r26_an_edited_approval_is_applied_as_edited_or_not_at_all(
            self, case: AdapterCase, tmp_path: Path) -> None:
        """R26, R10: a person approves the refund with edited arguments (1 dollar, not the
        5 the model asked). An adapter whose framework applies edits pays the edited call;
        one that cannot pays nothing and tells the model the call was not run. No adapter
        pays the call as the model asked it: that is not what the person approved."""
        case.require("approvals")
        script = [reply(tool_calls=[REFUND]), reply("Done.")]
        async with scene(case, tmp_path, script, needs_approval=True) as s:
            info = await s.run()
            assert info.record.status is tt.Status.WAITING, info.record.reason
            await s.h.emit(tt.Event("approval", TASK, {
                "approved": True, "args": {"order": "A1", "amount": 1}}))
            info = await s.run()
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            [result] = tool_results(s.fake.requests[1])
            paid = s.shop.ledger.count("refund")
            if paid:
                assert (paid, result) == (1, refunded("A1", 1)), result
            else:
                assert "not run" in result and "approved or rejected as it is" in result, result

    # ------------------------------------------------------------------ reconcile (property 6)

    @pytest.mark.parametrize("shape", ["none_never_happened", "a_plain_value_is_the_result"])
    async def test_r10_r17_what_a_reconcile_hook_returns_decides_the_call(
            self, case: AdapterCase, tmp_path: Path, shape: str) -> None:
        """R10, R17: a refund whose outcome is unknown (``OutcomeUnknown``) is never blindly
        repeated: its reconcile hook is asked. ``None`` means it never happened: it runs
        again under the same key, once, and the model gets the tool's result. A plain value
        means it happened: that value is the call's result, the model gets it as the
        refund's one tool result, and nothing runs again. Paid once either way."""
        lost = shape == "a_plain_value_is_the_result"
        script = [reply(tool_calls=[REFUND]), reply("Refunded.")]
        async with scene(case, tmp_path, script, answer_lost=lost,
                         lost_before_paying=not lost) as s:
            info = await s.run()
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            assert info.snapshot.result == "Refunded." and s.fake.completions == 2
            paid = s.shop.ledger.keys("refund")
            assert len(paid) == 1 and s.shop.ledger.keys("reconcile") == paid
            assert tool_results(s.fake.requests[1]) == [
                found("A1", 5) if lost else refunded("A1", 5)]
            log = await strategies(s.h)
            settled = "reconcile" if lost else "reconcile_not_done"
            assert log[:1] == ["outcome_unknown"] and settled in log, log

    # ------------------------------------------------------------------ loop bounds (property 7)

    async def test_r12_r26_a_model_that_loops_is_stopped_at_max_completions(
            self, case: AdapterCase, tmp_path: Path) -> None:
        """R12, R22, R26: a model that asks for another lookup every turn is stopped at
        ``Settings.max_completions`` (3): exactly 3 completions are paid, and the task goes
        to a person with the bound named (completion_limit in the recovery log). The
        person's plain resume grants 3 more, and the loop is stopped again."""
        asked: list[int] = []

        def again(body: dict[str, Any]) -> Reply:
            asked.append(1)
            n = len(asked)
            return reply(tool_calls=[call("lookup", {"order": f"A{n}"}, f"c_lookup{n}")])

        async with scene(case, tmp_path, [], route=again,
                         settings=FAST.replace(max_completions=3)) as s:
            info = await s.run()
            assert info.record.status is tt.Status.NEEDS_HUMAN, info.record.reason
            assert "max_completions=3" in (info.record.reason or ""), info.record.reason
            assert s.fake.completions == 3 and s.shop.ledger.count("lookup") == 3
            assert "completion_limit" in await strategies(s.h)
            await s.h.resume(TASK)  # the person grants the same budget again
            info = await s.run()
            assert info.record.status is tt.Status.NEEDS_HUMAN, info.record.reason
            assert s.fake.completions == 6 and s.shop.ledger.count("lookup") == 6

    async def test_r12_r22_r26_the_same_refund_asked_again_is_held_for_a_person(
            self, case: AdapterCase, tmp_path: Path) -> None:
        """R12, R22, R26: a model asking for the same refund every turn, under a new call id
        each time, is stopped by ``Settings.max_identical_side_effects`` (2): two are paid,
        the third is held before it runs and the task goes to a person
        (repeated_side_effect in the recovery log); a framework's call id is not part of
        what the call does. (What a person's answers do next is the engine's, the same for
        every adapter: tests/acceptance/test_r10_r12_*.)"""
        asked: list[int] = []

        def again(body: dict[str, Any]) -> Reply:
            asked.append(1)
            return reply(tool_calls=[call("refund", {"order": "A1", "amount": 5},
                                          f"c_refund{len(asked)}")])

        async with scene(case, tmp_path, [], route=again,
                         settings=FAST.replace(max_identical_side_effects=2)) as s:
            info = await s.run()
            assert info.record.status is tt.Status.NEEDS_HUMAN, info.record.reason
            assert "max_identical_side_effects=2" in (info.record.reason or ""), \
                info.record.reason
            assert s.shop.ledger.count("refund") == 2 and s.fake.completions == 3
            assert "repeated_side_effect" in await strategies(s.h)

    # ------------------------------------------------------------------ usage (property 8)

    async def test_r12_token_usage_is_recorded_from_the_model(
            self, case: AdapterCase, tmp_path: Path) -> None:
        """R12, R23: every completion's usage, as the model reported it, is in the task's
        totals (``snapshot.usage``) and in a ``model`` row of the dialog each."""
        script = [reply(tool_calls=[LOOKUP], usage={"prompt_tokens": 12,
                                                    "completion_tokens": 4, "total_tokens": 16}),
                  reply("A1 was paid 40.", usage={"prompt_tokens": 20, "completion_tokens": 6,
                                                  "total_tokens": 26})]
        async with scene(case, tmp_path, script) as s:
            info = await s.run()
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            assert info.snapshot.usage == {"completions": 2, "prompt_tokens": 32,
                                           "completion_tokens": 10}
            rows = [r for r in await s.h.history(TASK) if r.get("role") == "model"]
            assert len(rows) == 2, rows

    # ------------------------------------------------------------------ no streaming (property 9)

    async def test_r17_a_model_that_cannot_stream_works_without_options(
            self, case: AdapterCase, tmp_path: Path) -> None:
        """R17, R22: a model that cannot stream (the fake refuses streamed requests with
        HTTP 400, as OpenAI did for models without streaming) runs a task under the adapter
        built as a user writes it, with no streaming option: the adapter knows it from the
        framework's model, or learns it from the first refusal (at most one streamed request,
        asked again at once plainly); no recovery is spent, the task completes."""
        case.require("unstreamed")
        script = [reply(tool_calls=[LOOKUP]), reply("A1 was paid 40.")]
        async with scene(case, tmp_path, script, route=refuse_streams, can_stream=False) as s:
            info = await s.run()
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            assert info.snapshot.result == "A1 was paid 40."
            streamed = [bool(r.get("stream")) for r in s.fake.requests]
            assert streamed in ([False, False], [True, False, False]), streamed
            assert await strategies(s.h) == []

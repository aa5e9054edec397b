"""ChatAgent against a real model server that nobody here wrote (R1, R10, R12, E1; issue 16).

llama.cpp's ``llama-server`` with the 135M SmolLM2 model (``server.py``), behind a proxy
that counts completions on the wire (``proxy.py``): a completion paid for and then lost in
a crash shows up there and nowhere else. The tests check what does not depend on the
model's choices: completions and side effects after kills equal an uninterrupted run's,
a P0 cuts a real stream, finish reasons and a real context overflow are handled, and the
usage recorded is the server's.

The kill tests run this file as a script in a child process (a worker), SIGKILLed at a
named failpoint: ``python test_real_model.py DB LEDGER BASE_URL``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tether as tt
from tether.agents import ChatAgent, RequestOptions

sys.path.insert(0, str(Path(__file__).parents[1]))  # the child runs this file as a script
sys.path.insert(0, str(Path(__file__).parent))

from proxy import CountingProxy
from server import MODEL, SYSTEM_PROMPT, USER_PROMPT, RealServer, running_server

from killed_chat import KILLED, paid, refund_tool, run_child, wait_out_dead_lease

LEASE = 0.5


def build(db: str, ledger: str, base_url: str, **agent: Any) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}", settings=tt.Settings(lease_seconds=LEASE,
                                                           poll_interval=0.02))

    agent.setdefault("tools", [refund_tool(h, ledger)])
    agent.setdefault("system", SYSTEM_PROMPT)
    h.add_agent("chat", ChatAgent(MODEL, base_url=base_url, api_key="none", context_tokens=4096,
                                  **agent))
    return h


def child(db: str, ledger: str, base_url: str) -> int:
    async def go() -> None:
        async with build(db, ledger, base_url) as h:
            await h.run_until_idle(timeout=120)

    asyncio.run(go())
    return 0


def worker(tmp: Path, base_url: str, failpoints: str | None) -> int:
    return run_child(__file__, [str(tmp / "t.db"), str(tmp / "ledger.db"), base_url],
                     failpoints, timeout=300)


@pytest.fixture
def proxy(real_model: RealServer) -> Iterator[CountingProxy]:
    with CountingProxy(real_model.base_url) as counting:
        yield counting


async def submit(tmp: Path, url: str, text: str = USER_PROMPT) -> None:
    async with build(str(tmp / "t.db"), str(tmp / "ledger.db"), url) as h:
        await h.submit("chat", text, task_id="t1")


async def outcome(tmp: Path, url: str) -> tuple[tt.TaskInfo, list[dict[str, Any]]]:
    async with build(str(tmp / "t.db"), str(tmp / "ledger.db"), url) as h:
        return await h.get("t1"), await h.history("t1")


@pytest.fixture(scope="module")
def uninterrupted(real_model: RealServer, tmp_path_factory: pytest.TempPathFactory,
                  figures: dict[str, Any]) -> dict[str, Any]:
    """One run with no kill: what every killed run must match."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    with CountingProxy(real_model.base_url) as counting:
        asyncio.run(submit(tmp, counting.url))
        assert worker(tmp, counting.url, None) == 0
        info, history = asyncio.run(outcome(tmp, counting.url))
    figures["completions_uninterrupted"] = counting.completions
    return {"completions": counting.completions, "paid": paid(tmp / "ledger.db"), "info": info,
            "history": history}


def test_r01_an_uninterrupted_run_calls_the_tool_once_and_records_real_usage(
        uninterrupted: dict[str, Any]) -> None:
    info: tt.TaskInfo = uninterrupted["info"]
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert uninterrupted["paid"] == 1 and uninterrupted["completions"] == 2
    rows = [r for r in uninterrupted["history"] if r.get("role") == "model"]
    assert [r["finish_reason"] for r in rows] == ["tool_calls", "stop"]
    assert all(r["usage"]["prompt_tokens"] > 100 and r["usage"]["completion_tokens"] > 0
               for r in rows)
    assert info.snapshot.usage["prompt_tokens"] == sum(r["usage"]["prompt_tokens"] for r in rows)


@pytest.mark.parametrize("point", ["after_checkpoint@1", "after_resume_point@1",
                                   "after_tool_before_commit@1", "before_plan_recorded@2"])
def test_r10_a_killed_worker_costs_no_extra_completion_and_no_second_refund(
        tmp_path: Path, proxy: CountingProxy, uninterrupted: dict[str, Any], point: str,
        figures: dict[str, Any]) -> None:
    asyncio.run(submit(tmp_path, proxy.url))
    assert worker(tmp_path, proxy.url, point) == KILLED
    wait_out_dead_lease(tmp_path / "t.db")
    assert worker(tmp_path, proxy.url, None) == 0
    info, _ = asyncio.run(outcome(tmp_path, proxy.url))
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert proxy.completions == uninterrupted["completions"]
    assert paid(tmp_path / "ledger.db") == uninterrupted["paid"] == 1
    figures.setdefault("completions_killed_at", {})[point] = proxy.completions


async def test_e1_a_p0_cuts_a_real_stream(tmp_path: Path, proxy: CountingProxy,
                                          figures: dict[str, Any]) -> None:
    """A long answer streams from the real model; a P0 sent once ten pieces of text have
    been relayed cuts it at once (the model would take seconds more: max_tokens=1000 at
    ~20 ms a token). The cut is in the dialog; no finished completion is recorded. (What
    text the client had parsed at the cut depends on timing, so it is reported, not
    asserted; the fake server's test asserts it, chunk by chunk.)"""
    h = build(str(tmp_path / "t.db"), str(tmp_path / "ledger.db"), proxy.url, tools=[],
              options=RequestOptions(max_tokens=1000))
    latencies, kept = [], []
    async with h:
        for _ in range(5):
            relayed = proxy.words
            tid = await h.submit("chat", "Write a very long story about a lighthouse keeper.")
            worker = asyncio.create_task(h.run_until_idle(timeout=120))
            while proxy.words < relayed + 10:
                await asyncio.sleep(0.005)
            emitted = time.perf_counter()
            await h.emit(tt.Event("user_interrupt", tid, "stop"))
            while (await h.store.get_task(tid)).status is not tt.Status.PAUSED:
                await asyncio.sleep(0.001)
            latencies.append(time.perf_counter() - emitted)
            await worker
            history = await h.history(tid)
            cut = [r for r in history if r.get("cut_off")]
            assert len(cut) == 1 and not [r for r in history if r.get("role") == "model"]
            kept.append(len(cut[0]["content"]))
    figures["p0_cut_ms"] = {"median": round(statistics.median(latencies) * 1000, 1),
                            "max": round(max(latencies) * 1000, 1), "characters_kept": kept}


def test_r12_an_answer_cut_at_max_tokens_is_not_final(tmp_path: Path,
                                                      proxy: CountingProxy) -> None:
    async def go() -> tuple[tt.TaskInfo, list[dict[str, Any]]]:
        async with build(str(tmp_path / "t.db"), str(tmp_path / "l.db"), proxy.url,
                         options=RequestOptions(max_tokens=3)) as h:
            await h.submit("chat", USER_PROMPT, task_id="t1")
            await h.run_until_idle(timeout=120)
            return await h.get("t1"), await h.history("t1")

    info, history = asyncio.run(go())
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "cut at the token limit (max_tokens=3)" in (info.record.reason or "")
    rows = [r for r in history if r.get("role") == "model"]
    assert rows and all(r["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 3
                        for r in rows)
    assert not [r for r in history if "tool_call" in r]  # no tool ran


def test_r08_a_prompt_over_the_real_context_is_shrunk_and_asked_again(
        tmp_path: Path, real_model: RealServer) -> None:
    """A server with a 512-token context; the agent believes in 4,096 until the server's
    error says 512 (exceed_context_size_error); it clips the input and asks again."""
    text = "Here is the order history. " + "Order B-7 was paid on time. " * 400

    async def go(url: str) -> tuple[tt.TaskInfo, list[dict[str, Any]], list[dict[str, Any]]]:
        async with build(str(tmp_path / "t.db"), str(tmp_path / "l.db"), url, tools=[],
                         system="You are helpful.", options=RequestOptions(max_tokens=20)) as h:
            await h.submit("chat", text, task_id="t1")
            await h.run_until_idle(timeout=120)
            return await h.get("t1"), await h.history("t1"), await h.reads.recovery_log("t1")

    with running_server(ctx_size=512) as small, CountingProxy(small.base_url) as counting:
        info, history, log = asyncio.run(go(counting.url))
    assert counting.statuses[0] == 400 and counting.statuses[1] == 200
    rows = [r for r in history if r.get("role") == "model"]
    assert rows and rows[0]["usage"]["prompt_tokens"] < 512
    assert not [r for r in log if "context" in r.get("detail", "")], log
    if info.record.status is not tt.Status.COMPLETED:  # the 20-token answer may be cut
        assert "token limit" in (info.record.reason or ""), info.record.reason


if __name__ == "__main__":
    sys.exit(child(*sys.argv[1:4]))

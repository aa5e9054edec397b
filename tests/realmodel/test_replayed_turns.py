"""A broken tool call, replayed to a real llama-server, does not break the task (R12, R22, R26).

The defect this guards: one call of an answer had arguments that were not JSON; tether told
the model, but replayed the arguments as they came, and llama-server answers HTTP 500
("Failed to parse tool call arguments as JSON") to any prompt holding such a call: nine
completions, then a person. Here a proxy (``corrupting_proxy.py``) adds a broken copy of the
real model's first tool call on the wire (or breaks that call itself). The checks do not
depend on what the model says: the server refuses no request, the valid call runs once, and
the task completes. The control puts the old replay back and shows the real server refusing
it, which is what ``FakeOpenAI(parse_arguments=True)`` imitates for the tests without a model.

Timeouts are generous (a request may take ten minutes, a run fifteen): on a loaded machine
one completion of this 135M model has taken 90 s; nothing here waits for a fixed time.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

import tether as tt
from tether.agents import ChatAgent, RequestOptions, RetryPolicy, prompt

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parent))

from corrupting_proxy import CorruptingProxy
from server import MODEL, SYSTEM_PROMPT, USER_PROMPT, RealServer

from killed_chat import paid, refund_tool

BROKEN = "Failed to parse tool call arguments as JSON"
"""What llama-server answers (HTTP 500) to a prompt replaying arguments that are not JSON."""


async def attempt(tmp: Path, url: str, **agent: Any
                  ) -> tuple[tt.TaskInfo, list[dict[str, Any]], list[dict[str, Any]]]:
    """Submit the refund request and run it until idle, in this process."""
    h = tt.Harness(f"sqlite:///{tmp / 't.db'}", settings=tt.Settings(
        poll_interval=0.02, recovery_backoff=0.01))
    agent.setdefault("timeout", 600.0)
    h.add_agent("chat", ChatAgent(MODEL, base_url=url, api_key="none", context_tokens=4096,
                                  tools=[refund_tool(h, str(tmp / "ledger.db"))],
                                  system=SYSTEM_PROMPT, **agent))
    async with h:
        await h.submit("chat", USER_PROMPT, task_id="t1")
        await h.run_until_idle(timeout=900)
        return await h.get("t1"), await h.history("t1"), await h.reads.recovery_log("t1")


def rejected_arguments(history: list[dict[str, Any]]) -> list[str]:
    return [call["arguments"] for row in history for call in row.get("rejected") or []]


@pytest.mark.parametrize("stream", [True, False])
def test_r22_a_broken_call_beside_a_valid_one_is_told_and_no_request_is_refused(
        tmp_path: Path, real_model: RealServer, stream: bool, figures: dict[str, Any]) -> None:
    """The field case: the valid refund runs once, the broken copy is told back to the model
    (replayed as ``{}``), and every later request is accepted."""
    with CorruptingProxy(real_model.base_url) as proxy:
        info, history, log = asyncio.run(attempt(tmp_path, proxy.url, stream=stream))
    [broken] = proxy.corrupted
    assert proxy.completions >= 2 and set(proxy.statuses) == {200}, proxy.errors
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert rejected_arguments(history) == [broken["broken"]]  # kept as it came
    assert paid(tmp_path / "ledger.db") == 1
    assert log == []
    figures.setdefault("broken_call", {})["stream" if stream else "json"] = {
        "completions": proxy.completions, "result": str(info.snapshot.result)[:80]}


def test_r22_a_lone_broken_call_is_asked_again_and_no_request_is_refused(
        tmp_path: Path, real_model: RealServer, figures: dict[str, Any]) -> None:
    """The model's only call broken: it is asked again at once with the call replayed as
    ``{}``, and the server takes that prompt. What the 135M model answers to the error is
    its own affair (it rambles to the token limit, which sends the task to a person named
    for max_tokens); no request is refused either way."""
    with CorruptingProxy(real_model.base_url, keep_valid=False) as proxy:
        info, history, _ = asyncio.run(attempt(tmp_path, proxy.url,
                                               options=RequestOptions(max_tokens=64)))
    [broken] = proxy.corrupted
    assert proxy.completions >= 2 and set(proxy.statuses) == {200}, proxy.errors
    assert rejected_arguments(history)[0] == broken["broken"]
    assert BROKEN not in (info.record.reason or "") and "HTTP 500" not in (info.record.reason or "")
    figures.setdefault("broken_call", {})["lone"] = {
        "completions": proxy.completions, "status": info.record.status.value}


def test_r22_control_the_real_server_refuses_the_old_replay(
        tmp_path: Path, real_model: RealServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the arguments replayed as they came (the old ``clip`` of the raw text), the
    real server answers the next request with HTTP 500, as it did in the field."""
    monkeypatch.setattr(prompt, "arguments", lambda value, limit: prompt.clip(
        value if isinstance(value, str) else prompt.text(value), limit))
    with CorruptingProxy(real_model.base_url) as proxy:
        info, _, _ = asyncio.run(attempt(tmp_path, proxy.url, stream=False,
                                         retry=RetryPolicy(attempts=1)))
    assert proxy.corrupted and proxy.statuses[0] == 200 and 500 in proxy.statuses
    assert BROKEN in proxy.errors[0], proxy.errors
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert BROKEN in (info.record.reason or "")

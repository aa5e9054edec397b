"""A LangChain agent under tether against the real llama-server (R1, R10, R12, R22; issue 28).

The same 135M model and prompts as the ChatAgent tier, asked through ``langchain-openai``'s
``ChatOpenAI`` by a ``create_agent`` agent under ``LangChainAgent``. The checks do not depend
on what the model says beyond its first call: the server refuses no request, the refund is
paid once, the usage recorded is the server's; and a broken copy of the model's call, added
on the wire (``corrupting_proxy.py``), is told back to the model and replayed as ``{}``, so
llama-server, which answers HTTP 500 to a replayed call whose arguments are not JSON, takes
every later request.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

import tether as tt

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parent))

from corrupting_proxy import CorruptingProxy
from proxy import CountingProxy
from server import MODEL, SYSTEM_PROMPT, USER_PROMPT, RealServer

from killed_chat import ledger_db, paid


async def attempt(tmp: Path, url: str, stream: bool) -> tuple[tt.TaskInfo, list[dict[str, Any]]]:
    """The refund request, run to the end in this process by a LangChain agent."""
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from tether.integrations.langchain import LangChainAgent, current_call

    @tool
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        with ledger_db(str(tmp / "ledger.db")) as conn:
            conn.execute("INSERT INTO paid VALUES (?, ?)", (current_call().idempotency_key, order))
        return f"refunded {amount} dollars on order {order}"

    model = ChatOpenAI(model=MODEL, base_url=url, api_key="none", temperature=0,  # type: ignore[arg-type]
                       max_retries=0, timeout=600, disable_streaming=not stream,
                       stream_usage=True, max_tokens=256)  # type: ignore[call-arg]
    h = tt.Harness(f"sqlite:///{tmp / 't.db'}", settings=tt.Settings(
        poll_interval=0.02, recovery_backoff=0.01))
    h.add_agent("chat", LangChainAgent(create_agent(model, tools=[refund],
                                                    system_prompt=SYSTEM_PROMPT)))
    async with h:
        await h.submit("chat", USER_PROMPT, task_id="t1")
        await h.run_until_idle(timeout=900)
        return await h.get("t1"), await h.history("t1")


@pytest.mark.parametrize("stream", [True, False])
def test_r01_r12_a_langchain_agent_pays_once_and_records_the_servers_usage(
        tmp_path: Path, real_model: RealServer, stream: bool, figures: dict[str, Any]) -> None:
    with CountingProxy(real_model.base_url) as proxy:
        info, history = asyncio.run(attempt(tmp_path, proxy.url, stream))
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert paid(tmp_path / "ledger.db") == 1
    rows = [r for r in history if r.get("role") == "model"]
    assert len(rows) == proxy.completions >= 2
    assert all(r["usage"]["prompt_tokens"] > 100 and r["usage"]["completion_tokens"] > 0
               for r in rows), rows
    figures.setdefault("langchain", {})["stream" if stream else "json"] = {
        "completions": proxy.completions, "result": str(info.snapshot.result)[:80]}


def test_r22_a_broken_call_beside_a_valid_one_is_told_and_no_request_is_refused(
        tmp_path: Path, real_model: RealServer) -> None:
    with CorruptingProxy(real_model.base_url) as proxy:
        info, history = asyncio.run(attempt(tmp_path, proxy.url, stream=False))
    [broken] = proxy.corrupted
    assert proxy.completions >= 2 and set(proxy.statuses) == {200}, proxy.errors
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert paid(tmp_path / "ledger.db") == 1
    told = [m for r in history if r.get("role") == "model" for m in r.get("messages") or []
            if m.get("type") == "tool" and "not a JSON object" in str(m["data"]["content"])]
    assert len(told) == 1 and broken["broken"][:20] in str(told[0]["data"]["content"])

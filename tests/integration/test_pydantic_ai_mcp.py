"""An MCP server attached to a PydanticAI agent is called through tether (issue 17).

The server is the real MCP server of ``_mcp_server.py`` over stdio, attached to the agent
with PydanticAI's own ``MCPToolset``; the model is PydanticAI's ``FunctionModel``. Its
calls are tether calls: each under its own key, which reaches the server in ``_meta`` (the
server records refunds under it).
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("mcp")

from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import tether as tt
from tether.integrations.pydantic_ai import PydanticAIAgent

SERVER = Path(__file__).with_name("_mcp_server.py")


def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Refund through the MCP server's tool, then report what it said."""
    returned = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart(f"done: {returned[0].content}")])
    assert "refund" in {t.name for t in info.function_tools}, info.function_tools
    return ModelResponse(parts=[ToolCallPart("refund", {"order": "A1", "cents": 500},
                                             tool_call_id="m1")])


async def test_r10_an_mcp_toolset_on_the_agent_is_called_through_tether(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    transport = StdioTransport(command=sys.executable, args=[str(SERVER)],
                               env={"MCP_LEDGER": str(ledger),
                                    "MCP_PIDFILE": str(tmp_path / "pid")})
    agent: Agent[None, str] = Agent(FunctionModel(answer), toolsets=[MCPToolset(transport)])
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}", settings=tt.Settings(poll_interval=0.01))
    h.add_agent("support", PydanticAIAgent(agent, stream=False))
    assert h.tools["support.toolsets"].side_effect  # the safe default for unknown tools
    tid = await h.submit("support", "Refund A1")
    await h.run_until_idle(timeout=60)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    [record] = await h.store.list_idempotency(tid)
    assert record.tool == "support.toolsets" and record.status == "succeeded"
    with sqlite3.connect(ledger) as conn:
        keys = [row[0] for row in conn.execute("SELECT key FROM refunds")]
    assert keys == [record.key]  # one refund, under tether's key, sent in _meta
    assert "done:" in str(info.snapshot.result)
    await h.close()


def test_r17_other_toolsets_take_the_policy_given() -> None:
    agent: Agent[None, str] = Agent(FunctionModel(answer),
                                    toolsets=[MCPToolset(StdioTransport(command="true", args=[]))])
    h = tt.Harness()
    h.add_agent("a", PydanticAIAgent(agent, other_tools=tt.ToolPolicy(idempotent=True)))
    tool: Any = h.tools["a.toolsets"]
    assert tool.idempotent and not tool.side_effect

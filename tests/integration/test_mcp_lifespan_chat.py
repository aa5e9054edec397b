"""``ChatAgent(tools=mcp.registered)`` made before ``@harness.lifespan`` enters the MCP
session offers the server's tools, as registered when it plans (R1, R10, R17).

No mocks: the MCP server is ``tests/integration/_mcp_server.py`` in a child process over
stdio (a SQLite ledger of refunds), the model is ``tether.testing.fake_openai`` on loopback
(a real HTTP server the real ``openai`` client talks to). The agent is made, with the
``MCPTools``'s list, before any lifespan is entered, as an app module does it; the tools
come when a worker enters the lifespan: ``run_until_idle`` in this process, and a real
``tether worker`` process with this module as its app (``--app
test_mcp_lifespan_chat:harness``).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import tether as tt

pytest.importorskip("mcp")
pytest.importorskip("openai")

from tether.agents import ChatAgent
from tether.integrations.mcp import MCPTools
from tether.testing.fake_openai import FakeOpenAI, call, reply

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).resolve().parent
SERVER = HERE / "_mcp_server.py"
DEADLINE = 60.0
TOOLS = {"pay_refund", "pay_read_balance"}


def harness(url: str) -> tt.Harness:
    """The app: a ChatAgent made with the MCP tools' list, the MCP session in a lifespan
    (the factory ``--app test_mcp_lifespan_chat:harness`` names; ``MCP_DIR`` is where the
    server keeps its ledger and pid, ``OPENAI_BASE_URL`` the model)."""
    folder = Path(os.environ["MCP_DIR"])
    h = tt.Harness(url, settings=tt.Settings(poll_interval=0.02, housekeeping_interval=3600.0))
    env = {"MCP_LEDGER": str(folder / "ledger.db"), "MCP_PIDFILE": str(folder / "mcp.pid")}
    payments = MCPTools.stdio(h, sys.executable, [str(SERVER)], env=env, prefix="pay_",
                              only=("refund", "read_balance"))
    h.add_agent("clerk", ChatAgent("fake", tools=payments.registered, stream=False))

    @h.lifespan
    async def mcp_tools(h: tt.Harness) -> AsyncIterator[None]:
        async with payments:
            yield

    return h


def refunds(folder: Path) -> list[tuple[str, str, int]]:
    with sqlite3.connect(f"file:{folder / 'ledger.db'}?mode=ro", uri=True, timeout=30) as db:
        return db.execute("SELECT key, order_id, cents FROM refunds ORDER BY id").fetchall()


def offered(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The tools a request offered the model, by name, with their parameters."""
    return {t["function"]["name"]: t["function"]["parameters"] for t in body.get("tools", [])}


def tool_answers(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def refund_script(order: str) -> list[Any]:
    return [reply(tool_calls=[call("pay_refund", {"order": order, "cents": 250})]),
            reply(f"Refunded 2.50 EUR on {order}.")]


async def test_r17_the_agent_offers_the_tools_the_lifespan_registered_each_time_it_enters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R17: the agent, made before the lifespan, offers nothing while it is not entered,
    offers the server's tools (with the server's schemas) and makes the model's call while
    it is, and after a second entry (a new server process, new tool objects) offers the new
    tools, never the first entry's; the refund reaches the server once, with its key."""
    monkeypatch.setenv("MCP_DIR", str(tmp_path))
    with FakeOpenAI(refund_script("A1") + refund_script("A2")) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.url)
        monkeypatch.setenv("OPENAI_API_KEY", "none")
        h = harness(f"sqlite:///{tmp_path / 'tether.db'}")
        agent = h.agents["clerk"]
        assert isinstance(agent, ChatAgent)
        assert agent.tools == {} and agent.schemas == []  # nothing entered yet
        seen: list[dict[str, tt.Tool]] = []
        for order in ("A1", "A2"):
            task = await h.submit("clerk", f"Order {order} arrived broken; refund 2.50 EUR.")
            async with h.lifespan_context():  # what run_until_idle inside it shares
                assert set(agent.tools) == TOOLS
                assert all(agent.tools[name] is h.tools[name] for name in TOOLS)
                seen.append(dict(agent.tools))
                await h.run_until_idle(timeout=DEADLINE)
            assert agent.tools == {}  # left: the server's tools are offered no more
            info = await h.get(task)
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            assert info.snapshot.result == f"Refunded 2.50 EUR on {order}."
        await h.close()
        asked, answered = fake.requests[0], fake.requests[1]
        assert offered(asked).keys() == TOOLS
        assert offered(asked)["pay_refund"]["required"] == ["order", "cents"]
        assert offered(fake.requests[2]).keys() == TOOLS
        [result] = tool_answers(answered)
        assert '"order":"A1"' in result.replace(" ", "") and "no tool named" not in result
        assert all(seen[0][name] is not seen[1][name] for name in TOOLS)  # a new entry, new tools
    ledger = refunds(tmp_path)
    assert [(order, cents) for _, order, cents in ledger] == [("A1", 250), ("A2", 250)]
    assert all(key for key, _, _ in ledger) and ledger[0][0] != ledger[1][0]


def test_r17_under_tether_worker_the_agent_calls_the_tools_its_lifespan_registered(
        tmp_path: Path) -> None:
    """R17: a real ``tether worker --until-idle`` process, this module as its app: the
    agent made at import, before the worker entered the lifespan, offers the MCP tools and
    the model's refund reaches the server, with the call's idempotency key."""
    store = f"sqlite:///{tmp_path / 'tether.db'}"
    path = os.environ.get("PYTHONPATH")
    with FakeOpenAI(refund_script("B7")) as fake:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("TETHER_")},
               "MCP_DIR": str(tmp_path), "OPENAI_BASE_URL": fake.url, "OPENAI_API_KEY": "none",
               "PYTHONPATH": str(HERE) + (os.pathsep + path if path else "")}

        def tether(*args: str) -> str:
            done = subprocess.run([sys.executable, "-m", "tether", "--store", store, "--app",
                                   f"{Path(__file__).stem}:harness", *args], env=env,
                                  cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE)
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout

        task = tether("submit", "clerk", "--input", '"Refund 2.50 EUR on B7."').strip()
        tether("worker", "--until-idle")
        assert offered(fake.requests[0]).keys() == TOOLS
        assert "no tool named" not in tool_answers(fake.requests[1])[0]
    shown = tether("show", task)
    assert "completed" in shown, shown
    [(key, order, cents)] = refunds(tmp_path)
    assert (order, cents) == ("B7", 250)
    history = tether("history", task, "--json")
    assert key in history  # the key the server was sent is the call's own

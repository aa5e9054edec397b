"""MCP tools as tether tools, against a real MCP server process (tests/integration/_mcp_server.py).

No mocks: the server is the mcp SDK's MCPServer in a child process, over stdio or
streamable HTTP, with a SQLite ledger of refunds; tether runs tasks on a SQLite store. A
server is killed with SIGKILL, by its pid, at the moment its refund is in the ledger and
its answer is not yet sent: the refund must never be paid twice.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pytest

import tether as tt

pytest.importorskip("mcp")

from tether.integrations.mcp import META_KEY, MCPDisconnected, MCPTools

pytestmark = pytest.mark.timeout(120)

SERVER = Path(__file__).with_name("_mcp_server.py")
DEADLINE = 30.0


# ---------------------------------------------------------------------- the server


@dataclass
class Server:
    """Where one test's MCP server keeps its ledger and its pid."""

    ledger: Path
    pidfile: Path
    errlog: TextIO

    @property
    def env(self) -> dict[str, str]:
        return {"MCP_LEDGER": str(self.ledger), "MCP_PIDFILE": str(self.pidfile)}

    def stdio(self, harness: tt.Harness, **options: Any) -> MCPTools:
        return MCPTools.stdio(harness, sys.executable, [str(SERVER)], env=self.env,
                              errlog=self.errlog, **options)

    def refunds(self, order: str | None = None) -> list[tuple[str | None, str, int]]:
        """(key, order, cents) of every refund in the ledger, oldest first."""
        try:
            with sqlite3.connect(f"file:{self.ledger}?mode=ro", uri=True, timeout=30) as db:
                rows = db.execute("SELECT key, order_id, cents FROM refunds ORDER BY id").fetchall()
        except sqlite3.OperationalError as error:  # the server has not made the ledger yet
            if self.ledger.exists() and "no such table" not in str(error):
                raise
            return []
        return [row for row in rows if order is None or row[1] == order]

    def find(self, key: str) -> dict[str, Any] | None:
        """The ledger's refund under *key*: what a reconcile hook asks the provider."""
        with sqlite3.connect(self.ledger, timeout=30) as db:
            row = db.execute("SELECT id, order_id, cents FROM refunds WHERE key = ?",
                             (key,)).fetchone()
        return None if row is None else {"refund_id": row[0], "order": row[1], "cents": row[2],
                                         "key": key, "duplicate": False}

    async def find_refund(self, ctx: tt.ToolContext, order: str,
                          cents: int) -> dict[str, Any] | None:
        """A reconcile hook: the provider is asked for the call's key."""
        return self.find(ctx.idempotency_key)

    def pid(self) -> int:
        return int(self.pidfile.read_text())

    def kill(self) -> int:
        pid = self.pid()
        os.kill(pid, signal.SIGKILL)
        return pid


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with open(tmp_path / "server.log", "w") as errlog:
        yield Server(tmp_path / "ledger.db", tmp_path / "server.pid", errlog)


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[tt.Harness]:
    async with tt.Harness(f"sqlite:///{tmp_path / 'tether.db'}",
                          settings=tt.Settings(poll_interval=0.01)) as h:
        h.add_agent("script", Script())
        yield h


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait for *condition*, checking often, failing after DEADLINE seconds."""
    end = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        await asyncio.sleep(0.02)


async def kill_after_refund(server: Server, order: str) -> int:
    """SIGKILL the server once *order*'s refund is in the ledger (the answer is not sent:
    slow_refund hangs after paying). Returns the killed pid."""
    await until(lambda: bool(server.refunds(order)), f"the refund of {order}")
    return server.kill()


# ---------------------------------------------------------------------- the agent


class Script(tt.Agent):
    """Makes the calls listed in the task's input, one by one, and finishes with what each
    returned (or the error the agent was told)."""

    async def plan(self, task: tt.TaskView) -> tt.Action:
        calls: list[list[Any]] = task.input["calls"]
        i = task.scratch.get("i", 0)
        if i == len(calls):
            return tt.Finish([row["content"] if "content" in row else {"error": row["error"]}
                              for row in task.history if row.get("role") == "tool"])
        task.scratch["i"] = i + 1
        return tt.ToolCall(calls[i][0], calls[i][1])

    async def on_event(self, task: tt.TaskView, event: tt.Event) -> tt.Action | None:
        if event.type == "tool_error":
            task.scratch.setdefault("attempts", []).append(event.payload["attempts"])
            return tt.Replan()  # told; carry on with the next call
        return None


async def run(harness: tt.Harness, *calls: tuple[str, dict[str, Any]],
              alongside: Awaitable[Any] | None = None) -> tuple[tt.TaskInfo, list[dict[str, Any]]]:
    """Run a Script task to rest (with *alongside*, a coroutine, at the same time)."""
    task_id = await harness.submit("script", {"calls": [list(call) for call in calls]})
    work = [harness.run_until_idle(timeout=DEADLINE)] + ([alongside] if alongside else [])
    await asyncio.gather(*work)
    return await harness.get(task_id), await harness.history(task_id)


async def strategies(harness: tt.Harness, info: tt.TaskInfo) -> list[str]:
    """How tether handled the task's interruptions, in order (its recovery log)."""
    return [r["resume_strategy"] for r in await harness.reads.recovery_log(info.record.task_id)]


def keys_of(history: list[dict[str, Any]], tool: str) -> list[str]:
    return [row["tool_call"]["key"] for row in history
            if "tool_call" in row and row["tool_call"]["name"] == tool]


# ---------------------------------------------------------------------- registration


async def test_tools_are_registered_with_flags_from_their_annotations(
        harness: tt.Harness, server: Server) -> None:
    """readOnlyHint and idempotentHint make a tool idempotent; destructiveHint, and no
    annotations at all, make it a side effect; an override wins; hooks are attached; the
    schemas are the server's; leaving the block unregisters everything."""

    async def hook(ctx: tt.ToolContext, order: str, cents: int) -> dict[str, Any] | None:
        return None

    async with server.stdio(harness, prefix="pay_", reconcile={"refund": hook},
                            overrides={"logo": tt.ToolPolicy(side_effect=True, timeout=7)}) as tools:
        flags = {tool.name: (tool.side_effect, tool.idempotent) for tool in tools.registered}
        assert flags == {
            "pay_read_balance": (False, True), "pay_set_flag": (False, True),
            "pay_refund": (True, False), "pay_slow_refund": (True, False),
            "pay_label_order": (False, True), "pay_notify": (True, False),
            "pay_logo": (True, False)}
        assert harness.tools["pay_logo"].timeout == 7
        assert harness.tools["pay_refund"].reconcile_fn is hook
        assert harness.tools["pay_slow_refund"].reconcile_fn is None
        versions = {tool.name: tool.version for tool in tools.registered}
        assert versions.pop("pay_logo") == "1"  # an override states its own version
        assert set(versions.values()) == {"2.1.0"}  # the server's, recorded with each call
        assert all(not tool.interruptible for tool in tools.registered)

        schema = {s["function"]["name"]: s["function"] for s in tools.schemas()}
        assert schema["pay_refund"]["description"].startswith("Refund an order")
        assert schema["pay_refund"]["parameters"]["required"] == ["order", "cents"]
        assert schema["pay_refund"]["parameters"]["properties"]["cents"]["type"] == "integer"

        pytest.importorskip("openai")
        from tether.agents import ChatAgent

        agent = ChatAgent("any-model", tools=tools.registered)  # describes them from signatures
        offered = {s["function"]["name"]: s["function"]["parameters"] for s in agent.schemas}
        for name, function in schema.items():
            assert offered[name].get("required", []) == function["parameters"].get("required", [])
            assert offered[name]["properties"].keys() == function["parameters"]["properties"].keys()
        label = offered["pay_label_order"]["properties"]["label"]  # a $ref in the server's schema
        assert label["properties"]["color"]["enum"] == ["red", "green"]
        assert offered["pay_label_order"]["properties"]["note"]["default"] == ""
    assert not [name for name in harness.tools if name.startswith("pay_")]

    async with server.stdio(harness, trust_annotations=False) as untrusted:
        assert all(tool.side_effect for tool in untrusted.registered)


async def test_mistakes_are_named_and_register_nothing(harness: tt.Harness, server: Server) -> None:
    """An override or hook for a tool the server lacks, a name clash, or a hook that could
    never be asked is a ConfigurationError naming the tool; nothing is registered."""

    @harness.tool(idempotent=True)
    async def refund(ctx: tt.ToolContext) -> None: ...

    async def hook(ctx: tt.ToolContext, **args: Any) -> None: ...

    before = dict(harness.tools)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"overrides": {"refnud": tt.ToolPolicy()}, "prefix": "p_"}, "'refnud'"),
        ({"reconcile": {"nope": hook}, "prefix": "p_"}, "'nope'"),
        ({}, "'refund'"),  # clashes with the tool above
        ({"reconcile": {"read_balance": hook}, "prefix": "p_"}, "'read_balance' is idempotent"),
    ]
    for options, named in cases:
        with pytest.raises(tt.ConfigurationError, match=named):
            async with server.stdio(harness, **options):
                pass
        assert harness.tools == before


# ---------------------------------------------------------------------- calls


async def test_a_task_calls_the_tools_and_the_key_reaches_the_server(
        harness: tt.Harness, server: Server) -> None:
    """Structured content, text, several blocks and an image come back as plain data; the
    refund's ledger row carries the idempotency key tether planned for that call."""
    async with server.stdio(harness):
        info, history = await run(harness, ("refund", {"order": "o-1", "cents": 250}),
                                  ("read_balance", {"order": "o-1"}),
                                  ("set_flag", {"name": "vip", "value": True}),
                                  ("notify", {"text": "refunded"}), ("logo", {}),
                                  ("label_order", {"order": "o-1",
                                                   "label": {"text": "fragile", "color": "red"}}))
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    refund, balance, flag, note, logo, label = info.snapshot.result
    [key] = keys_of(history, "refund")
    assert refund == {"refund_id": 1, "order": "o-1", "cents": 250, "key": key, "duplicate": False}
    assert server.refunds() == [(key, "o-1", 250)]  # the key arrived in _meta[META_KEY]
    assert balance == {"order": "o-1", "refunded": 250, "refunds": 1}
    assert flag == "flag vip is on"  # a text result, no structured content
    assert note == {"result": ["sent: refunded", "queued"]}
    assert logo["type"] == "image" and logo["mime_type"] == "image/png"
    assert "not kept" in logo["data"]  # binary data is described, not stored
    assert label == {"result": "o-1: fragile (red)"}  # a nested argument


async def test_concurrent_tasks_share_one_server(harness: tt.Harness, server: Server) -> None:
    """Tasks on several workers call through the one session at once, each with its key."""
    async with server.stdio(harness):
        pid = server.pid()
        ids = [await harness.submit("script", {"calls": [["refund", {"order": f"c-{i}", "cents": i + 1}],
                                                         ["read_balance", {"order": f"c-{i}"}]]})
               for i in range(8)]
        await harness.run_until_idle(concurrency=8, timeout=DEADLINE)
        assert server.pid() == pid  # one process served them all
    for i, task_id in enumerate(ids):
        info = await harness.get(task_id)
        assert info.record.status is tt.Status.COMPLETED, info.record.reason
        assert info.snapshot.result[1] == {"order": f"c-{i}", "refunded": i + 1, "refunds": 1}
    assert len({key for key, _, _ in server.refunds()}) == 8


async def test_the_server_deduplicates_by_the_key_it_is_sent(
        harness: tt.Harness, server: Server) -> None:
    """The same key twice is one refund; another key is another refund."""
    async with server.stdio(harness):
        refund = harness.tools["refund"]
        first = await refund(tt.ToolContext("t", "refund", "k-1", 1), order="o-2", cents=99)
        again = await refund(tt.ToolContext("t", "refund", "k-1", 2), order="o-2", cents=99)
        other = await refund(tt.ToolContext("t", "refund", "k-2", 1), order="o-2", cents=99)
    assert again == {**first, "duplicate": True}
    assert other["refund_id"] != first["refund_id"]
    assert server.refunds("o-2") == [("k-1", "o-2", 99), ("k-2", "o-2", 99)]
    assert META_KEY == "tether.dev/idempotency-key"


async def test_an_error_result_reaches_the_agent_and_is_not_retried(
        harness: tt.Harness, server: Server) -> None:
    """isError is the server's answer: one attempt, its message told to the agent."""
    async with server.stdio(harness):
        info, _ = await run(harness, ("refund", {"order": "o-3", "cents": 0}),
                            ("read_balance", {"order": "o-3"}))
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    error, balance = info.snapshot.result
    assert "NotRetryable" in error["error"] and "cents must be positive, got 0" in error["error"]
    assert info.snapshot.frame.scratch["attempts"] == [1]
    assert balance["refunds"] == 0 and server.refunds() == []


# ---------------------------------------------------------------------- a killed server


async def test_killed_mid_refund_the_reconcile_hook_finds_it_and_it_is_paid_once(
        harness: tt.Harness, server: Server) -> None:
    """The refund landed, then the server died: the call is in doubt (OutcomeUnknown), the
    hook finds it in the ledger, the task carries on on a new server process."""
    asked: list[str] = []

    async def find_refund(ctx: tt.ToolContext, order: str, cents: int) -> dict[str, Any] | None:
        asked.append(ctx.idempotency_key)
        return server.find(ctx.idempotency_key)

    async with server.stdio(harness, reconcile={"slow_refund": find_refund}):
        killed = asyncio.ensure_future(kill_after_refund(server, "o-4"))
        info, history = await run(harness, ("slow_refund", {"order": "o-4", "cents": 700}),
                                  ("read_balance", {"order": "o-4"}), alongside=killed)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    [key] = keys_of(history, "slow_refund")
    assert asked == [key]
    assert await strategies(harness, info) == ["outcome_unknown", "reconcile"]
    refund, balance = info.snapshot.result
    assert refund == server.find(key) and balance["refunds"] == 1  # what the hook found
    assert server.refunds() == [(key, "o-4", 700)]
    assert server.pid() != killed.result()  # read_balance ran on a new process


async def test_killed_mid_refund_without_a_hook_a_person_decides(
        harness: tt.Harness, server: Server) -> None:
    """No hook: the task waits for a person instead of paying again; their word moves it on."""
    async with server.stdio(harness):
        killed = asyncio.ensure_future(kill_after_refund(server, "o-5"))
        info, history = await run(harness, ("slow_refund", {"order": "o-5", "cents": 300}),
                                  ("read_balance", {"order": "o-5"}), alongside=killed)
        assert info.record.status is tt.Status.NEEDS_HUMAN
        assert "outcome unknown" in (info.record.reason or "")
        assert await strategies(harness, info) == ["outcome_unknown", "needs_human"]
        [key] = keys_of(history, "slow_refund")
        assert server.refunds() == [(key, "o-5", 300)]

        await harness.decide(info.record.task_id, "happened", server.find(key), by="ops")
        await harness.run_until_idle(timeout=DEADLINE)
        info = await harness.get(info.record.task_id)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result[1]["refunds"] == 1
    assert server.refunds() == [(key, "o-5", 300)]


async def test_a_server_that_deduplicates_lets_a_killed_call_be_repeated(
        harness: tt.Harness, server: Server) -> None:
    """Declared idempotent (the server deduplicates by key), the call lost with the server is
    retried with the same key on a new process, which answers with the refund it made."""
    async with server.stdio(harness, overrides={"slow_refund": tt.ToolPolicy(idempotent=True)}):
        killed = asyncio.ensure_future(kill_after_refund(server, "o-6"))
        info, history = await run(harness, ("slow_refund", {"order": "o-6", "cents": 400}),
                                  alongside=killed)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    [key] = keys_of(history, "slow_refund")
    [refund] = info.snapshot.result
    assert refund["key"] == key and refund["duplicate"] is True
    assert "outcome_unknown" not in await strategies(harness, info)  # an ordinary retry
    assert server.refunds() == [(key, "o-6", 400)]


async def test_a_server_that_died_between_calls_leaves_nothing_in_doubt(
        harness: tt.Harness, server: Server) -> None:
    """Killed while idle: the next side-effecting call is sent on a new process (a ping
    found the old one dead first), and an idempotent call after another kill is retried."""
    async with server.stdio(harness) as tools:
        ctx = tt.ToolContext("t", "refund", "k-7", 1)
        await tools.registered[0](ctx, order="o-7")  # read_balance: the server is up
        server.kill()
        assert (await harness.tools["refund"](ctx, order="o-7", cents=5))["duplicate"] is False
        server.kill()
        with pytest.raises(MCPDisconnected, match="read_balance is idempotent"):
            await harness.tools["read_balance"](ctx, order="o-7")
        assert (await harness.tools["read_balance"](ctx, order="o-7"))["refunds"] == 1


# ---------------------------------------------------------------------- streamable HTTP


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def start_http_server(server: Server, port: int) -> subprocess.Popen[bytes]:
    """The server on *port* in a child process, once it accepts connections."""
    proc = subprocess.Popen([sys.executable, str(SERVER), "http", str(port)],
                            env={**os.environ, **server.env}, stderr=server.errlog)

    def listening() -> bool:
        assert proc.poll() is None, f"the MCP server exited with {proc.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    await until(listening, f"the MCP server on port {port}")
    return proc


async def test_streamable_http_killed_mid_refund_and_reconnected(
        harness: tt.Harness, server: Server) -> None:
    """The same guarantees over HTTP: the key in _meta, a killed server's refund reconciled
    and paid once; a restarted server is reached by a new session."""
    port = free_port()
    proc = await start_http_server(server, port)
    try:
        async with MCPTools.http(harness, f"http://127.0.0.1:{port}/mcp",
                                 reconcile={"slow_refund": server.find_refund}):
            killed = asyncio.ensure_future(kill_after_refund(server, "o-8"))
            info, history = await run(harness, ("refund", {"order": "o-9", "cents": 10}),
                                      ("slow_refund", {"order": "o-8", "cents": 800}),
                                      alongside=killed)
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            assert await strategies(harness, info) == ["outcome_unknown", "reconcile"]
            assert proc.wait(timeout=DEADLINE) == -signal.SIGKILL
            [key9], [key8] = keys_of(history, "refund"), keys_of(history, "slow_refund")
            assert server.refunds() == [(key9, "o-9", 10), (key8, "o-8", 800)]

            proc = await start_http_server(server, port)
            info, _ = await run(harness, ("read_balance", {"order": "o-8"}))
            assert info.record.status is tt.Status.COMPLETED, info.record.reason
            assert info.snapshot.result == [{"order": "o-8", "refunded": 800, "refunds": 1}]
    finally:
        proc.kill()
        proc.wait(timeout=DEADLINE)


def test_the_example_survives_its_server_crashing_mid_refund(tmp_path: Path) -> None:
    """examples/mcp_tools.py: the server dies after paying; the hook finds the refund."""
    example = Path(__file__).resolve().parents[2] / "examples" / "mcp_tools.py"
    run = subprocess.run([sys.executable, str(example), "--fake", "--db", str(tmp_path / "x.db")],
                         capture_output=True, text=True, timeout=DEADLINE * 2, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("completed: {'refund': {'order': 'A-17', 'cents': 4200,")
    assert "recovery: outcome_unknown -> reconcile" in run.stdout
    assert run.stdout.count("'refund_id'") == 2  # the result and the ledger: one refund

"""R2, R26: following a task as it runs. ``GET /api/tasks/{id}/stream`` (server-sent events)
over a real uvicorn server and real HTTP, the stream it is built on
(:func:`tether.watching.follow`), and ``tether watch`` against the store and against the
server (``tether serve`` in its own process, as an operator starts it)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from click.testing import CliRunner
from httpx_sse import aconnect_sse

import tether as tt
from serving import served, until
from tether.cli.main import main
from tether.watching import Position, follow
from tether.web.live import StreamSlots, stream_response
from tether.web.security import HTTPRefusal
from tether.web.server import ServerConfig

READ = "read-token-0123456789abcdef"
OPERATOR = "operator-token-0123456789abcdef"
APP = '''
import tether as tt

harness = tt.Harness(settings=tt.Settings(poll_interval=0.05))


@harness.tool()
async def count(ctx: tt.ToolContext, n: int) -> int:
    return n + 1


@harness.agent("gate")
class Gate(tt.Agent):
    """Says hello, waits for an approval, counts twice, finishes."""

    async def plan(self, t):
        if t.step == 0:
            return tt.Reply("asking for approval")
        if t.last_event is None:
            return tt.Wait("approval")
        if t.step < 5:
            return tt.ToolCall("count", {"n": t.step})
        return tt.Finish({"approved_by": t.last_event["payload"]})
'''


def gate_app(folder: Path, db: Path) -> tuple[str, tt.Harness]:
    """The app as a module of its own (the CLI imports it) and its harness on *db*."""
    name = f"gateapp_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(APP)
    sys.path.insert(0, str(folder))
    module = __import__(name)
    harness: tt.Harness = module.harness
    harness.use_store(f"sqlite:///{db}")
    return name, harness


@pytest.fixture
async def served_gate(tmp_path: Path) -> AsyncIterator[tuple[str, tt.Harness]]:
    """The API on a real socket, with a worker in the same process."""
    _, harness = gate_app(tmp_path, tmp_path / "live.db")
    async with served(harness, ServerConfig({READ: "read", OPERATOR: "operator"})) as running:
        yield running.base, harness


async def read_stream(base: str, task_id: str, *, last_id: str | None = None,
                      until: str = "end", send: Any = None) -> list[tuple[str, str, Any]]:
    """The stream's events as (kind, id, data) up to the first of kind *until*; *send* is
    called once the first event has arrived (the reader is known to be listening)."""
    headers = {"Authorization": f"Bearer {READ}"}
    if last_id is not None:
        headers["Last-Event-ID"] = last_id
    seen: list[tuple[str, str, Any]] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=30.0)) as client, \
            aconnect_sse(client, "GET", f"{base}/api/tasks/{task_id}/stream",
                         headers=headers) as source:
        assert source.response.headers["content-type"].startswith("text/event-stream")
        async for event in source.aiter_sse():
            seen.append((event.event, event.id, orjson.loads(event.data)))
            if len(seen) == 1 and send is not None:
                await send()
            if event.event == until:
                break
    return seen


async def test_the_stream_sends_every_committed_row_once_in_order_then_ends(
        served_gate: tuple[str, tt.Harness]) -> None:
    base, harness = served_gate
    task_id = await harness.submit("gate", task_id="gate-1")
    await until(harness, task_id, tt.Status.WAITING)

    async def approve() -> None:
        await harness.emit(tt.Event("approval", task_id, "ops"))

    seen = await read_stream(base, task_id, send=approve)
    kinds = [kind for kind, _, _ in seen]
    assert kinds[0] == "state" and seen[0][2]["status"] == "waiting"
    assert kinds[-1] == "end" and seen[-1][2]["status"] == "completed"
    numbers = [data["n"] for kind, _, data in seen if kind == "row"]
    history = await harness.history(task_id)
    assert numbers == list(range(1, len(history) + 1))  # each row once, none skipped
    rows = [data["row"] for kind, _, data in seen if kind == "row"]
    assert rows == orjson.loads(orjson.dumps(history))
    assert [data["row"]["name"] for kind, _, data in seen
            if kind == "row" and data["row"].get("role") == "tool"] == ["count", "count", "count"]
    statuses = [data["status"] for kind, _, data in seen if kind == "state"]
    assert statuses[-1] == "completed"  # (whether "running" is seen depends on the poll)
    # every id is the position after that event: rows received, recovery records received
    last_row = max(numbers)
    assert seen[-1][1] == f"{last_row}.0.1"  # rows, recovery records, branch of the dialog


async def test_a_reader_that_reconnects_gets_only_what_it_missed(
        served_gate: tuple[str, tt.Harness]) -> None:
    base, harness = served_gate
    task_id = await harness.submit("gate", task_id="gate-2")
    await until(harness, task_id, tt.Status.WAITING)
    await harness.emit(tt.Event("approval", task_id, "ops"))
    await until(harness, task_id, tt.Status.COMPLETED)
    whole = await read_stream(base, task_id)
    total = sum(kind == "row" for kind, _, _ in whole)
    again = await read_stream(base, task_id, last_id="3.0")
    assert [d["n"] for k, _, d in again if k == "row"] == list(range(4, total + 1))
    assert again[-1][0] == "end"


async def test_stream_errors_are_answers_not_broken_streams(
        served_gate: tuple[str, tt.Harness]) -> None:
    base, harness = served_gate
    task_id = await harness.submit("gate", task_id="gate-3")
    async with httpx.AsyncClient(base_url=base) as client:
        auth = {"Authorization": f"Bearer {READ}"}
        missing = await client.get("/api/tasks/nope/stream", headers=auth)
        assert missing.status_code == 404 and "nope" in missing.json()["error"]
        bad = await client.get(f"/api/tasks/{task_id}/stream",
                               headers={**auth, "Last-Event-ID": "12;drop"})
        assert bad.status_code == 422 and "'12;drop'" in bad.json()["error"]
        anonymous = await client.get(f"/api/tasks/{task_id}/stream")
        assert anonymous.status_code == 401


async def test_past_the_bound_a_new_stream_is_refused_with_503(tmp_path: Path) -> None:
    _, harness = gate_app(tmp_path, tmp_path / "slots.db")
    task_id = await harness.submit("gate")
    slots = StreamSlots(limit=1)
    first = await stream_response(harness, task_id, None, slots)
    with pytest.raises(HTTPRefusal) as refused:
        await stream_response(harness, task_id, None, slots)
    assert refused.value.status == 503 and "Retry-After" in refused.value.headers
    chunks = first.body_iterator
    assert (await anext(chunks)).startswith(b"event: state\n")  # type: ignore[arg-type]
    await chunks.aclose()  # type: ignore[attr-defined]
    assert slots.open == 0  # a closed stream gives its slot back
    await stream_response(harness, task_id, None, slots)
    await harness.close()


async def test_a_rollback_resets_the_stream_to_the_branch_the_task_took(tmp_path: Path) -> None:
    _, harness = gate_app(tmp_path, tmp_path / "reset.db")
    task_id = await harness.submit("gate")
    await harness.run_until_idle(timeout=20)
    await harness.emit(tt.Event("approval", task_id, "ops"))
    await harness.run_until_idle(timeout=20)
    before = [change async for change in follow(harness, task_id)]
    assert before[-1].kind == "end"
    rows_before = [c.data["n"] for c in before if c.kind == "row"]
    first = (await harness.store.list_versions(task_id))[0][0]
    await harness.rollback(task_id, first)
    await harness.run_until_idle(timeout=20)
    after = []
    async with aclosing(follow(harness, task_id, after=before[-1].position, poll=0.02,
                               quiet=0.1, until_finished=False)) as changes:
        async for change in changes:
            if change.kind == "quiet":  # all there is has been sent
                break
            after.append(change)
    kinds = [c.kind for c in after]
    assert "reset" in kinds
    reset_at = kinds.index("reset")
    renumbered = [c.data["n"] for c in after[reset_at:] if c.kind == "row"]
    assert renumbered == list(range(1, len(renumbered) + 1))
    assert len(rows_before) > len(renumbered)
    await harness.close()


async def test_a_reader_back_after_a_rollback_to_as_many_rows_is_told_to_start_again(
        tmp_path: Path) -> None:
    """The dialog was replaced by one of the same length while the reader was away: its
    position names the branch, so it gets a reset and the new rows, not silence."""
    _, harness = gate_app(tmp_path, tmp_path / "branch.db")
    task_id = await harness.submit("gate")
    await harness.run_until_idle(timeout=20)  # waiting, after one reply

    async def until_quiet(after: Position | None) -> list[Any]:
        seen = []
        async with aclosing(follow(harness, task_id, after=after, poll=0.02, quiet=0.1,
                                   until_finished=False)) as changes:
            async for change in changes:
                if change.kind == "quiet":
                    return seen
                seen.append(change)
        return seen

    first = await until_quiet(None)
    where = first[-1].position
    assert (where.rows, where.branch) == (1, 1)
    await harness.rollback(task_id, (await harness.store.list_versions(task_id))[0][0])
    await harness.run_until_idle(timeout=20)  # the same reply again, on a new branch
    again = await until_quiet(where)
    assert [c.kind for c in again if c.kind in ("reset", "row")] == ["reset", "row"]
    assert again[-1].position.branch == 2
    await harness.close()


def test_a_position_is_two_or_three_counts_and_nothing_else() -> None:
    assert Position.parse("12.3") == Position(12, 3)
    assert Position.parse("12.3.2") == Position(12, 3, 2)
    assert str(Position(4, 0)) == "4.0" and str(Position(4, 0, 1)) == "4.0.1"
    assert Position.parse(None) == Position()
    for hostile in ("1", "1.2.3.4", "-1.0", "1.0\r\nX: y", "9999999999.0", "a.b", "1.2."):
        with pytest.raises(tt.InvalidInput, match="two or three counts"):
            Position.parse(hostile)


def test_watch_follows_the_store_until_the_task_ends(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    name, harness = gate_app(tmp_path, tmp_path / "watch.db")

    async def prepare() -> str:
        task_id = await harness.submit("gate", task_id="watched")
        await harness.run_until_idle(timeout=20)
        await harness.emit(tt.Event("approval", task_id, "ops"))
        await harness.run_until_idle(timeout=20)
        await harness.close()
        return task_id

    asyncio.run(prepare())
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(main, ["--store", f"sqlite:///{tmp_path / 'watch.db'}",
                                       "--app", f"{name}:harness", "watch", "watched"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("task watched completed")
    assert sum("tool call count" in line for line in lines) == 3
    assert lines[-1] == "ended: completed"
    as_json = CliRunner().invoke(main, ["--store", f"sqlite:///{tmp_path / 'watch.db'}",
                                        "--app", f"{name}:harness", "watch", "watched",
                                        "--json"])
    events = [orjson.loads(line) for line in as_json.output.splitlines()]
    assert events[-1]["event"] == "end" and {e["event"] for e in events} >= {"state", "row"}


def test_watch_refuses_a_server_that_is_no_url_and_a_missing_token(tmp_path: Path) -> None:
    bad = CliRunner().invoke(main, ["watch", "x", "--server", "ftp://host"])
    assert bad.exit_code == 2 and "http(s)://host:port" in bad.output
    env = {k: v for k, v in os.environ.items() if k != "TETHER_TOKEN"}
    no_token = CliRunner(env=env).invoke(main, ["watch", "x", "--server", "http://127.0.0.1:1"])
    assert no_token.exit_code == 2 and "TETHER_TOKEN" in no_token.output


def test_serve_says_where_it_is_watch_reads_its_stream_and_serve_logs_its_stop(
        tmp_path: Path) -> None:
    """`tether serve` in its own process: the lines it prints on start (URL, console, how to
    sign in), `tether watch --server` following a task to its end through the stream, and a
    SIGTERM that stops the server (an open stream does not hold it) with a last line."""
    name, _ = gate_app(tmp_path, tmp_path / "serve.db")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TETHER_STORE":
           f"sqlite:///{tmp_path / 'serve.db'}", "TETHER_APP": f"{name}:harness",
           "TETHER_TOKENS": f"{READ}:read,{OPERATOR}:operator", "COLUMNS": "200"}
    tether = [sys.executable, "-m", "tether"]
    server = subprocess.Popen([*tether, "serve", "--port", "0", "--with-worker"], env=env,
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        banner = [server.stdout.readline() for _ in range(4)]
        url = re.search(r"listening on (http://127\.0\.0\.1:\d+) with a worker", banner[0])
        assert url, banner
        base = url[1]
        assert f"console: {base}/console" in banner[1] and "sign in" in banner[1]
        assert f"{base}/api/tasks" in banner[2] and "Bearer" in banner[2]
        created = httpx.post(f"{base}/api/tasks", json={"agent": "gate", "task_id": "far"},
                             headers={"Authorization": f"Bearer {OPERATOR}"})
        assert created.status_code == 201, created.text
        watcher = subprocess.Popen([*tether, "watch", "far", "--server", base],
                                   env={**env, "TETHER_TOKEN": READ}, cwd=tmp_path,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert watcher.stdout is not None
        first = watcher.stdout.readline()
        assert first.startswith("task far "), first
        approved = httpx.post(f"{base}/api/tasks/far/events",
                              json={"type": "approval", "payload": "ops"},
                              headers={"Authorization": f"Bearer {OPERATOR}"})
        assert approved.status_code == 202, approved.text
        rest, _ = watcher.communicate(timeout=60)
        assert watcher.returncode == 0, first + rest
        assert rest.splitlines()[-1] == "ended: completed"
        assert sum("tool call count" in line for line in rest.splitlines()) == 3

        unknown = subprocess.Popen([*tether, "watch", "far-away", "--server", base],
                                       env={**env, "TETHER_TOKEN": READ}, cwd=tmp_path,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True)
        missing, _ = unknown.communicate(timeout=60)
        assert unknown.returncode == 1 and missing.startswith("error: ") \
            and "far-away" in missing
        httpx.post(f"{base}/api/tasks", json={"agent": "gate", "task_id": "held"},
                   headers={"Authorization": f"Bearer {OPERATOR}"})
        holding = subprocess.Popen([*tether, "watch", "held", "--server", base],
                                   env={**env, "TETHER_TOKEN": READ}, cwd=tmp_path,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert holding.stdout is not None
        assert holding.stdout.readline().startswith("task held ")  # its stream is open
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=60)
        assert server.returncode == 0, err
        assert err.strip().splitlines()[-1].startswith("tether serve stopped")
        holding.kill()
    finally:
        server.kill()


NEEDS_PERSON_APP = '''
import tether as tt

harness = tt.Harness(settings=tt.Settings(max_recovery_attempts=1, recovery_backoff=0.01))


@harness.agent("stuck")
class Stuck(tt.Agent):
    async def plan(self, t):
        raise ValueError("the warehouse is closed")
'''


def test_watch_stops_at_a_task_that_needs_a_person_unless_told_to_keep_following(
        tmp_path: Path) -> None:
    """Issue 29: `tether watch` ends (exit 2) when the task needs a person, saying where to
    look; with --keep-following it goes on until the task ends (here: cancelled, exit 1)."""
    (tmp_path / "stuckapp.py").write_text(NEEDS_PERSON_APP)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TETHER_APP": "stuckapp:harness",
           "TETHER_STORE": f"sqlite:///{tmp_path / 'stuck.db'}", "COLUMNS": "200"}
    tether = [sys.executable, "-m", "tether"]
    task = subprocess.run([*tether, "submit", "stuck"], env=env, capture_output=True,
                          text=True, check=True).stdout.strip()
    subprocess.run([*tether, "worker", "--until-idle"], env=env, check=True,
                   capture_output=True, timeout=60)
    stopped = subprocess.run([*tether, "watch", task], env=env, capture_output=True, text=True,
                             timeout=60)
    assert stopped.returncode == 2, stopped.stdout + stopped.stderr
    assert "stopped following: needs_human" in stopped.stdout
    following = subprocess.Popen([*tether, "watch", task, "--keep-following"], env=env,
                                 stdout=subprocess.PIPE, text=True)
    assert following.stdout is not None
    assert "needs_human" in following.stdout.readline()  # it is following, past that state
    subprocess.run([*tether, "cancel", task], env=env, check=True, capture_output=True,
                   timeout=60)
    rest, _ = following.communicate(timeout=60)
    assert following.returncode == 1 and "cancelled" in rest

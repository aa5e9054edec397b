"""The HTTP API over real HTTP on loopback, against a real SQLite store (R3, R23, R26).

uvicorn serves ``tether.web.server.create_app`` on a free port; httpx talks to it.
"""

from __future__ import annotations

import asyncio
import html
import re
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from click.testing import CliRunner

import tether as tt
from tether.cli.main import main
from tether.store import LimitRequest
from tether.web.server import ServerConfig, create_app, sign

OPERATOR, READER = "operator-token-0123456789abcdef", "reader-token-0123456789abcdef"
SECRET = "hook-secret-0123456789abcdef"


def app_harness(path: Path) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{path}", settings=tt.Settings(poll_interval=0.01, inbox_capacity=3))

    @h.agent("gate")
    class Gate(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.last_event is None:
                return tt.Reply("asking") if t.step == 0 else tt.Wait("approval")
            return tt.Finish(t.last_event["payload"])

    @h.tool(idempotent=True, retry=tt.RetryPolicy(max_attempts=1))
    async def broken(ctx: tt.ToolContext) -> str:
        order: dict[str, str] | None = None
        return order["customer"]  # type: ignore[index]  # the bug a person must find

    @h.agent("buggy")
    class Buggy(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.ToolCall("broken", {})

    @h.agent("priced")
    class Priced(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            t.record_completion("m-1", usage={"prompt_tokens": 120, "completion_tokens": 8},
                                finish_reason="stop", seconds=0.25)
            return tt.Finish("answered")

    return h


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, tt.Harness]]:
    harness = app_harness(tmp_path / "api.db")
    config = ServerConfig({OPERATOR: "operator", READER: "read"}, {"billing": SECRET},
                          tolerance=300, max_body=64 * 1024)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(harness, config), host="127.0.0.1",
                                           port=port, log_level="error"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        yield client, harness
    server.should_exit = True
    await serving
    await harness.close()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def hook(body: dict[str, Any], timestamp: float | None = None, secret: str = SECRET
         ) -> tuple[bytes, dict[str, str]]:
    raw = orjson.dumps(body)
    stamp = str(int(timestamp if timestamp is not None else time.time()))
    return raw, {"X-Tether-Timestamp": stamp, "X-Tether-Signature": sign(secret, stamp, raw),
                 "content-type": "application/json"}


async def test_r26_tokens_read_only_cannot_mutate_and_errors_are_json(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    anonymous = await client.get("/api/tasks")
    assert anonymous.status_code == 401 and "bearer token" in anonymous.json()["error"]
    assert (await client.get("/api/tasks", headers=auth("wrong"))).status_code == 401
    assert (await client.get("/api/tasks", headers=auth(READER))).status_code == 200
    refused = await client.post("/api/tasks", json={"agent": "gate"}, headers=auth(READER))
    assert refused.status_code == 403 and "may read" in refused.json()["error"]
    missing = await client.get("/api/tasks/ghost", headers=auth(READER))
    assert missing.status_code == 404 and "ghost" in missing.json()["error"]
    unknown = await client.post("/api/tasks", json={"agent": "nobody"}, headers=auth(OPERATOR))
    assert unknown.status_code == 422 and "nobody" in unknown.json()["error"]
    huge = await client.post("/api/tasks", content=b"x" * 70_000, headers=auth(OPERATOR))
    assert huge.status_code == 413 and "bytes" in huge.json()["error"]

    async def stream() -> AsyncIterator[bytes]:
        for _ in range(100):
            yield b"x" * 1000

    # a body of unknown size is counted as it arrives: refused once over the limit
    chunked = await client.post("/api/tasks", content=stream(), headers=auth(OPERATOR))
    assert chunked.status_code == 413 and "bytes" in chunked.json()["error"]


async def test_r02_r26_submit_read_and_steer_a_task_over_http(api) -> None:  # type: ignore[no-untyped-def]
    client, harness = api
    created = await client.post("/api/tasks", json={"agent": "gate", "task_id": "t1"},
                                headers=auth(OPERATOR))
    assert created.status_code == 201 and created.json() == {"task_id": "t1"}
    await harness.run_until_idle(timeout=5)
    task = (await client.get("/api/tasks/t1", headers=auth(READER))).json()
    assert task["task"]["status"] == "waiting" and task["snapshot"]["step"] == 2
    listed = (await client.get("/api/tasks?status=waiting", headers=auth(READER))).json()
    assert [t["task_id"] for t in listed["tasks"]] == ["t1"] and listed["counts"] == {"waiting": 1}
    page = (await client.get("/api/tasks/t1/history?offset=0&limit=1", headers=auth(READER))).json()
    assert page["total"] == 1 and page["rows"][0]["content"] == "asking"
    versions = (await client.get("/api/tasks/t1/versions", headers=auth(READER))).json()
    assert versions[-1]["version"] == task["version"]

    sent = await client.post("/api/tasks/t1/events", json={"type": "approval", "payload": "ok"},
                             headers=auth(OPERATOR))
    assert sent.status_code == 202 and sent.json()["outcome"] == "stored"
    await harness.run_until_idle(timeout=5)
    done = (await client.get("/api/tasks/t1", headers=auth(READER))).json()
    assert done["task"]["status"] == "completed" and done["snapshot"]["result"] == "ok"
    rolled = await client.post("/api/tasks/t1/rollback", json={"version": versions[0]["version"]},
                               headers=auth(OPERATOR))
    assert rolled.status_code == 202 and rolled.json()["version"] > done["version"]
    log = (await client.get("/api/tasks/t1/recovery", headers=auth(READER))).json()
    assert "rollback" in [r["resume_strategy"] for r in log]
    cancelled = await client.post("/api/tasks/t1/cancel", headers=auth(OPERATOR))
    assert cancelled.json()["status"] == "cancelled"
    bundle = (await client.get("/api/tasks/t1/bundle", headers=auth(READER))).json()
    assert bundle["task"]["task_id"] == "t1"

    # a fork of the waiting version: a new task that waits again; the cancelled one stays so
    heads = {v["version"]: (await harness.reads.head("t1", v["version"]))[1] for v in versions}
    waiting = next(v for v, head in heads.items() if b'"status":"waiting"' in head)
    refused = await client.post("/api/tasks/t1/fork", json={}, headers=auth(READER))
    assert refused.status_code == 403
    forked = await client.post("/api/tasks/t1/fork", json={"version": waiting, "task_id": "t2"},
                               headers=auth(OPERATOR))
    assert forked.status_code == 201 and forked.json() == {"task_id": "t2", "forked_from": "t1"}
    await harness.run_until_idle(timeout=5)
    assert (await client.get("/api/tasks/t2", headers=auth(READER))).json()["task"][
        "status"] == "waiting"
    assert (await client.get("/api/tasks/t1", headers=auth(READER))).json()["task"][
        "status"] == "cancelled"
    again = await client.post("/api/tasks/t1/fork", json={"task_id": "t2"}, headers=auth(OPERATOR))
    assert again.status_code == 409 and "t2" in again.json()["error"]
    bad = await client.post("/api/tasks/t1/fork", json={"version": 0}, headers=auth(OPERATOR))
    assert bad.status_code == 422

    # resume with a corrected input: the old one stays in the dialog
    repaired = await client.post("/api/tasks/t2/resume", json={"input": {"fixed": True}},
                                 headers=auth(OPERATOR))
    assert repaired.status_code == 202, repaired.text
    await harness.run_until_idle(timeout=5)
    t2 = (await client.get("/api/tasks/t2", headers=auth(READER))).json()["snapshot"]
    assert t2["input"] == {"fixed": True}
    rows = (await client.get("/api/tasks/t2/history", headers=auth(READER))).json()["rows"]
    assert [r["replaced"] for r in rows if r.get("type") == "input"] == [None]


async def test_r03_r06_signed_webhooks_are_durable_deduplicated_and_replay_proof(api) -> None:  # type: ignore[no-untyped-def]
    client, harness = api
    await harness.submit("gate", task_id="t1")
    body, headers = hook({"id": "evt-1", "type": "approval", "task_id": "t1", "payload": "yes"})
    first = await client.post("/hooks/billing", content=body, headers=headers)
    assert first.status_code == 202 and first.json()["outcome"] == "stored"
    stored = await harness.store.list_events("t1")  # durable before the 202
    assert [(e.event.type, e.event.source_event_id) for e in stored] == [("approval", "billing:evt-1")]
    again = await client.post("/hooks/billing", content=body, headers=headers)
    assert again.status_code == 202 and again.json()["outcome"] == "duplicate"
    assert len(await harness.store.list_events("t1")) == 1

    bad_sig = dict(headers, **{"X-Tether-Signature": "sha256=" + "0" * 64})
    assert (await client.post("/hooks/billing", content=body, headers=bad_sig)).status_code == 401
    old_body, old_headers = hook({"id": "evt-2", "type": "approval", "task_id": "t1"},
                                 timestamp=time.time() - 3600)
    replay = await client.post("/hooks/billing", content=old_body, headers=old_headers)
    assert replay.status_code == 401 and "replay" in replay.json()["error"]
    assert (await client.post("/hooks/nobody", content=body, headers=headers)).status_code == 404
    junk, junk_headers = hook({"type": "approval"})
    rejected = await client.post("/hooks/billing", content=junk, headers=junk_headers)
    assert rejected.status_code == 422 and "task_id" in rejected.json()["error"]
    assert len(await harness.store.list_events("t1")) == 1  # nothing else got in


async def test_r07_a_full_inbox_answers_429_with_retry_after(api) -> None:  # type: ignore[no-untyped-def]
    client, harness = api
    await harness.submit("gate", task_id="t1")
    codes = []
    for n in range(5):
        body, headers = hook({"id": f"p{n}", "type": "webhook_progress", "task_id": "t1"})
        harness.protocol._rules["webhook_progress"] = tt.Rule(tt.Priority.P3)
        answer = await client.post("/hooks/billing", content=body, headers=headers)
        codes.append(answer.status_code)
        if answer.status_code == 429:
            assert answer.headers["retry-after"] == "1" and "inbox" in answer.json()["error"]
    assert codes[:3] == [202, 202, 202] and 429 in codes[3:]


async def test_r23_metrics_count_steps_recoveries_events_and_the_inbox(api) -> None:  # type: ignore[no-untyped-def]
    client, harness = api
    assert (await client.get("/metrics")).status_code == 401
    await harness.submit("gate", task_id="t1")
    await harness.submit("gate", task_id="t2")
    await harness.run_until_idle(timeout=5)
    body, headers = hook({"id": "e1", "type": "approval", "task_id": "t1", "payload": 1})
    await client.post("/hooks/billing", content=body, headers=headers)
    await client.post("/hooks/billing", content=body, headers=headers)  # a duplicate
    text = (await client.get("/metrics", headers=auth(READER))).text
    assert 'tether_tasks{status="waiting"} 2.0' in text
    assert "tether_inbox_depth 1.0" in text
    assert 'tether_events_total{outcome="stored"} 1.0' in text
    assert 'tether_events_total{outcome="duplicate"} 1.0' in text
    assert "tether_steps_total 4.0" in text  # two Replies, two Waits
    await harness.run_until_idle(timeout=5)
    text = (await client.get("/metrics", headers=auth(READER))).text
    assert 'tether_tasks{status="completed"} 1.0' in text and "tether_inbox_depth 0.0" in text


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:400]
    return found.group(1)


def approve_form(html: str) -> dict[str, str]:
    """What the page's approve button posts: the form's token and the wait it shows."""
    found = re.search(r'name="wait" value="([^"]*)"', html)
    assert found, html[:400]
    return {"csrf": csrf_of(html), "wait": found.group(1)}


async def test_r26_the_console_lists_shows_and_steers_tasks_for_an_operator(api) -> None:  # type: ignore[no-untyped-def]
    client, harness = api
    origin = {"Origin": str(client.base_url).rstrip("/")}
    await harness.submit("gate", task_id="t1")
    await harness.run_until_idle(timeout=5)
    login = await client.get("/console")
    assert "Sign in" in login.text
    bad = await client.post("/console/login", data={"token": "nope", "csrf": csrf_of(login.text)},
                            headers=origin)
    assert bad.status_code == 401 and "not valid" in bad.text
    signed = await client.post("/console/login", headers=origin,
                               data={"token": READER, "csrf": csrf_of(bad.text)})
    assert signed.status_code == 303 and "tether_session" in signed.headers["set-cookie"]
    listing = await client.get("/console")
    assert "t1" in listing.text and "waiting" in listing.text
    page = await client.get("/console/tasks/t1")
    assert "Timeline" in page.text and "asking" in page.text
    refused = await client.post("/console/tasks/t1/cancel", data={"csrf": csrf_of(page.text)},
                                headers=origin)
    assert refused.status_code == 303
    assert "Only an operator" in (await client.get("/console/tasks/t1")).text
    assert (await harness.store.get_task("t1")).status is tt.Status.WAITING

    login = await client.get("/console")  # still signed in as reader: sign out first
    await client.post("/console/logout", data={"csrf": csrf_of(login.text)}, headers=origin)
    login = await client.get("/console")
    await client.post("/console/login", data={"token": OPERATOR, "csrf": csrf_of(login.text)},
                      headers=origin)
    versions = await harness.store.list_versions("t1")
    diff = await client.get(f"/console/tasks/t1/diff?a={versions[0][0]}&b={versions[-1][0]}")
    shown = html.unescape(diff.text)  # side by side: the old line red on the left, the new green
    assert diff.status_code == 200
    assert '<td class="old"><pre>  "status": "pending",</pre>' in shown
    assert '<td class="new"><pre>  "status": "waiting",</pre>' in shown
    page = await client.get("/console/tasks/t1")
    done = await client.post("/console/tasks/t1/cancel", data={"csrf": csrf_of(page.text)},
                             headers=origin)
    assert done.status_code == 303
    assert "cancel sent" in (await client.get("/console/tasks/t1")).text
    assert (await harness.store.get_task("t1")).status is tt.Status.CANCELLED
    bundle = await client.get("/console/tasks/t1/bundle")
    assert bundle.json()["task"]["status"] == "cancelled"


async def test_r02_the_console_shows_each_model_call_with_its_cost(
        api: tuple[httpx.AsyncClient, tt.Harness]) -> None:
    """Issue 16: a completion an agent recorded is a "model call" row in the timeline, with
    its finish reason, tokens and time; the API's task carries the usage totals."""
    client, harness = api
    origin = {"Origin": str(client.base_url).rstrip("/")}
    await harness.submit("priced", task_id="p1")
    await harness.run_until_idle(timeout=5)
    login = await client.get("/console")
    await client.post("/console/login", headers=origin,
                      data={"token": READER, "csrf": csrf_of(login.text)})
    page = (await client.get("/console/tasks/p1")).text
    assert "model call" in page and "m-1: stop, 120+8 tokens, 0.25s" in page
    task = (await client.get("/api/tasks/p1", headers=auth(READER))).json()
    assert task["snapshot"]["usage"] == {"completions": 1, "prompt_tokens": 120,
                                         "completion_tokens": 8}


async def test_r26_the_console_shows_the_traceback_and_who_holds_a_task(
        api: tuple[httpx.AsyncClient, tt.Harness]) -> None:
    """Issue 18: a failure's traceback (file, line, code) is on the task page, in the
    timeline and beside its recovery; a task under a lease says who holds it and until when."""
    client, harness = api
    origin = {"Origin": str(client.base_url).rstrip("/")}
    await harness.submit("buggy", task_id="b1")
    await harness.run_until_idle(timeout=5)
    login = await client.get("/console")
    await client.post("/console/login", headers=origin,
                      data={"token": READER, "csrf": csrf_of(login.text)})
    page = (await client.get("/console/tasks/b1")).text
    assert page.count("<summary>traceback</summary>") >= 2
    assert "test_http_api.py" in page and "in broken" in page
    log = (await client.get("/api/tasks/b1/recovery", headers=auth(READER))).json()
    assert "in broken" in log[-1]["traceback"]
    await harness.submit("gate", task_id="held")
    claim = await harness.store.claim("worker-that-died", time.time(), 60.0)
    assert claim is not None and claim.task_id == "held"
    page = (await client.get("/console/tasks/held")).text
    assert 'id="lease"' in page and "worker-that-died" in page
    task = (await client.get("/api/tasks/held", headers=auth(READER))).json()
    assert task["task"]["lease_owner"] == "worker-that-died" and task["task"]["lease_until"]


async def sign_in(client: httpx.AsyncClient, token: str) -> dict[str, str]:
    """Sign the client in to the console; the Origin header its forms must carry."""
    origin = {"Origin": str(client.base_url).rstrip("/")}
    login = await client.get("/console")
    signed = await client.post("/console/login", headers=origin,
                               data={"token": token, "csrf": csrf_of(login.text)})
    assert signed.status_code == 303
    return origin


async def settled(harness: tt.Harness, task_id: str, status: tt.Status) -> None:
    await harness.run_until_idle(timeout=5)
    assert (await harness.store.get_task(task_id)).status is status


def forms(html: str) -> list[str]:
    return re.findall(r'<form[^>]* action="([^"]+)"', html)


async def test_r26_the_console_timeline_gives_times_durations_and_marks_rollbacks_and_people(
        api: tuple[httpx.AsyncClient, tt.Harness]) -> None:
    """Issue 18: every timeline row has its time (full on hover) and the time since the row
    before; a person's event and a rollback are marked, so a rolled-back task does not look
    like a clean run."""
    client, harness = api
    await harness.submit("gate", task_id="t1")
    await harness.submit("gate", task_id="clean")
    await harness.run_until_idle(timeout=5)
    origin = await sign_in(client, OPERATOR)
    first = (await harness.store.list_versions("t1"))[0][0]
    for name in ("t1", "clean"):
        page = await client.get(f"/console/tasks/{name}")
        sent = await client.post(f"/console/tasks/{name}/approve", headers=origin,
                                 data=approve_form(page.text))
        assert sent.status_code == 303
        await settled(harness, name, tt.Status.COMPLETED)
    page = await client.get("/console/tasks/t1")
    await client.post("/console/tasks/t1/rollback", headers=origin,
                      data={"csrf": csrf_of(page.text), "version": str(first)})
    await harness.run_until_idle(timeout=5)
    rolled = (await client.get("/console/tasks/t1")).text
    clean = (await client.get("/console/tasks/clean")).text
    assert 'class="mark mark-rollback"' in rolled and "rolled back to version" in rolled
    assert 'class="mark mark-rollback"' not in clean and 'class="mark mark-crash"' not in clean
    times = re.findall(r'<span title="([^"]+)">(\d\d:\d\d:\d\d\.\d{3})</span>', clean)
    assert len(times) >= 3 and all(full[11:19] == short[:8] for full, short in times)
    assert re.search(r'<td class="muted nowrap">\+\d+\.\d\d s</td>', clean)  # a duration


def test_r26_the_timeline_merges_recovery_records_by_time_with_a_marker_per_kind() -> None:
    """Dialog rows and recovery records in time order; crash, rollback, person and other
    recoveries each with their own marker; durations measured from the entry before."""
    from tether.web.timeline import timeline as _timeline
    rows = [{"role": "assistant", "content": "a", "at": 100.0},
            {"role": "assistant", "content": "b", "at": 103.5},
            {"role": "event", "type": "decide", "content": {"outcome": "skip"}, "at": 190.0}]
    log = [{"resume_strategy": "resume", "detail": "worker died", "at": 101.0,
            "traceback": "Traceback ... line 3"},
           {"resume_strategy": "fallback_version", "detail": "v2 damaged", "at": 101.5},
           {"resume_strategy": "human_decision", "detail": "ops said skip", "at": 189.0},
           {"resume_strategy": "retry_backoff", "detail": "try again", "at": 102.0},
           {"resume_strategy": "rollback", "detail": "back to 1", "at": 400.0}]
    line = _timeline(rows, log)
    assert [(e["what"], e["marker"]) for e in line] == [
        ("reply", ""), ("resume", "crash"), ("fallback version", "crash"),
        ("retry backoff", "recovery"), ("reply", ""), ("human decision", "person"),
        ("event decide", "person"), ("rollback", "rollback")]
    assert [e["delta"] for e in line] == ["", "+1.0 s", "+0.50 s", "+0.50 s", "+1.5 s",
                                          "+1 min 25 s", "+1.0 s", "+3 min 30 s"]
    assert line[1]["traceback"] == "Traceback ... line 3" and line[1]["detail"] == "worker died"
    assert [e["n"] for e in line if e["n"] != ""] == [1, 2, 3]


async def test_r26_levers_are_shown_only_where_they_can_act(
        api: tuple[httpx.AsyncClient, tt.Harness]) -> None:
    """A waiting task offers approve, send event, resume, roll back, fork, cancel and delete;
    a completed one roll back, fork and delete; a cancelled one fork (a new task from one of
    its versions: the cancelled task itself cannot be changed) and delete; a read-only
    session none."""
    client, harness = api
    await harness.submit("gate", task_id="w")
    await harness.submit("gate", task_id="c")
    await harness.submit("gate", task_id="x")
    await harness.run_until_idle(timeout=5)
    origin = await sign_in(client, OPERATOR)
    page = await client.get("/console/tasks/c")
    await client.post("/console/tasks/c/event", headers=origin,
                      data={"csrf": csrf_of(page.text), "type": "approval", "payload": '"ok"'})
    await settled(harness, "c", tt.Status.COMPLETED)
    await harness.cancel("x")
    await settled(harness, "x", tt.Status.CANCELLED)

    def levers(html: str) -> list[str]:
        return [a.rsplit("/", 1)[1] for a in forms(html)
                if a.startswith("/console/tasks/") and not a.endswith("/diff")]

    waiting = (await client.get("/console/tasks/w")).text
    assert levers(waiting) == ["approve", "resume", "rollback", "fork", "cancel", "delete",
                               "event"]
    assert "Approve (send approval)" in waiting
    assert levers((await client.get("/console/tasks/c")).text) == ["rollback", "fork", "delete"]
    assert levers((await client.get("/console/tasks/x")).text) == ["fork", "delete"]
    listing = await client.get("/console")
    await client.post("/console/logout", headers=origin, data={"csrf": csrf_of(listing.text)})
    await sign_in(client, READER)
    read_only = (await client.get("/console/tasks/w")).text
    assert levers(read_only) == [] and 'id="read-only"' in read_only


async def test_r26_console_errors_are_pages_and_sign_out_ends_the_session(
        api: tuple[httpx.AsyncClient, tt.Harness]) -> None:
    client, harness = api
    await harness.submit("gate", task_id="t1")
    origin = await sign_in(client, OPERATOR)
    for path in ("/console/tasks/ghost", "/console/tasks/ghost/diff?a=1&b=2",
                 "/console/tasks/ghost/bundle", "/console/tasks/t1/diff?a=1&b=999",
                 "/console/no-such-page"):
        missing = await client.get(path)
        assert missing.status_code == 404, path
        assert missing.headers["content-type"].startswith("text/html"), path
        assert 'id="error-page"' in missing.text and "Sign out" in missing.text, path
    assert "ghost" in (await client.get("/console/tasks/ghost")).text
    page = await client.get("/console/tasks/t1")
    posted = await client.post("/console/tasks/ghost/cancel", headers=origin,
                               data={"csrf": csrf_of(page.text)})
    assert posted.status_code == 404 and 'id="error-page"' in posted.text
    assert (await client.get("/api/tasks/ghost", headers=auth(READER))).json()["error"]

    old = client.cookies.get("tether_session")
    assert old
    out = await client.post("/console/logout", headers=origin, data={"csrf": csrf_of(page.text)})
    assert out.status_code == 303 and out.headers["location"] == "/console"
    assert "Sign in" in (await client.get("/console")).text
    client.cookies.set("tether_session", old, path="/console")  # the old id is dead too
    again = await client.get("/console/tasks/t1")
    assert again.status_code == 303 and again.headers["location"] == "/console"


async def test_r26_the_console_sends_events_with_a_validated_json_payload(
        api: tuple[httpx.AsyncClient, tt.Harness]) -> None:
    """The send-event form: a protocol type, a JSON payload (refused with a clear message
    when it is not JSON), a priority; levers and unknown types are refused; read-only
    sessions cannot send; the one-click approve sends the type the task waits for."""
    client, harness = api
    await harness.submit("gate", task_id="t1")
    await harness.submit("gate", task_id="t2")
    await harness.run_until_idle(timeout=5)
    origin = await sign_in(client, OPERATOR)
    page = (await client.get("/console/tasks/t1")).text
    types = re.findall(r'<option value="([a-z_]+)"', page.split('id="send-event"')[1])
    assert "approval" in types and "user_message" in types
    assert not {"cancel", "resume", "rollback", "decide", "timer", "task_timeout"} & set(types)

    async def send(**fields: str) -> str:
        answer = await client.post("/console/tasks/t1/event", headers=origin,
                                   data={"csrf": csrf_of(page), **fields})
        assert answer.status_code == 303
        return (await client.get("/console/tasks/t1")).text

    bad = await send(type="approval", payload="{oops")
    assert "the payload is not valid JSON" in bad and 'class="flash error"' in bad
    assert "the priority must be 0 to 4" in await send(type="approval", priority="9")
    assert "not &#39;cancel&#39;" in await send(type="cancel")
    assert "not &#39;bogus&#39;" in await send(type="bogus")
    assert await harness.store.list_events("t1") == []  # none of those got in
    sent = await send(type="approval", payload='{"ok": true}', priority="1")
    assert "event approval sent" in sent
    [stored] = await harness.store.list_events("t1")
    assert stored.event.type == "approval" and stored.event.payload == {"ok": True}
    assert stored.priority == 1
    await settled(harness, "t1", tt.Status.COMPLETED)
    assert (await harness.get("t1")).snapshot.result == {"ok": True}

    page = (await client.get("/console/tasks/t2")).text
    await client.post("/console/tasks/t2/approve", headers=origin, data=approve_form(page))
    await settled(harness, "t2", tt.Status.COMPLETED)
    result = (await harness.get("t2")).snapshot.result
    assert result["approved"] is True and result["by"].startswith("console:")
    again = await client.post("/console/tasks/t2/approve", headers=origin,
                              data=approve_form(page))
    assert again.status_code == 303
    assert "not waiting for an event" in (await client.get("/console/tasks/t2")).text

    listing = await client.get("/console")
    await client.post("/console/logout", headers=origin, data={"csrf": csrf_of(listing.text)})
    await harness.submit("gate", task_id="t3")
    await harness.run_until_idle(timeout=5)
    await sign_in(client, READER)
    page = (await client.get("/console/tasks/t3")).text
    assert 'id="send-event"' not in page
    refused = await client.post("/console/tasks/t3/event", headers=origin,
                                data={"csrf": csrf_of(page), "type": "approval"})
    assert refused.status_code == 303
    assert "Only an operator" in (await client.get("/console/tasks/t3")).text
    assert await harness.store.list_events("t3") == []


async def test_r26_the_task_list_filters_searches_and_pages(
        api: tuple[httpx.AsyncClient, tt.Harness]) -> None:
    client, harness = api
    for n in range(55):
        await harness.submit("gate", task_id=f"g{n:02d}")
    await harness.submit("buggy", task_id="bug-1")
    await harness.run_until_idle(timeout=10)
    await sign_in(client, READER)

    def ids(html: str) -> list[str]:
        return re.findall(r'<a href="/console/tasks/[^"]+">([^<]+)</a>', html)

    first = (await client.get("/console")).text
    assert len(ids(first)) == 50 and 'rel="next"' in first and 'rel="prev"' not in first
    second = (await client.get("/console?page=2")).text
    assert len(ids(second)) == 6 and 'rel="prev"' in second and 'rel="next"' not in second
    assert set(ids(first)) | set(ids(second)) == {f"g{n:02d}" for n in range(55)} | {"bug-1"}
    assert ids((await client.get("/console?agent=buggy")).text) == ["bug-1"]
    assert sorted(ids((await client.get("/console?q=G5")).text)) == [f"g5{n}" for n in range(5)]
    assert ids((await client.get("/console?status=completed")).text) == []
    filtered = (await client.get("/console?agent=gate&page=1")).text
    assert 'href="/console?agent=gate&amp;page=2"' in filtered
    rows = (await client.get("/console/rows?agent=buggy")).text
    assert ids(rows) == ["bug-1"]
    reason = (await harness.store.get_task("bug-1")).reason
    assert reason and f'class="reason" title="{reason[:40]}' in rows.replace("&#39;", "'")
    assert re.search(r'<span class="ago" title="\d{4}-\d\d-\d\dT[^"]+">(just now|\d+ s ago)<',
                     rows)


async def test_limits_are_visible_in_metrics_the_console_and_the_cli(
        api: tuple[httpx.AsyncClient, tt.Harness], tmp_path: Path) -> None:
    """Issue 19: a limit in use, with a task held back and a 429's block, as /metrics, the
    console's list and `tether limits` show it."""
    client, harness = api
    harness.limit("provider", concurrency=1)
    holder = await harness.submit("gate", task_id="holder")
    waiter = await harness.submit("gate", task_id="waiter")
    now = time.time()
    claims = [await harness.store.claim_task(t, "w1", now, 30) for t in (holder, waiter)]
    requests = [LimitRequest("provider", "", c.task_id, c.fence, c.task_id, concurrency=1)
                for c in claims if c is not None]
    assert (await harness.store.acquire_limit(requests[0], now)).granted
    assert not (await harness.store.acquire_limit(requests[1], now)).granted
    await harness.store.block_limit("provider", "", now + 120, now)

    metrics = (await client.get("/metrics", headers=auth(READER))).text
    assert 'tether_limit_in_use{key="",limit="provider"} 1.0' in metrics
    assert 'tether_limit_waiting{key="",limit="provider"} 1.0' in metrics
    blocked = re.search(r'tether_limit_blocked_seconds\{key="",limit="provider"\} ([\d.]+)',
                        metrics)
    assert blocked and 100 < float(blocked[1]) <= 120
    origin = await sign_in(client, READER)
    listing = (await client.get("/console", headers=origin)).text
    assert 'id="limits"' in listing and "<td>provider</td>" in listing

    result = await asyncio.to_thread(  # the CLI runs its own event loop
        CliRunner().invoke, main, ["--store", harness.store_url or "", "limits"],
        env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "provider" in line)
    assert "1 at once" in row  # as the admitting worker defined it; the CLI has no app
    assert [cell for cell in row.replace("│", " ").split() if cell.isdigit()][:2] == ["1", "1"]


async def test_delete_over_http_and_from_the_console(
        api: tuple[httpx.AsyncClient, tt.Harness]) -> None:
    """Issue 19: an operator deletes a task (the API's DELETE, the console's form with its
    box ticked); a read token cannot; a task a worker holds is refused with 409."""
    client, harness = api
    await harness.submit("gate", task_id="d1")
    await harness.submit("gate", task_id="d2")
    await harness.submit("gate", task_id="held")
    await harness.run_until_idle(timeout=5)
    assert (await client.delete("/api/tasks/d1", headers=auth(READER))).status_code == 403
    gone = await client.delete("/api/tasks/d1", headers=auth(OPERATOR))
    assert gone.status_code == 200 and gone.json() == {"deleted": "d1"}
    assert (await client.delete("/api/tasks/d1", headers=auth(OPERATOR))).status_code == 404
    assert await harness.store.claim_task("held", "w-elsewhere", time.time(), 30) is not None
    busy = await client.delete("/api/tasks/held", headers=auth(OPERATOR))
    assert busy.status_code == 409 and "w-elsewhere" in busy.json()["error"]

    origin = await sign_in(client, OPERATOR)
    page = await client.get("/console/tasks/d2")
    assert 'action="/console/tasks/d2/delete"' in page.text
    assert 'action="/console/tasks/held/delete"' not in (await client.get(
        "/console/tasks/held")).text  # held by a worker: no such form
    unticked = await client.post("/console/tasks/d2/delete", headers=origin,
                                 data={"csrf": csrf_of(page.text)})
    assert unticked.status_code == 303 and (await harness.store.get_task("d2"))
    done = await client.post("/console/tasks/d2/delete", headers=origin,
                             data={"csrf": csrf_of(page.text), "sure": "1"})
    assert done.status_code == 303 and done.headers["location"] == "/console"
    assert "task d2 deleted" in (await client.get("/console")).text
    with pytest.raises(tt.TaskNotFound):
        await harness.store.get_task("d2")


async def test_schedules_over_http_and_in_the_console(
        api: tuple[httpx.AsyncClient, tt.Harness]) -> None:
    """Issue 19: create, list, pause, resume, run now and delete a schedule over the API
    (operators only), and pause and run it from the console's schedules page."""
    client, harness = api
    body = {"cron": "0 9 * * 1-5", "agent": "priced", "timezone": "Europe/Paris"}
    assert (await client.put("/api/schedules/weekday", json=body,
                             headers=auth(READER))).status_code == 403
    made = await client.put("/api/schedules/weekday", json=body, headers=auth(OPERATOR))
    assert made.status_code == 200 and made.json()["next_at"] > time.time()
    bad = await client.put("/api/schedules/weekday", json={**body, "cron": "9am"},
                           headers=auth(OPERATOR))
    assert bad.status_code == 422 and "not a cron expression" in bad.json()["error"]
    never = await client.put("/api/schedules/weekday", json={**body, "cron": "0 0 30 2 *"},
                             headers=auth(OPERATOR))
    assert never.status_code == 422 and "never fires" in never.json()["error"]
    zone = await client.put("/api/schedules/x", json={**body, "timezone": "../../etc/passwd"},
                            headers=auth(OPERATOR))
    assert zone.status_code == 422 and "unknown time zone" in zone.json()["error"]
    listed = (await client.get("/api/schedules", headers=auth(READER))).json()
    assert [s["name"] for s in listed] == ["weekday"]
    paused = await client.post("/api/schedules/weekday/pause", headers=auth(OPERATOR))
    assert paused.json()["paused"] is True
    run = await client.post("/api/schedules/weekday/run", headers=auth(OPERATOR))
    assert run.json()["task_id"].startswith("weekday-now-")
    assert (await client.post("/api/schedules/nope/run",
                              headers=auth(OPERATOR))).status_code == 404

    origin = await sign_in(client, OPERATOR)
    page = await client.get("/console/schedules")
    assert "<td>weekday</td>" in page.text and "Resume" in page.text
    resumed = await client.post("/console/schedules/weekday/resume", headers=origin,
                                data={"csrf": csrf_of(page.text)})
    assert resumed.status_code == 303
    assert not (await harness.schedule_named("weekday")).paused
    assert "schedule weekday: resumed" in (await client.get("/console/schedules")).text
    gone = await client.delete("/api/schedules/weekday", headers=auth(OPERATOR))
    assert gone.json() == {"deleted": "weekday"}
    assert "No schedules yet" in (await client.get("/console/schedules")).text


def _nested_json(levels: int) -> bytes:
    return b'{"x":' * levels + b'"leaf"' + b"}" * levels


@pytest.mark.parametrize("levels", [101, 254, 3_000])
async def test_r03_r08_a_too_deep_body_is_a_422_and_nothing_is_stored(api, levels: int) -> None:  # type: ignore[no-untyped-def]
    """R3, R8 (issue 26): a task input or an event payload nested past the one bound is refused
    with 422 naming the problem (before: ~252 levels accepted and never committable, ~254 a
    500), and nothing is stored."""
    client, harness = api
    head = {**auth(OPERATOR), "content-type": "application/json"}
    created = await client.post("/api/tasks", content=b'{"agent": "gate", "task_id": "deep",'
                                b' "input": ' + _nested_json(levels) + b"}", headers=head)
    assert created.status_code == 422, created.text
    assert "nested more than 100 levels" in created.text if levels < 1_000 else \
        "JSON decode error" in created.text  # past Python's own parser's bound
    assert await harness.store.count_by_status() == {}
    await client.post("/api/tasks", json={"agent": "gate", "task_id": "t1"}, headers=auth(OPERATOR))
    sent = await client.post("/api/tasks/t1/events", content=b'{"type": "approval", "payload": '
                             + _nested_json(levels) + b"}", headers=head)
    assert sent.status_code == 422, sent.text
    assert await harness.reads.events("t1") == []


async def test_r26_a_named_token_is_who_pulls_the_lever_over_the_api_and_in_the_console(
        tmp_path: Path) -> None:
    """Issue 29: `--tokens TOKEN:operator:alice` records levers as `api:alice` and
    `console:alice` (not a hash of the token); a name for no token is refused."""
    harness = app_harness(tmp_path / "named.db")
    config = ServerConfig.from_text(f"{OPERATOR}:operator:alice,{READER}:read")
    assert config.names == {OPERATOR: "alice"} and config.tokens[READER] == "read"
    with pytest.raises(tt.ConfigurationError, match="token name"):
        ServerConfig({OPERATOR: "operator"}, names={"no-such-token-0123456789": "bob"})
    transport = httpx.ASGITransport(app=create_app(harness, config))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        await harness.submit("gate", task_id="n1")
        await harness.submit("gate", task_id="n2")
        await harness.run_until_idle(timeout=5)
        resumed = await client.post("/api/tasks/n1/resume", json={"message": "go on"},
                                    headers={"Authorization": f"Bearer {OPERATOR}"})
        assert resumed.status_code == 202
        origin = {"Origin": "http://testserver"}
        login = await client.get("/console")
        await client.post("/console/login", headers=origin,
                          data={"token": OPERATOR, "csrf": csrf_of(login.text)})
        page = (await client.get("/console/tasks/n2")).text
        await client.post("/console/tasks/n2/approve", headers=origin,
                          data=approve_form(page))
    await harness.run_until_idle(timeout=5)
    assert (await harness.get("n2")).snapshot.result["by"] == "console:alice"
    log = await harness.reads.recovery_log("n1")
    assert any("api:alice" in (r.get("detail") or "") for r in log), log
    await harness.close()


async def test_r26_the_console_approves_only_the_wait_its_page_showed(
        api: tuple[httpx.AsyncClient, tt.Harness]) -> None:
    """R26, R16: a page shows a task waiting; before the person clicks approve, the task is
    rolled back and waits again (a new wait, for what may be another call). The old page's
    approve is refused, saying the task moved on, and sends nothing; the reloaded page's is
    applied, naming the wait it showed."""
    client, harness = api
    await harness.submit("gate", task_id="t1")
    await harness.run_until_idle(timeout=5)
    origin = await sign_in(client, OPERATOR)
    shown = (await client.get("/console/tasks/t1")).text
    first = (await harness.store.list_versions("t1"))[0][0]
    await harness.rollback("t1", first)
    await harness.run_until_idle(timeout=5)
    info = await harness.get("t1")
    assert info.record.status is tt.Status.WAITING and info.snapshot.frame.wait is not None
    now_waiting = info.snapshot.frame.wait["id"]
    assert now_waiting != approve_form(shown)["wait"]

    stale = await client.post("/console/tasks/t1/approve", headers=origin,
                              data=approve_form(shown))
    assert stale.status_code == 303
    assert "no longer waits for what the page showed" in (await client.get("/console/tasks/t1")).text
    assert [e for e in await harness.store.list_events("t1") if e.event.type == "approval"] == []

    fresh = (await client.get("/console/tasks/t1")).text
    await client.post("/console/tasks/t1/approve", headers=origin, data=approve_form(fresh))
    await settled(harness, "t1", tt.Status.COMPLETED)
    result = (await harness.get("t1")).snapshot.result
    assert result["approved"] is True and result["wait"] == now_waiting


async def test_r26_the_console_and_the_api_resume_only_the_state_they_showed(
        api: tuple[httpx.AsyncClient, tt.Harness]) -> None:
    """R26: the console's resume form carries the etag of the page; after the task moved
    on (rolled back, waiting anew), the old page's resume is refused with the reason and
    sends nothing. The API's resume takes the etag too: a stale one is a 409."""
    client, harness = api
    await harness.submit("gate", task_id="t1")
    await harness.run_until_idle(timeout=5)
    origin = await sign_in(client, OPERATOR)
    shown = (await client.get("/console/tasks/t1")).text
    etag = re.search(r'action="/console/tasks/t1/resume">\s*<input type="hidden" name="csrf"'
                     r' value="[^"]+">\s*<input type="hidden" name="etag" value="([^"]+)"', shown)
    assert etag, shown[:400]
    first = (await harness.store.list_versions("t1"))[0][0]
    await harness.rollback("t1", first)
    await harness.run_until_idle(timeout=5)
    stale = await client.post("/console/tasks/t1/resume", headers=origin, data={
        "csrf": csrf_of(shown), "etag": etag.group(1), "message": "go on"})
    assert stale.status_code == 303
    assert "no longer as it was shown" in (await client.get("/console/tasks/t1")).text
    assert [e for e in await harness.store.list_events("t1") if e.event.type == "resume"] == []
    refused = await client.post("/api/tasks/t1/resume", headers=auth(OPERATOR),
                                json={"message": "go on", "etag": etag.group(1)})
    assert refused.status_code == 409 and "no longer as it was shown" in refused.text
    current = (await client.get("/api/tasks/t1", headers=auth(OPERATOR))).json()["etag"]
    accepted = await client.post("/api/tasks/t1/resume", headers=auth(OPERATOR),
                                 json={"message": "go on", "etag": current})
    assert accepted.status_code == 202, accepted.text

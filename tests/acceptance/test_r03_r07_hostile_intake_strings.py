"""R3, R6, R7, R19 (issue 26): hostile strings at the intake are refused before the store.

PostgreSQL refuses a NUL in text; tether used to hand it one from a webhook's delivery id,
an event's ``source_event_id`` or the task list's ``?q=`` and ``?agent=``, and answered 500
(the store's error). A line break in a ``source_event_id`` was stored though the guide says
printable. Each is refused now with a 422 (``InvalidInput`` for ``Harness.emit``) naming the
field, on SQLite and PostgreSQL alike, and nothing is stored. The Redis Streams intake's
share is in tests/integration/test_redis_streams.py (dead-lettered).

The server runs in this process (httpx's ASGI transport) over a real store; the PostgreSQL
cases skip locally when no server is reachable (they fail under CI), see tests/services.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

import tether as tt
from tether.web.server import ServerConfig, create_app, sign

OPERATOR = "operator-token-0123456789abcdef"
SECRET = "billing-secret-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {OPERATOR}"}
ORIGIN = {"Origin": "http://testserver"}
HOSTILE = ["nul\x00inside", "two\nlines", "carriage\rreturn", "tab\there", "esc\x1b[2J",
           "\x00"]


@pytest.fixture(params=["sqlite", "postgres"])
async def served(request: pytest.FixtureRequest, tmp_path: Any
                 ) -> AsyncIterator[tuple[httpx.AsyncClient, tt.Harness]]:
    """A gate waiting for its approval, on the store named by the parameter, and a client
    of its API (and console)."""
    url = request.getfixturevalue("pg_url") if request.param == "postgres" \
        else f"sqlite:///{tmp_path / 'intake.db'}"
    harness = tt.Harness(url, settings=tt.Settings(poll_interval=0.01))

    @harness.agent("gate")
    class Gate(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Wait("approval") if t.last_event is None else tt.Finish(t.last_event["payload"])

    await harness.submit("gate", task_id="t1")
    await harness.run_until_idle(timeout=30)  # a ceiling, met once idle (loaded PG: > 5 s)
    app = create_app(harness, ServerConfig({OPERATOR: "operator"}, {"billing": SECRET}))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client, harness
    await harness.close()


def signed(body: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    raw = orjson.dumps(body)
    stamp = str(int(time.time()))
    return raw, {"X-Tether-Timestamp": stamp, "X-Tether-Signature": sign(SECRET, stamp, raw),
                 "content-type": "application/json"}


async def sign_in(client: httpx.AsyncClient) -> str:
    """Sign in to the console as an operator; the session's CSRF token."""
    login = await client.get("/console")
    csrf = re.search(r'name="csrf" value="([^"]+)"', login.text)
    assert csrf is not None
    signed = await client.post("/console/login", data={"token": OPERATOR, "csrf": csrf.group(1)},
                               headers=ORIGIN)
    assert signed.status_code == 303, signed.text
    ours = re.search(r'name="csrf" value="([^"]+)"', (await client.get("/console")).text)
    assert ours is not None
    return ours.group(1)


async def stored_ids(harness: tt.Harness) -> list[str | None]:
    return [e.event.source_event_id for e in await harness.store.list_events("t1")]


@pytest.mark.parametrize("bad", HOSTILE)
async def test_r03_r06_a_source_event_id_that_is_not_printable_is_refused_and_nothing_stored(
        served: tuple[httpx.AsyncClient, tt.Harness], bad: str) -> None:
    """R3, R6: ``Harness.emit`` raises InvalidInput naming ``source_event_id``; the events
    route answers 422 naming it (not 500, not 202); nothing is stored, and the task still
    takes a good event under a printable id."""
    client, harness = served
    with pytest.raises(tt.InvalidInput, match=r"source_event_id.*printable"):
        await harness.emit(tt.Event("approval", "t1", {"ok": True}, source_event_id=bad))
    answer = await client.post("/api/tasks/t1/events", headers=AUTH,
                               json={"type": "approval", "source_event_id": bad})
    assert answer.status_code == 422, answer.text
    assert "source_event_id" in answer.json()["error"]
    assert "printable" in answer.json()["error"]
    assert await stored_ids(harness) == []
    good = await client.post("/api/tasks/t1/events", headers=AUTH,
                             json={"type": "approval", "source_event_id": "ext 1 (é)",
                                   "payload": "yes"})
    assert good.status_code == 202, good.text
    assert await stored_ids(harness) == ["ext 1 (é)"]


@pytest.mark.parametrize("bad", HOSTILE)
async def test_r03_r06_a_webhook_delivery_id_that_is_not_printable_is_a_422_naming_it(
        served: tuple[httpx.AsyncClient, tt.Harness], bad: str) -> None:
    """R3, R6: the delivery id becomes the event's ``source_event_id``: a NUL was a 500 on
    PostgreSQL, a line break was stored. 422 naming ``id`` now, nothing stored; the same
    delivery with a printable id is taken."""
    client, harness = served
    body, headers = signed({"id": bad, "type": "approval", "task_id": "t1", "payload": 1})
    refused = await client.post("/hooks/billing", content=body, headers=headers)
    assert refused.status_code == 422, refused.text
    assert re.search(r"\bid\b.*printable", refused.json()["error"]), refused.text
    assert await stored_ids(harness) == []
    body, headers = signed({"id": "delivery-1", "type": "approval", "task_id": "t1"})
    assert (await client.post("/hooks/billing", content=body, headers=headers)).status_code == 202
    assert await stored_ids(harness) == ["billing:delivery-1"]


@pytest.mark.parametrize("parameter", ["q", "agent"])
@pytest.mark.parametrize("bad", ["a%00b", "%00", "a%0Ab"])
async def test_r03_r07_a_search_or_agent_that_is_not_printable_is_a_422_naming_it(
        served: tuple[httpx.AsyncClient, tt.Harness], parameter: str, bad: str) -> None:
    """R3, R7: ``GET /api/tasks?q=`` or ``?agent=`` with a NUL was a 500 on PostgreSQL (the
    store's error in the body). The API answers 422 naming the parameter, and so does the
    console's list (its page and its live rows); printable searches still work."""
    client, _ = served
    answer = await client.get(f"/api/tasks?{parameter}={bad}", headers=AUTH)
    assert answer.status_code == 422, answer.text
    assert f"parameter {parameter}" in answer.json()["error"]
    assert "printable" in answer.json()["error"]
    fine = await client.get(f"/api/tasks?{parameter}={'t1' if parameter == 'q' else 'gate'}",
                            headers=AUTH)
    assert fine.status_code == 200 and [t["task_id"] for t in fine.json()["tasks"]] == ["t1"]
    await sign_in(client)
    page = await client.get(f"/console?{parameter}={bad}")
    assert page.status_code == 422 and "must be printable" in page.text, page.text[:300]
    rows = await client.get(f"/console/rows?{parameter}={bad}")
    assert rows.status_code == 422 and "must be printable" in rows.text


async def test_r03_no_client_string_that_reaches_the_store_is_a_500(
        served: tuple[httpx.AsyncClient, tt.Harness]) -> None:
    """R3: every other place a client's string reaches SQL, with a NUL in it: task ids in
    paths and bodies (``check_task_id``), schedule names in paths, a submit's agent, a
    fork's new id, a stream position. Each is a 4xx; none is a 500; nothing is stored."""
    client, harness = served
    tries = [
        ("GET", "/api/tasks/t%001", None), ("GET", "/api/tasks/t%001/history", None),
        ("GET", "/api/tasks/t%001/events", None), ("GET", "/api/tasks/t%001/versions", None),
        ("GET", "/api/tasks/t%001/recovery", None), ("GET", "/api/tasks/t%001/bundle", None),
        ("GET", "/api/tasks/t%001/stream", None), ("GET", "/api/tasks/t1/stream?after=1%00",
                                                    None),
        ("POST", "/api/tasks/t%001/events", {"type": "approval"}),
        ("POST", "/api/tasks/t%001/cancel", None), ("DELETE", "/api/tasks/t%001", None),
        ("POST", "/api/tasks", {"agent": "gate", "task_id": "new\x00"}),
        ("POST", "/api/tasks", {"agent": "ga\x00te"}),
        ("POST", "/api/tasks/t1/fork", {"task_id": "fork\x00"}),
        ("POST", "/api/tasks/t1/events", {"type": "appro\x00val"}),
        ("PUT", "/api/schedules/daily%00", {"cron": "0 9 * * *", "agent": "gate"}),
        ("PUT", "/api/schedules/daily", {"cron": "0 9 * * *", "agent": "ga\x00te"}),
        ("PUT", "/api/schedules/daily", {"cron": "0 9 * * *", "agent": "gate",
                                         "timezone": "UT\x00C"}),
        ("POST", "/api/schedules/daily%00/pause", None),
        ("POST", "/api/schedules/daily%00/run", None),
        ("DELETE", "/api/schedules/daily%00", None),
    ]
    for method, path, body in tries:
        answer = await client.request(method, path, json=body, headers=AUTH)
        assert 400 <= answer.status_code < 500, (method, path, answer.status_code, answer.text)
    assert [t.task_id for t in await harness.store.list_tasks()] == ["t1"]
    assert await stored_ids(harness) == []
    assert await harness.reads.schedules() == []


async def test_r03_the_consoles_pages_and_forms_refuse_a_nul_without_a_500(
        served: tuple[httpx.AsyncClient, tt.Harness]) -> None:
    """R3: the console's own routes that reach the store with a client's string: a task id
    in the diff page or a lever's form is a 404 page (no task can have such an id), a
    schedule name with a NUL is a message on the schedules page. None is a 500."""
    client, harness = served
    csrf = await sign_in(client)
    diff = await client.get("/console/tasks/t%001/diff?a=1&b=1")
    assert diff.status_code == 404 and "There is no task" in diff.text, diff.text[:300]
    lever = await client.post("/console/tasks/t%001/cancel", data={"csrf": csrf}, headers=ORIGIN)
    assert lever.status_code == 404 and "There is no task" in lever.text, lever.text[:300]
    paused = await client.post("/console/schedules/daily%00/pause", data={"csrf": csrf},
                               headers=ORIGIN, follow_redirects=True)
    assert paused.status_code == 200 and "must be printable" in paused.text
    assert (await harness.store.get_task("t1")).status is tt.Status.WAITING

"""Attacks on the HTTP edge (issue 13), each over real HTTP on loopback against a real store.

uvicorn serves ``tether.web.server.create_app`` on a free port. Where a client library would tidy
the request up (conflicting framing headers, ``..`` in a path, a hand-made Authorization
header), the request is written byte for byte on a plain socket instead.
"""

from __future__ import annotations

import asyncio
import contextlib
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

import tether as tt
from tether.errors import ConfigurationError
from tether.web.security import TokenTable
from tether.web.server import ServerConfig, create_app, sign

OPERATOR = "operator-token-0123456789abcdef"
READER = "reader-token-0123456789abcdef"
SECRET = "billing-secret-0123456789abcdef"
TOKENS = {OPERATOR: "operator", READER: "read"}


def unnamed(channel: str, token: str) -> str:
    """Who a token with no name is, as levers record it: the channel and a hash."""
    return TokenTable({token: "operator"}).who(channel, token)


def app_harness(path: Path) -> tt.Harness:
    """A gate that waits for an approval, and a biller whose first invoice is in doubt."""
    h = tt.Harness(f"sqlite:///{path}", settings=tt.Settings(poll_interval=0.01))
    sent: list[str] = []

    @h.agent("gate")
    class Gate(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.last_event is None:
                return tt.Reply("asking") if t.step == 0 else tt.Wait("approval")
            return tt.Finish(t.last_event["payload"])

    @h.agent("quitter")
    class Quitter(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Fail("stuck") if t.step == 0 else tt.Finish("resumed")

    @h.tool(side_effect=True)
    async def send_invoice(ctx: tt.ToolContext, customer: str) -> str:
        sent.append(customer)
        if len(sent) == 1:
            raise tt.OutcomeUnknown("the mail gateway timed out after accepting the request")
        return f"invoice sent to {customer}"

    @h.agent("biller")
    class Biller(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.step == 0:
                return tt.ToolCall("send_invoice", {"customer": t.input["customer"]})
            return tt.Finish(t.last_tool_result)

    return h


@contextlib.asynccontextmanager
async def serving(harness: tt.Harness, config: ServerConfig) -> AsyncIterator[int]:
    """uvicorn on a free loopback port in this event loop; yields the port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(create_app(harness, config), host="127.0.0.1",
                                           port=port, log_level="error"))
    serve = asyncio.create_task(server.serve())
    while not server.started:
        if serve.done():
            serve.result()
            raise RuntimeError("uvicorn stopped before it started")
        await asyncio.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        await serve


Served = tuple[httpx.AsyncClient, tt.Harness, int]


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Served]:
    harness = app_harness(tmp_path / "api.db")
    config = ServerConfig(TOKENS, {"billing": SECRET}, tolerance=300, max_body=1024)
    async with serving(harness, config) as port, httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}") as client:
        yield client, harness, port
    await harness.close()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def raw(port: int, request: bytes, local: str = "127.0.0.1"
              ) -> tuple[int, dict[str, str], bytes]:
    """Send *request* as it is on a fresh connection; the answer's status, headers and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(local, 0))
    try:
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in filter(None, lines):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        return int(status_line.split()[1]), headers, body
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def chunked(body: bytes, size: int = 256) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size])
             for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


def hook(body: dict[str, Any], timestamp: str | None = None, secret: str = SECRET
         ) -> tuple[bytes, dict[str, str]]:
    raw_body = orjson.dumps(body)
    stamp = timestamp if timestamp is not None else str(int(time.time()))
    return raw_body, {"X-Tether-Timestamp": stamp, "X-Tether-Signature": sign(secret, stamp, raw_body),
                      "content-type": "application/json"}


# --------------------------------------------------------------------------- 1. body limit


async def test_both_content_length_and_transfer_encoding_are_refused_as_smuggling(api: Served
                                                                                   ) -> None:
    client, _, port = api
    body = orjson.dumps({"agent": "gate", "task_id": "smuggled", "input": "x" * 3000})
    for token in ("", OPERATOR):
        header = f"Authorization: Bearer {token}\r\n" if token else ""
        status, _, answer = await raw(port, (
            "POST /api/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"{header}Content-Length: 20\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
            + chunked(body))
        assert status == 400, answer
        assert b"Content-Length" in answer and b"Transfer-Encoding" in answer
    assert (await client.get("/api/tasks/smuggled", headers=auth(READER))).status_code == 404


async def test_a_chunked_body_is_bounded_by_the_bytes_actually_read(api: Served) -> None:
    client, _, port = api
    head = ("POST /api/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {OPERATOR}\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    over = orjson.dumps({"agent": "gate", "task_id": "big", "input": "x" * 3000})
    status, _, answer = await raw(port, head + chunked(over))
    assert status == 413 and b"1024 bytes" in answer
    assert (await client.get("/api/tasks/big", headers=auth(READER))).status_code == 404
    under = orjson.dumps({"agent": "gate", "task_id": "small", "input": "x" * 100})
    status, _, answer = await raw(port, head + chunked(under, size=16))
    assert status == 201, answer  # a chunked body within the limit is fine: it is counted
    declared = await client.post("/api/tasks", content=b"x" * 2000, headers=auth(OPERATOR))
    assert declared.status_code == 413


# --------------------------------------------------------------------------- 2-4. tokens


async def test_the_token_is_checked_before_the_body_is_read(api: Served) -> None:
    client, _, _ = api
    junk = {"content-type": "application/json"}
    anonymous = await client.post("/api/tasks", content=b"{not json", headers=junk)
    assert anonymous.status_code == 401, anonymous.text
    reader = await client.post("/api/tasks", content=b"{not json", headers=dict(junk, **auth(READER)))
    assert reader.status_code == 403, reader.text
    too_big = await client.post("/api/tasks", content=b"x" * 5000, headers=junk)
    assert too_big.status_code == 401


@pytest.mark.parametrize(("header", "status"), [
    (f"Bearer {READER}", 200), (f"bearer {READER}", 200), (f"BEARER {READER}", 200),
    (READER, 401), (f"Basic {READER}", 401), ("Bearer", 401), ("Bearer ", 401),
    (f"Bearer  {READER}", 401), (f"Bearer {READER} extra", 401), (f"Token {READER}", 401),
    (f"Bearer {READER[:-1]}", 401), (f"Bearer {READER}x", 401),
])
async def test_the_authorization_header_is_exactly_bearer_and_a_token(
        api: Served, header: str, status: int) -> None:
    _, _, port = api
    got, _, body = await raw(port, ("GET /api/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                    f"Authorization: {header}\r\nConnection: close\r\n\r\n").encode())
    assert got == status, body


def test_tokens_shorter_than_16_bytes_are_refused_at_start_up() -> None:
    for tokens in ({"short-secret": "operator"}, {OPERATOR: "operator", "tiny": "read"}):
        with pytest.raises(ConfigurationError) as refused:
            ServerConfig(tokens)
        assert "16" in str(refused.value)
        assert "short-secret" not in str(refused.value) and "tiny" not in str(refused.value)
    with pytest.raises(ConfigurationError) as refused:
        ServerConfig.from_text("s3cr3t-value:operator")
    assert "16" in str(refused.value) and "s3cr3t" not in str(refused.value)
    with pytest.raises(ConfigurationError) as refused:
        ServerConfig.from_text("s3cr3t-value-long-enough:admin")
    assert "s3cr" not in str(refused.value)
    assert ServerConfig.from_text(f"{OPERATOR}:operator").tokens == {OPERATOR: "operator"}


# --------------------------------------------------------------------------- 5. rate limits


def get_tasks(token: str | None) -> bytes:
    """``GET /api/tasks`` on its own connection, with *token* (or no Authorization at all)."""
    header = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    return (f"GET /api/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n{header}Connection: close\r\n"
            "\r\n").encode()


def from_address(port: int, local: str) -> httpx.AsyncClient:
    """A client whose connections come from *local* (another address on loopback)."""
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                             transport=httpx.AsyncHTTPTransport(local_address=local))


WRONG = "wrong-token-0123456789"


async def test_failed_credentials_are_rate_limited_per_client(tmp_path: Path) -> None:
    """Wrong tokens, wrong sign-in tokens and wrong webhook signatures count, client by
    client: the eleventh wrong one within the window is a 429 with Retry-After."""
    harness = app_harness(tmp_path / "limits.db")
    config = ServerConfig(TOKENS, {"billing": SECRET}, failure_limit=10, failure_window=3600)
    async with serving(harness, config) as port:
        for _ in range(20):  # successes are never counted
            assert (await raw(port, get_tasks(READER)))[0] == 200
        for _ in range(10):
            assert (await raw(port, get_tasks(WRONG)))[0] == 401
        status, headers, body = await raw(port, get_tasks(WRONG))
        assert status == 429 and int(headers["retry-after"]) > 0, body
        assert (await raw(port, get_tasks("Bearer-less-junk")))[0] == 429  # malformed: presented
        # another client is not affected
        assert (await raw(port, get_tasks(WRONG), local="127.0.0.2"))[0] == 401
        # sign-in failures and webhook signature failures count too, client by client
        async with from_address(port, "127.0.0.3") as console:
            for _ in range(10):
                refused = await sign_in(console, WRONG)
                assert refused.status_code == 401 and "not valid" in refused.text
            limited = await sign_in(console, WRONG)
            assert limited.status_code == 429 and int(limited.headers["retry-after"]) > 0
            assert "too many failed credentials" in limited.text
        assert (await raw(port, get_tasks(WRONG), local="127.0.0.3"))[0] == 429
        body_, hook_headers = hook({"id": "e1", "type": "approval", "task_id": "t1"},
                                   secret="not-the-secret-0123456789")
        async with from_address(port, "127.0.0.4") as sender:
            for _ in range(10):
                wrong = await sender.post("/hooks/billing", content=body_, headers=hook_headers)
                assert wrong.status_code == 401, wrong.text
            limited = await sender.post("/hooks/billing", content=body_, headers=hook_headers)
            assert limited.status_code == 429 and int(limited.headers["retry-after"]) > 0
    await harness.close()


async def test_r26_a_valid_credential_is_never_refused_for_its_addresses_failures(
        tmp_path: Path) -> None:
    """R26, issue 26: everyone behind one proxy shares an address. Once a guesser there is
    limited, the guesser still gets 429, but a person holding a valid token, a valid sign-in
    or a correctly signed webhook is served as if nothing had happened."""
    harness = app_harness(tmp_path / "proxy.db")
    await harness.submit("gate", task_id="t1")
    await harness.run_until_idle()
    config = ServerConfig(TOKENS, {"billing": SECRET}, failure_limit=10, failure_window=3600)
    async with serving(harness, config) as port, from_address(port, "127.0.0.5") as client:
        for _ in range(11):
            await raw(port, get_tasks(WRONG), local="127.0.0.5")
        assert (await raw(port, get_tasks(WRONG), local="127.0.0.5"))[0] == 429
        for _ in range(3):  # the limit stays, and so does the person's access
            assert (await raw(port, get_tasks(READER), local="127.0.0.5"))[0] == 200
        emitted = await client.post("/api/tasks/t1/events", headers=auth(OPERATOR),
                                    json={"type": "progress", "payload": "from behind the proxy"})
        assert emitted.status_code == 202, emitted.text
        assert (await sign_in(client, WRONG)).status_code == 429
        signed = await sign_in(client, READER)
        assert signed.status_code == 303, signed.text
        assert "t1" in (await client.get("/console")).text  # the session works too
        body, headers = hook({"id": "d1", "type": "approval", "task_id": "t1"})
        delivered = await client.post("/hooks/billing", content=body, headers=headers)
        assert delivered.status_code == 202, delivered.text
        assert (await raw(port, get_tasks(WRONG), local="127.0.0.5"))[0] == 429
    await harness.close()


async def test_r26_requests_without_a_credential_are_never_counted_as_failures(
        tmp_path: Path) -> None:
    """R26, issue 26: a browser on the console asks for /favicon.ico on every page, without
    a token. Thirty such requests (and as many without any credential: no Authorization
    header, a console page without a session, an empty sign-in, a webhook without its
    signature headers) lock nobody out: a valid token is served afterwards, and the first
    wrong token is still only a 401, since nothing was counted."""
    harness = app_harness(tmp_path / "favicon.db")
    config = ServerConfig(TOKENS, {"billing": SECRET}, failure_limit=10, failure_window=3600)
    async with serving(harness, config) as port, from_address(port, "127.0.0.6") as client:
        for _ in range(30):
            icon = await client.get("/favicon.ico")
            assert icon.status_code == 200 and icon.content[:4] == b"\x00\x00\x01\x00"
        for _ in range(15):
            assert (await raw(port, get_tasks(None), local="127.0.0.6"))[0] == 401
            assert (await client.get("/robots.txt")).status_code == 401
            assert (await client.get("/console/rows")).status_code == 401
            assert (await client.post("/hooks/billing", json={})).status_code == 422
        for _ in range(12):
            empty = await sign_in(client, "")
            assert empty.status_code == 401 and "Paste an API token" in empty.text
        served = await raw(port, get_tasks(READER), local="127.0.0.6")
        assert served[0] == 200, served
        assert (await raw(port, get_tasks(WRONG), local="127.0.0.6"))[0] == 401
    await harness.close()


async def test_r26_the_console_serves_its_icon_to_anyone_cacheably(api: Served) -> None:
    """R26, issue 26: the icon needs no credential, is an image of the type it says, may be
    cached for a day, and every console page links to it."""
    client, _, _ = api
    ico = await client.get("/favicon.ico")
    assert ico.status_code == 200 and ico.headers["content-type"] == "image/x-icon"
    assert ico.content[:6] == b"\x00\x00\x01\x00\x01\x00"  # an ICO holding one image
    assert ico.content[6:8] == b"\x10\x10"  # of 16x16 pixels
    assert len(ico.content) == 22 + 40 + 16 * 16 * 4 + 16 * 4
    svg = await client.get("/favicon.svg")
    assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"
    assert svg.content.startswith(b"<svg") and b"<script" not in svg.content
    for answer in (ico, svg):
        assert "public" in answer.headers["cache-control"]
        assert "max-age=86400" in answer.headers["cache-control"]
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert "set-cookie" not in answer.headers
    assert '<link rel="icon" href="/favicon.svg"' in (await client.get("/console")).text
    await sign_in(client, READER)
    assert '<link rel="icon" href="/favicon.svg"' in (await client.get("/console")).text


# --------------------------------------------------------------------------- 6. console


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:400]
    return found.group(1)


async def sign_in(client: httpx.AsyncClient, token: str, origin: str | None = None) -> httpx.Response:
    page = await client.get("/console")
    origin = origin or str(client.base_url).rstrip("/")
    return await client.post("/console/login", data={"token": token, "csrf": csrf_of(page.text)},
                             headers={"Origin": origin})


async def test_the_console_session_cookie_is_not_the_token(api: Served) -> None:
    client, _, _ = api
    signed = await sign_in(client, OPERATOR)
    assert signed.status_code == 303
    cookie = signed.headers["set-cookie"]
    assert OPERATOR not in cookie and "tether_session=" in cookie
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie.replace("strict", "Strict")
    assert "Max-Age=28800" in cookie and "Secure" not in cookie
    assert "Timeline" not in (await client.get("/console")).text
    assert "Sign out" in (await client.get("/console")).text

    behind_tls = httpx.AsyncClient(base_url=client.base_url,
                                   headers={"X-Forwarded-Proto": "https"})
    async with behind_tls:
        page = await behind_tls.get("/console")
        assert "Secure" in page.headers["set-cookie"]  # the sign-in form's cookie too
        login_cookie = page.headers["set-cookie"].split(";")[0]  # httpx keeps Secure ones for https
        secure = await behind_tls.post(
            "/console/login", data={"token": OPERATOR, "csrf": csrf_of(page.text)},
            headers={"Origin": f"https://{client.base_url.host}:{client.base_url.port}",
                     "Cookie": login_cookie})
        assert secure.status_code == 303 and "Secure" in secure.headers["set-cookie"]


async def test_console_posts_need_the_same_origin_and_the_session_csrf_token(api: Served) -> None:
    client, harness, _ = api
    await harness.submit("gate", task_id="t1")
    await harness.run_until_idle()
    await sign_in(client, OPERATOR)
    page = await client.get("/console/tasks/t1")
    token = csrf_of(page.text)
    origin = str(client.base_url).rstrip("/")
    attempts = [
        ({}, {}),  # a cross-site form with no Origin or Referer
        ({"Origin": "http://evil.example"}, {"csrf": token}),
        ({"Origin": "null"}, {"csrf": token}),
        ({"Referer": "http://evil.example/page"}, {"csrf": token}),
        ({"Origin": origin}, {}),
        ({"Origin": origin}, {"csrf": "0" * len(token)}),
    ]
    for headers, form in attempts:
        refused = await client.post("/console/tasks/t1/cancel", data=form, headers=headers)
        assert refused.status_code == 403, (headers, form, refused.text)
        assert (await harness.store.get_task("t1")).status is tt.Status.WAITING
    done = await client.post("/console/tasks/t1/cancel", data={"csrf": token},
                             headers={"Referer": f"{origin}/console/tasks/t1"})
    assert done.status_code == 303
    assert (await harness.store.get_task("t1")).status is tt.Status.CANCELLED
    cross = await sign_in(client, OPERATOR, origin="http://evil.example")
    assert cross.status_code == 403 and "set-cookie" not in cross.headers


async def test_signing_out_ends_the_session(api: Served) -> None:
    client, _, port = api
    signed = await sign_in(client, READER)
    session = signed.cookies["tether_session"]
    token = csrf_of((await client.get("/console")).text)
    out = await client.post("/console/logout", data={"csrf": token},
                            headers={"Origin": str(client.base_url).rstrip("/")})
    assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]
    status, _, body = await raw(port, ("GET /console HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                       f"Cookie: tether_session={session}\r\nConnection: close"
                                       "\r\n\r\n").encode())
    assert status == 200 and b"Sign in" in body  # the old cookie opens nothing any more


# --------------------------------------------------------------------------- 7. docs


async def test_the_openapi_schema_needs_a_read_token_and_docs_pages_are_off(api: Served) -> None:
    client, _, _ = api
    assert (await client.get("/openapi.json")).status_code == 401
    assert (await client.get("/openapi.json", headers=auth(READER))).json()["info"]["title"] == "tether"
    for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert (await client.get(page)).status_code in (401, 404)
        assert (await client.get(page, headers=auth(READER))).status_code == 404
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get("/console")).status_code == 200


# --------------------------------------------------------------------------- 8. error bodies


async def test_error_bodies_never_show_server_paths(tmp_path: Path) -> None:
    db = tmp_path / "not-a-store.db"
    db.write_bytes(b"this is not a SQLite database" * 100)
    harness = app_harness(db)
    async with serving(harness, ServerConfig(TOKENS)) as port, httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}") as client:
        answer = await client.get("/api/tasks", headers=auth(READER))
        assert answer.status_code >= 500
        message = answer.json()["error"]
        assert str(tmp_path) not in message and "<path>" in message, message


# --------------------------------------------------------------------------- 9. webhooks


@pytest.mark.parametrize("stamp", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999", "-1e999",
                                   "1e308", "", "1.7e9", "+1700000000", "0x10", "1_700_000_000"])
async def test_a_webhook_timestamp_must_be_a_finite_time_near_now(api: Served, stamp: str) -> None:
    client, harness, _ = api
    await harness.submit("gate", task_id="t1")
    body, headers = hook({"id": "evt-1", "type": "approval", "task_id": "t1"}, timestamp=stamp)
    refused = await client.post("/hooks/billing", content=body, headers=headers)
    assert refused.status_code == 401, refused.text
    assert await harness.store.list_events("t1") == []


async def test_a_webhook_cannot_pull_a_lever(api: Served) -> None:
    client, harness, _ = api
    await harness.submit("gate", task_id="t1")
    await harness.run_until_idle()
    for lever in ("cancel", "resume", "rollback", "decide", "task_timeout", "timer"):
        body, headers = hook({"id": f"x-{lever}", "type": lever, "task_id": "t1", "payload": {}})
        refused = await client.post("/hooks/billing", content=body, headers=headers)
        assert refused.status_code == 403, refused.text
        assert lever in refused.json()["error"] and "billing" in refused.json()["error"]
    assert (await harness.store.get_task("t1")).status is tt.Status.WAITING
    assert await harness.store.list_events("t1") == []
    body, headers = hook({"id": "ok", "type": "approval", "task_id": "t1", "payload": 1})
    assert (await client.post("/hooks/billing", content=body, headers=headers)).status_code == 202


async def test_each_webhook_source_sends_only_the_types_it_is_allowed(tmp_path: Path) -> None:
    from tether.web.server import WebhookSource

    harness = app_harness(tmp_path / "hooks.db")
    config = ServerConfig.from_text(f"{OPERATOR}:operator",
                                    f"github:{SECRET}:approval|upstream_ready,billing:{SECRET}:*")
    assert config.webhook_sources["github"] == WebhookSource(SECRET, frozenset({"approval",
                                                                               "upstream_ready"}))
    await harness.submit("gate", task_id="t1")
    async with serving(harness, config) as port, httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}") as client:
        body, headers = hook({"id": "1", "type": "user_message", "task_id": "t1"})
        refused = await client.post("/hooks/github", content=body, headers=headers)
        assert refused.status_code == 403
        assert "user_message" in refused.json()["error"] and "github" in refused.json()["error"]
        assert (await client.post("/hooks/billing", content=body, headers=headers)).status_code == 202
        body, headers = hook({"id": "2", "type": "approval", "task_id": "t1"})
        assert (await client.post("/hooks/github", content=body, headers=headers)).status_code == 202
    await harness.close()
    for text in (f"github:{SECRET}:approval|cancel", f"github:{SECRET}:timer"):
        with pytest.raises(ConfigurationError, match="reserved"):
            ServerConfig.from_text(f"{OPERATOR}:operator", text)
    with pytest.raises(ConfigurationError, match="reserved"):
        ServerConfig(TOKENS, {"x": WebhookSource(SECRET, frozenset({"resume"}))})
    legacy = ServerConfig.from_text(f"{OPERATOR}:operator", f"billing:{SECRET}")
    assert legacy.webhook_sources["billing"].secret == SECRET


@pytest.mark.parametrize("field", ["id", "task_id", "type"])
@pytest.mark.parametrize("value", ["", "x" * 300, 12, None, ["a"]])
async def test_webhook_ids_are_short_non_empty_strings(api: Served, field: str, value: Any) -> None:
    client, harness, _ = api
    await harness.submit("gate", task_id="t1")
    body, headers = hook({"id": "evt-1", "type": "approval", "task_id": "t1", field: value})
    refused = await client.post("/hooks/billing", content=body, headers=headers)
    assert refused.status_code == 422 and field in refused.json()["error"], refused.text
    assert await harness.store.list_events("t1") == []


async def test_the_generic_events_route_refuses_levers_and_names_their_route(api: Served) -> None:
    client, harness, _ = api
    await harness.submit("gate", task_id="t1")
    await harness.run_until_idle()
    for lever, route in (("cancel", "/cancel"), ("resume", "/resume"), ("rollback", "/rollback"),
                         ("decide", "/decide"), ("task_timeout", "harness"), ("timer", "harness")):
        refused = await client.post("/api/tasks/t1/events", json={"type": lever, "payload": {}},
                                    headers=auth(OPERATOR))
        assert refused.status_code == 403, refused.text
        assert route in refused.json()["error"]
    assert (await harness.store.get_task("t1")).status is tt.Status.WAITING


# --------------------------------------------------------------------------- 10. decide


async def parked_invoice(harness: tt.Harness, task_id: str = "inv") -> None:
    await harness.submit("biller", {"customer": "ACME"}, task_id=task_id)
    await harness.run_until_idle()
    info = await harness.get(task_id)
    assert info.record.status is tt.Status.NEEDS_HUMAN and info.snapshot.call is not None
    assert info.snapshot.call.status == "started"


async def test_an_operator_decides_an_in_doubt_call_over_http(api: Served) -> None:
    client, harness, _ = api
    await parked_invoice(harness)
    for bad in ({"outcome": "maybe"}, {"outcome": "skip", "result": 1}, {}, {"outcome": None}):
        answer = await client.post("/api/tasks/inv/decide", json=bad, headers=auth(OPERATOR))
        assert answer.status_code == 422, (bad, answer.text)
    assert (await client.post("/api/tasks/inv/decide", json={"outcome": "skip"},
                              headers=auth(READER))).status_code == 403
    decided = await client.post("/api/tasks/inv/decide",
                                json={"outcome": "happened", "result": "invoice 42 sent"},
                                headers=auth(OPERATOR))
    assert decided.status_code == 202, decided.text
    await harness.run_until_idle()
    info = await harness.get("inv")
    assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == "invoice 42 sent"
    events = (await client.get("/api/tasks/inv/events", headers=auth(READER))).json()
    by = [e["payload"].get("by") for e in events if e["type"] == "decide"]
    assert by == [unnamed("api", OPERATOR)]
    again = await client.post("/api/tasks/inv/decide", json={"outcome": "skip"},
                              headers=auth(OPERATOR))
    assert again.status_code == 409, again.text


async def test_r26_a_decision_names_the_etag_it_was_shown_and_a_stale_one_is_refused(
        api: Served) -> None:
    """R26: GET gives the task's etag; a decision sent with an etag the task no longer has
    (here: the call was decided and the task moved on) is a 409 naming it, nothing stored."""
    client, harness, _ = api
    await parked_invoice(harness)
    shown = (await client.get("/api/tasks/inv", headers=auth(READER))).json()
    assert shown["etag"] == (await harness.get("inv")).etag
    wrong = await client.post("/api/tasks/inv/decide", json={"outcome": "skip", "etag": "0" * 16},
                              headers=auth(OPERATOR))
    assert wrong.status_code == 409 and "no longer as it was shown" in wrong.text, wrong.text
    assert await harness.store.list_events("inv") == []
    right = await client.post("/api/tasks/inv/decide",
                              json={"outcome": "happened", "result": 1, "etag": shown["etag"]},
                              headers=auth(OPERATOR))
    assert right.status_code == 202, right.text


async def test_levers_record_who_pulled_them_without_the_token(api: Served) -> None:
    client, harness, _ = api
    await harness.submit("quitter", task_id="q1")
    await harness.run_until_idle()
    assert (await harness.store.get_task("q1")).status is tt.Status.FAILED
    resumed = await client.post("/api/tasks/q1/resume", json={"message": "go on"},
                                headers=auth(OPERATOR))
    assert resumed.status_code == 202, resumed.text
    await harness.submit("gate", task_id="t1")
    await harness.run_until_idle()
    assert (await client.post("/api/tasks/t1/cancel", headers=auth(OPERATOR))).status_code == 202
    pulled = [e for task in ("q1", "t1") for e in await harness.store.list_events(task)]
    assert {(e.event.type, e.event.payload["by"]) for e in pulled} == {
        ("resume", unnamed("api", OPERATOR)), ("cancel", unnamed("api", OPERATOR))}
    text = (await client.get("/api/tasks/q1/events", headers=auth(READER))).text
    assert OPERATOR not in text and READER not in text


async def test_the_console_offers_the_three_decisions_for_an_in_doubt_call(api: Served) -> None:
    client, harness, _ = api
    await parked_invoice(harness)
    await harness.submit("gate", task_id="plain")
    await harness.run_until_idle()
    await sign_in(client, OPERATOR)
    assert 'action="/console/tasks/plain/decide"' not in (await client.get("/console/tasks/plain")).text
    page = (await client.get("/console/tasks/inv")).text
    assert 'action="/console/tasks/inv/decide"' in page
    for outcome in ("happened", "not_happened", "skip"):
        assert f'value="{outcome}"' in page
    origin = {"Origin": str(client.base_url).rstrip("/")}
    no_token = await client.post("/console/tasks/inv/decide", data={"outcome": "skip"},
                                 headers=origin)
    assert no_token.status_code == 403
    bad_json = await client.post("/console/tasks/inv/decide", headers=origin, data={
        "outcome": "happened", "result": "{not json", "csrf": csrf_of(page)})
    assert bad_json.status_code == 303
    assert (await harness.store.get_task("inv")).status is tt.Status.NEEDS_HUMAN
    decided = await client.post("/console/tasks/inv/decide", headers=origin, data={
        "outcome": "not_happened", "result": "", "csrf": csrf_of(page)})
    assert decided.status_code == 303
    await harness.run_until_idle()
    info = await harness.get("inv")
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result == "invoice sent to ACME"
    events = await harness.store.list_events("inv")
    assert [e.event.payload.get("by") for e in events if e.event.type == "decide"] == [
        unnamed("console", OPERATOR)]


# --------------------------------------------------------------------------- 11-12. inputs


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/api/tasks/t1/rollback", {"version": 2**70}),
    ("POST", "/api/tasks/t1/rollback", {"version": 2**63}),
    ("POST", "/api/tasks/t1/rollback", {"version": 0}),
    ("POST", "/api/tasks/t1/rollback", {"version": -(2**70)}),
    ("POST", "/api/tasks/t1/events", {"type": "approval", "priority": 2**70}),
    ("POST", "/api/tasks", {"agent": "gate", "deadline": 1e300}),
    ("POST", "/api/tasks", {"agent": "gate", "not_before": -5}),
    ("POST", "/api/tasks", {"agent": "gate", "input": 2**70}),
    ("GET", f"/api/tasks/t1/history?offset={2**70}", None),
    ("GET", f"/api/tasks?limit={2**70}", None),
    ("GET", f"/console/tasks/t1/diff?a=1&b={2**70}", None),
])
async def test_integers_too_large_for_the_store_are_a_4xx(
        api: Served, method: str, path: str, body: Any) -> None:
    client, harness, _ = api
    await harness.submit("gate", task_id="t1")
    if path.startswith("/console"):
        await sign_in(client, READER)
    answer = await client.request(method, path, json=body, headers=auth(OPERATOR))
    assert answer.status_code < 500, answer.text
    if path.startswith("/api") and "history" not in path:
        assert 400 <= answer.status_code < 500, answer.text


@pytest.mark.parametrize("body", [
    b'{"agent": "gate", "input": NaN}', b'{"agent": "gate", "input": [Infinity]}',
    b'{"agent": "gate", "input": -Infinity}', b'{"agent": "gate", "deadline": NaN}',
    b'{"agent": "gate", "not_before": Infinity}', b'{"agent": "gate", "input": 1e999}',
    b'{"agent": "gate", "input": ' + b"[" * 400 + b"]" * 400 + b"}",
    b'{"agent": "gate", "input": "\xff\xfe"}', b'{"agent": "gate", "input": 18446744073709551616}',
])
async def test_non_finite_numbers_in_a_json_body_are_refused(api: Served, body: bytes) -> None:
    client, harness, _ = api
    answer = await client.post("/api/tasks", content=body,
                               headers=dict(auth(OPERATOR), **{"content-type": "application/json"}))
    assert answer.status_code == 422, answer.text
    assert await harness.store.list_tasks(None, 10) == []


async def test_non_finite_numbers_in_a_webhook_are_refused(api: Served) -> None:
    client, harness, _ = api
    await harness.submit("gate", task_id="t1")
    raw_body = b'{"id": "e1", "type": "approval", "task_id": "t1", "payload": NaN}'
    stamp = str(int(time.time()))
    answer = await client.post("/hooks/billing", content=raw_body, headers={
        "X-Tether-Timestamp": stamp, "X-Tether-Signature": sign(SECRET, stamp, raw_body)})
    assert answer.status_code == 422, answer.text
    assert await harness.store.list_events("t1") == []


@pytest.mark.parametrize("path", ["/api/tasks/..%2Fx", "/api/tasks/%2E%2E%2Fetc%2Fpasswd",
                                  "/api/tasks/" + "a" * 300, "/api/tasks/a%00b",
                                  "/api/tasks/a%0d%0ab/history", "/console/tasks/..%2Fx",
                                  "/console/tasks/a%0d%0aSet-Cookie:x=1"])
async def test_odd_task_ids_in_paths_are_a_4xx(api: Served, path: str) -> None:
    client, _, port = api
    signed = await sign_in(client, READER)
    session = signed.cookies["tether_session"]
    status, headers, body = await raw(port, (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {READER}\r\n"
        f"Cookie: tether_session={session}\r\nConnection: close\r\n\r\n").encode())
    assert 400 <= status < 500, body
    assert "set-cookie" not in headers


@pytest.mark.parametrize("path", ["/hooks/../api/tasks", "/console/../api/tasks", "//api/tasks",
                                  "/healthz/../api/tasks", "/console/tasks/../../api/tasks",
                                  "/hooks/%2E%2E/api/tasks", "/API/tasks", "/api/tasks/"])
async def test_no_path_spelling_reaches_the_api_without_a_token(api: Served, path: str) -> None:
    _, harness, port = api
    await harness.submit("gate", task_id="t1")
    status, _, body = await raw(port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                      "Connection: close\r\n\r\n".encode())
    assert status in (401, 404, 405) and b"t1" not in body, (status, body)

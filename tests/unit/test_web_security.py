"""The HTTP edge's pure pieces (issue 13), with a fake clock: the failure limiter, console
sessions, path scrubbing, strict JSON, bearer parsing and webhook source lists. Their use
over real HTTP is in tests/integration/test_http_security.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tether.errors import ConfigurationError
from tether.web.security import (
    EdgeGuard,
    FailureLimiter,
    TokenTable,
    bearer_token,
    origin_of,
    presents_credential,
    scrub_paths,
    strict_json,
    takes_token,
    wrong_credential,
)
from tether.web.sessions import Sessions
from tether.web.webhooks import WebhookSource, parse_sources

SECRET = "billing-secret-0123456789abcdef"


def test_the_failure_limiter_forgets_old_failures_and_bounds_its_memory() -> None:
    now = [1000.0]
    limiter = FailureLimiter(limit=3, window=60, max_clients=100, clock=lambda: now[0])
    for _ in range(3):
        assert limiter.retry_after("a") is None
        limiter.failed("a")
    assert limiter.retry_after("a") == 60
    now[0] += 45
    assert limiter.retry_after("a") == 15
    now[0] += 15
    assert limiter.retry_after("a") is None and len(limiter) == 0
    for n in range(1000):
        limiter.failed(f"client-{n}")
    assert len(limiter) == 100
    assert limiter.retry_after("client-999") is None  # one failure is not a block
    for _ in range(2):
        limiter.failed("client-999")
    assert limiter.retry_after("client-999") == 60


READER = "reader-token-0123456789abcdef"


def through_guard(guard: EdgeGuard, path: str, authorization: list[str] | None = None,
                  client: str = "10.0.0.1") -> int:
    """The status a request gets through *guard* (200 when it reached the app behind)."""
    headers = [(b"authorization", value.encode()) for value in authorization or []]
    scope: dict[str, Any] = {"type": "http", "path": path, "method": "GET", "headers": headers,
                             "client": (client, 40000)}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    return int(next(m["status"] for m in sent if m["type"] == "http.response.start"))


async def reached(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_r26_only_a_presented_wrong_token_counts_and_a_valid_one_passes_a_limit() -> None:
    """Issue 26: no credential is never a failure (a favicon, a bare GET, an empty header);
    a presented wrong one is, and is a 429 once the client is limited; a valid token is
    checked first and served whatever the client's failures."""
    now = [0.0]
    limiter = FailureLimiter(limit=3, window=60, clock=lambda: now[0])
    guard = EdgeGuard(reached, TokenTable({READER: "read"}), limiter, max_body=1024)
    for _ in range(20):
        assert through_guard(guard, "/favicon.ico") == 200
        assert through_guard(guard, "/favicon.svg") == 200
        assert through_guard(guard, "/api/tasks") == 401
        assert through_guard(guard, "/robots.txt", [" "]) == 401
    assert len(limiter) == 0
    for _ in range(3):
        assert through_guard(guard, "/api/tasks", ["Bearer wrong-token-0123456789"]) == 401
    assert through_guard(guard, "/api/tasks", ["Basic d3Jvbmc="]) == 429
    assert through_guard(guard, "/api/tasks", ["Bearer wrong-token-0123456789"]) == 429
    assert through_guard(guard, "/api/tasks", [f"Bearer {READER}"]) == 200
    assert through_guard(guard, "/api/tasks", [f"Bearer {READER}"], client="10.0.0.2") == 200
    assert through_guard(guard, "/api/tasks", ["Bearer wrong"], client="10.0.0.2") == 401
    now[0] += 61
    assert through_guard(guard, "/api/tasks", ["Bearer wrong-token-0123456789"]) == 401


def test_r26_what_presents_a_credential_and_what_needs_a_token() -> None:
    assert not presents_credential([]) and not presents_credential(["", "  "])
    assert presents_credential(["Bearer x"]) and presents_credential(["junk"])
    assert not takes_token("/favicon.ico") and not takes_token("/favicon.svg")
    assert not takes_token("/healthz") and not takes_token("/console/rows")
    assert takes_token("/favicon.ico/x") and takes_token("/api/tasks") and takes_token("/robots.txt")
    limiter = FailureLimiter(limit=2, window=60, clock=lambda: 0.0)
    assert wrong_credential(limiter, "a") is None and wrong_credential(limiter, "a") is None
    refusal = wrong_credential(limiter, "a")
    assert refusal is not None and refusal.status == 429 and refusal.headers["Retry-After"] == "60"


def test_sessions_expire_and_are_bounded() -> None:
    now = [0.0]
    sessions = Sessions(ttl=100, max_sessions=3, clock=lambda: now[0])
    first = sessions.start("operator", "console:abc")
    assert sessions.get(first.id) is first and len(first.id) >= 40 and first.csrf != first.id
    now[0] = 99
    assert sessions.get(first.id) is first
    now[0] = 101
    assert sessions.get(first.id) is None
    ids = [sessions.start("read", "console:r").id for _ in range(5)]
    assert len(sessions) == 3 and sessions.get(ids[-1]) is not None
    assert sessions.get(ids[0]) is None  # the oldest went first
    sessions.end(ids[-1])
    assert sessions.get(ids[-1]) is None and sessions.get(None) is None


def test_absolute_paths_are_scrubbed_from_messages() -> None:
    assert scrub_paths('File "/usr/lib/python3.11/x.py", line 3') == 'File "<path>", line 3'
    assert scrub_paths("store sqlite:///var/lib/t.db failed") == "store sqlite:<path> failed"
    assert scrub_paths(r"at C:\Users\me\t.db: locked") == "at <path>: locked"
    assert scrub_paths(r"share \\server\share\t.db gone") == "share <path> gone"
    assert scrub_paths("'/tmp/x/api.db' is not a SQLite database") == "'<path>' is not a SQLite database"
    assert scrub_paths("task 'a/b' needs 1/2 of it") == "task 'a/b' needs 1/2 of it"


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", "-Infinity", "1e999", "[-1e400]",
                                  str(2**64), str(-(2**63) - 1), "[" * 5000 + "]" * 5000,
                                  "1" * 5000, '{"a": 1'])
def test_strict_json_refuses_what_the_standard_does_not_allow(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        strict_json(text.encode())


def test_strict_json_reads_ordinary_json() -> None:
    assert strict_json(b'{"a": [1, 2.5, null, true, "x"], "big": 18446744073709551615}') == {
        "a": [1, 2.5, None, True, "x"], "big": 2**64 - 1}
    with pytest.raises(json.JSONDecodeError):
        strict_json(b'"\xff"')


@pytest.mark.parametrize(("values", "token"), [
    (["Bearer abc"], "abc"), (["bearer abc"], "abc"), (["bEaReR abc"], "abc"),
    (["abc"], None), (["Basic abc"], None), (["Bearer"], None), (["Bearer "], None),
    (["Bearer  abc"], None), (["Bearer abc "], None), (["Bearer a b"], None),
    (["Bearer\tabc"], None), ([], None), (["Bearer abc", "Bearer abc"], None),
])
def test_bearer_tokens_are_parsed_strictly(values: list[str], token: str | None) -> None:
    assert bearer_token(values) == token


def test_the_token_table_matches_whole_tokens_only() -> None:
    table = TokenTable({"operator-token-0123456789": "operator", "reader-token-0123456789": "read"})
    assert table.role_of("operator-token-0123456789") == "operator"
    assert table.role_of("reader-token-0123456789") == "read"
    for wrong in ("operator-token-012345678", "operator-token-01234567890", "", None):
        assert table.role_of(wrong) is None


def test_origins_compare_scheme_host_and_port() -> None:
    assert origin_of("http://Example.com:80/x?y") == "http://example.com"
    assert origin_of("https://example.com:8443/") == "https://example.com:8443"
    assert origin_of("http://[::1]:8700") == "http://[::1]:8700"
    for bad in ("null", "javascript:alert(1)", "http://", "http://host:99999", "//host"):
        assert origin_of(bad) is None


def test_webhook_sources_are_parsed_with_their_lists() -> None:
    sources = parse_sources(f"github:{SECRET}:approval|upstream_ready, billing:{SECRET}:*,"
                            f"legacy:{SECRET}")
    assert sources["github"].allowed == {"approval", "upstream_ready"}
    assert sources["billing"].allows("user_message") and not sources["billing"].allows("cancel")
    assert sources["legacy"].allows("approval")
    assert not any(sources["legacy"].allows(t) for t in ("cancel", "resume", "rollback",
                                                         "decide", "task_timeout", "timer"))
    assert not sources["github"].allows("user_message")
    assert SECRET not in repr(sources["github"])
    for text in (f"x:{SECRET}:approval:more", "x", ":secret", f"x:{SECRET}:cancel",
                 "x:short-secret", f"x:{SECRET}:*|rollback"):
        with pytest.raises(ConfigurationError) as refused:
            parse_sources(text)
        assert SECRET not in str(refused.value)
    with pytest.raises(ConfigurationError):
        WebhookSource(SECRET, frozenset())

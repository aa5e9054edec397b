"""tether.client's decisions at the edges (issue 29), against an HTTP transport that plays
a server's answers and a network's failures (the whole client runs against a real `tether
serve` in tests/integration/test_client.py): what is raised for a server's "type", what a
Retry-After that is no number does, a submit that never reached the server, a stream that a
stopping server ends, and a Client refused at construction."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx
import orjson
import pytest

import tether as tt
from tether.client import AsyncClient, Client, _error, _retry_after
from tether.errors import ServerError

TOKEN = "client-unit-token-0123456789"


def answer(status: int, body: object, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, content=orjson.dumps(body), headers=headers)


def test_a_servers_type_names_only_the_api_errors() -> None:
    assert isinstance(_error(answer(404, {"error": "no task", "type": "TaskNotFound"})),
                      tt.TaskNotFound)
    for hostile in ("StoreReplaced", "LeaseLost", "CorruptStore", "RateLimited", "Exception",
                    "__class__"):
        raised = _error(answer(500, {"error": "x", "type": hostile}))
        assert type(raised) is ServerError and raised.status == 500, hostile


def test_a_retry_after_that_is_no_number_is_the_default() -> None:
    for given, expected in (("nan", 0.5), ("inf", 0.5), ("-5", 0.0), ("1e9", 60.0),
                            ("Wed, 21 Oct 2026 07:28:00 GMT", 0.5), ("2", 2.0)):
        assert _retry_after(httpx.Response(503, headers={"Retry-After": given}), 0.5) == expected


def transport(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.MockTransport:
    return httpx.MockTransport(handler)


async def test_a_submit_that_never_reached_the_server_does_not_take_someone_elses_task() -> None:
    """The first attempt could not connect; the second finds the id taken: that task is not
    this submit's (nothing of it reached the server), so TaskExists is raised."""
    tries = []

    def server(request: httpx.Request) -> httpx.Response:
        tries.append(1)
        if len(tries) == 1:
            raise httpx.ConnectError("refused", request=request)
        return answer(409, {"error": "task invoice-42 exists", "type": "TaskExists"})

    async with AsyncClient("http://tether.test", TOKEN, transport=transport(server),
                           retry_for=5) as client:
        with pytest.raises(tt.TaskExists):
            await client.submit("billing", {}, task_id="invoice-42")
    assert len(tries) == 2


async def test_a_submit_whose_answer_was_lost_finds_its_own_task() -> None:
    tries = []

    def server(request: httpx.Request) -> httpx.Response:
        tries.append(1)
        if len(tries) == 1:
            raise httpx.ReadError("connection reset after sending", request=request)
        return answer(409, {"error": "exists", "type": "TaskExists"})

    async with AsyncClient("http://tether.test", TOKEN, transport=transport(server),
                           retry_for=5) as client:
        assert await client.submit("billing", {}, task_id="invoice-43") == "invoice-43"


async def test_a_stream_a_stopping_server_ends_is_taken_up_again_after_its_retry_after() -> None:
    """The stream ends with no `end` (the server stopped), the next connection gets a 503
    with Retry-After: the client waits and takes the stream up again from its position."""
    seen: list[str | None] = []
    body_one = b"event: state\nid: 1.0\ndata: {\"status\": \"running\"}\n\n"
    body_two = b"event: end\nid: 2.0\ndata: {\"status\": \"completed\"}\n\n"

    def server(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("last-event-id"))
        if len(seen) == 1:
            return httpx.Response(200, content=body_one,
                                  headers={"content-type": "text/event-stream"})
        if len(seen) == 2:
            return answer(503, {"error": "stopping"}, {"Retry-After": "0.1"})
        return httpx.Response(200, content=body_two, headers={"content-type": "text/event-stream"})

    async with AsyncClient("http://tether.test", TOKEN, transport=transport(server),
                           retry_for=10) as client:
        kinds = [change.kind async for change in client.watch("t1")]
    assert kinds == ["state", "end"]
    assert seen == ["0.0", "1.0", "1.0"]


def test_a_client_refused_at_construction_leaves_no_thread() -> None:
    before = sum(t.name == "tether-client" for t in threading.enumerate())
    for bad in ("ftp://host", "not a url"):
        with pytest.raises(tt.ConfigurationError):
            Client(bad, TOKEN)
    with pytest.raises(tt.ConfigurationError):
        Client("http://tether.test", "")
    assert sum(t.name == "tether-client" for t in threading.enumerate()) == before

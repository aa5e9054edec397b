"""A client for a tether server (``tether serve``), for the services around tether (extra
``client``)::

    async with AsyncClient("https://tether.internal:8080", token=os.environ["TETHER_TOKEN"]) as c:
        task = await c.submit("support", "Refund order A1")
        await c.emit(task, "user_message", "STOP: do not refund A1")
        async for change in c.watch(task):
            print(change.kind, change.data)

A web backend that relays a user's "stop", or a billing job that submits tasks, needs a
token, not the store's credentials. Every route of the HTTP API has a method; a server's
error comes back as tether's own exception (``TaskNotFound``, ``IllegalTransition``...;
:class:`tether.errors.ServerError` for the rest, with its status).

- **Retries.** A request the server never received (the connection could not be made) is
  sent again, with backoff, for up to *retry_for* seconds; so is one answered 503 or 429
  (after its ``Retry-After``). A read (GET) is sent again after any transport error.
- **Idempotent by key.** ``submit`` names the task (a random id unless you give one), so a
  submit sent again after a lost answer finds its own task (the server's 409 for the same
  id is the earlier attempt's success). ``emit`` gives each event a ``source_event_id``
  (random unless you give one): the server stores a repeat once.
- **Levers** (resume, decide, rollback, cancel, delete, fork) are sent again only when the
  server never received them: a lever applied twice is not the same as once.
- **watch** is an async iterator over the task's stream (server-sent events), taken up again
  from the last position after a dropped connection, until the task ends.

:class:`Client` is the same for code that is not async: each call runs on a private event
loop thread.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import uuid
from collections.abc import AsyncGenerator, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import orjson

from tether import errors
from tether.errors import ConfigurationError, MissingExtra, ServerError, TaskExists
from tether.watching import KINDS, Change, Position

try:
    import httpx
    from httpx_sse import SSEError, aconnect_sse
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("tether.client needs httpx and httpx-sse", "client") from exc

__all__ = ["AsyncClient", "Client", "RemoteTask"]

T = TypeVar("T")
KEEP = object()
"""``resume(input=KEEP)``: the task keeps its input."""
RETRY_STATUSES = frozenset({429, 503})
API_ERRORS: tuple[type[errors.TetherError], ...] = (
    errors.TaskNotFound, errors.TaskExists, errors.TaskClosed, errors.TaskHeld,
    errors.IllegalTransition, errors.CallInFlight, errors.StaleDecision, errors.InDoubtCall,
    errors.InvalidInput, errors.UnknownAgent, errors.UnknownEventType, errors.ReservedEventType,
    errors.VersionNotFound, errors.InboxFull, errors.ScheduleNotFound)
"""The errors a server's answer may be raised as here (each takes a message alone): never a
local store's (``StoreReplaced``, ``LeaseLost``...), whatever a server's ``type`` says."""
Rows = list[dict[str, Any]]
"""Rows of the server's answers (dialog rows, versions, recovery records)."""
Counts = list[int]


@dataclass(frozen=True)
class RemoteTask:
    """A task as the server shows it: its row (``task``: status, reason, agent, ...), its
    newest version, the etag a decision names, and its snapshot as plain data."""

    task: dict[str, Any]
    version: int
    etag: str
    snapshot: dict[str, Any]

    @property
    def status(self) -> str:
        return str(self.task["status"])

    @property
    def result(self) -> Any:
        return self.snapshot.get("result")


class _StreamLost(Exception):
    """The stream ended, or was refused for now, before the task did: taken up again."""


class AsyncClient:
    """The HTTP API of one tether server, for an ``async`` program (see the module).
    *token* is a bearer token the server was started with (``--tokens``)."""

    def __init__(self, url: str, token: str, *, timeout: float = 10.0, retry_for: float = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigurationError(f"a tether server is http(s)://host:port, not {url[:80]!r}")
        if not token:
            raise ConfigurationError("a tether server needs a token (the server's --tokens)")
        self.url = url.rstrip("/")
        self.retry_for = retry_for
        self._http = httpx.AsyncClient(
            base_url=self.url, transport=transport,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout, read=max(timeout, 60.0)))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------------ tasks

    async def submit(self, agent: str, input: Any = None, *, task_id: str | None = None,
                     deadline: float | None = None, not_before: float | None = None) -> str:
        """Start a task of *agent*; its id. Sent again after a lost answer, it finds its
        own task rather than starting a second."""
        chosen = task_id or uuid.uuid4().hex[:16]
        body = {"agent": agent, "input": input, "task_id": chosen, "deadline": deadline,
                "not_before": not_before}
        sent: Counts = []
        try:
            found = await self._send("POST", "/api/tasks", json=body, resend=True, sent=sent)
        except TaskExists:
            if task_id is None or sent:  # our own earlier attempt may have got there first
                return chosen
            raise
        return str(found["task_id"])

    async def emit(self, task_id: str, type: str, payload: Any = None, *,
                   priority: int | None = None, key: str | None = None) -> dict[str, Any]:
        """Send an event; the server's receipt (``event_id``, ``outcome``: ``stored``,
        ``duplicate``...). *key* is its ``source_event_id``: the server stores a repeat
        once (random unless given, so a resend after a lost answer is one event)."""
        body = {"type": type, "payload": payload, "priority": priority,
                "source_event_id": key or uuid.uuid4().hex}
        return dict(await self._send("POST", f"{_task(task_id)}/events", json=body,
                                     resend=True))

    async def get(self, task_id: str) -> RemoteTask:
        found = await self._send("GET", _task(task_id))
        return RemoteTask(found["task"], int(found["version"]), str(found["etag"]),
                          found["snapshot"])

    async def list(self, status: str | None = None, *, agent: str | None = None,
                   q: str = "", offset: int = 0, limit: int = 100) -> dict[str, Any]:
        """``counts`` by status and a page of ``tasks`` (see ``GET /api/tasks``)."""
        params = {k: v for k, v in {"status": status, "agent": agent, "q": q or None,
                                    "offset": offset or None, "limit": limit}.items()
                  if v is not None}
        return dict(await self._send("GET", "/api/tasks", params=params))

    async def history(self, task_id: str, *, page: int = 500) -> Rows:
        """Every dialog row of the task, read a page at a time."""
        rows: Rows = []
        while True:
            found = await self._send("GET", f"{_task(task_id)}/history",
                                     params={"offset": len(rows), "limit": page})
            rows += found["rows"]
            if not found["rows"] or len(rows) >= int(found["total"]):
                return rows

    async def versions(self, task_id: str) -> Rows:
        return list(await self._send("GET", f"{_task(task_id)}/versions"))

    async def recovery(self, task_id: str) -> Rows:
        return list(await self._send("GET", f"{_task(task_id)}/recovery"))

    # ------------------------------------------------------------------ levers

    async def resume(self, task_id: str, message: str | None = None, *,
                     patch: Mapping[str, Any] | None = None, input: Any = KEEP,
                     earlier_result: bool = False, etag: str | None = None) -> dict[str, Any]:
        """Resume a stopped task; with the *etag* of the view shown to a person, refused if
        the task moved on since (so a resume meant for one stop never runs a later one)."""
        body: dict[str, Any] = {"message": message, "patch": patch,
                                "earlier_result": earlier_result, "etag": etag}
        if input is not KEEP:
            body["input"] = input
        return await self._lever(task_id, "resume", body)

    async def decide(self, task_id: str, outcome: str, result: Any = None, *,
                     key: str | None = None, attempt: int | None = None,
                     etag: str | None = None) -> dict[str, Any]:
        """Settle a call in doubt (``happened``, ``not_happened``, ``skip``); with *key*,
        *attempt* and *etag* as shown to the person, refused if the task moved on since."""
        return await self._lever(task_id, "decide", {
            "outcome": outcome, "result": result, "key": key, "attempt": attempt,
            "etag": etag})

    async def rollback(self, task_id: str, version: int, *,
                       redo_side_effects: bool = False) -> dict[str, Any]:
        return await self._lever(task_id, "rollback", {
            "version": version, "redo_side_effects": redo_side_effects})

    async def cancel(self, task_id: str) -> dict[str, Any]:
        return await self._lever(task_id, "cancel", None)

    async def fork(self, task_id: str, version: int | None = None, *,
                   new_task_id: str | None = None, redo_side_effects: bool = False,
                   paused: bool = False) -> str:
        found = await self._send("POST", f"{_task(task_id)}/fork", json={
            "version": version, "task_id": new_task_id, "redo_side_effects": redo_side_effects,
            "paused": paused})
        return str(found["task_id"])

    async def delete(self, task_id: str) -> None:
        await self._send("DELETE", _task(task_id))

    async def _lever(self, task_id: str, lever: str, body: Any) -> dict[str, Any]:
        return dict(await self._send("POST", f"{_task(task_id)}/{lever}", json=body))

    # ------------------------------------------------------------------ the stream

    async def watch(self, task_id: str, after: Position | str | None = None
                    ) -> AsyncGenerator[Change]:
        """The task's changes as they are committed (``state``, ``row``, ``recovery``,
        ``reset``, ``end``), until it ends; a dropped connection is taken up again from the
        last position for up to *retry_for* seconds."""
        position = after if isinstance(after, Position) else Position.parse(after)
        loop = asyncio.get_running_loop()
        failing_since: float | None = None
        while True:
            wait = 1.0
            try:
                async with aconnect_sse(self._http, "GET", f"{_task(task_id)}/stream",
                                        headers={"Last-Event-ID": str(position)}) as source:
                    status = source.response.status_code
                    if status in RETRY_STATUSES:  # a server stopping, or too many streams
                        await source.response.aread()
                        wait = _retry_after(source.response, wait)
                        raise _StreamLost(f"the server answered {status}")
                    if status != 200:
                        await source.response.aread()
                        raise _error(source.response)
                    async for event in source.aiter_sse():
                        failing_since = None
                        position = _position(event.id, position)
                        change = _change(event.event, event.data, position)
                        if change is None:
                            continue  # a kind this client does not know: a newer server's
                        yield change
                        if change.kind == "end":
                            return
                raise _StreamLost("the stream ended before the task did")  # a server stopping
            except (httpx.TransportError, SSEError, _StreamLost) as exc:
                failing_since = failing_since or loop.time()
                if loop.time() - failing_since > self.retry_for:
                    raise ServerError(f"lost the stream from {self.url} and could not get it"
                                      f" back for {self.retry_for:.0f} s: {exc}") from None
                await asyncio.sleep(wait)

    # ------------------------------------------------------------------ requests

    async def _send(self, method: str, path: str, *, json: Any = None,
                    params: Mapping[str, Any] | None = None, resend: bool = False,
                    sent: Counts | None = None) -> Any:
        """One request, sent again as the module says; its JSON, or tether's exception.
        *resend*: the request is idempotent by key (submit, emit), so a transport error
        after sending may be retried too; each such attempt (one that may have reached the
        server) is counted in *sent*."""
        idempotent = method == "GET" or resend
        delay = 0.2
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.retry_for
        while True:
            try:
                response = await self._http.request(method, path, json=json, params=params)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # never reached it
                wait = delay
                failure: Exception = ServerError(f"could not reach {self.url}: {exc}")
            except httpx.TransportError as exc:
                if not idempotent:
                    raise ServerError(f"{method} {path}: the connection to {self.url} failed"
                                      f" after sending ({exc}); it may have been applied,"
                                      " so it was not sent again: look at the task") from None
                if sent is not None:
                    sent.append(1)  # it may have reached the server
                wait, failure = delay, ServerError(f"{self.url}: {exc}")
            else:
                if response.status_code < 400:
                    return response.json() if response.content else None
                if response.status_code not in RETRY_STATUSES:
                    raise _error(response)
                wait, failure = _retry_after(response, delay), _error(response)
            if loop.time() + wait > give_up:
                raise failure
            await asyncio.sleep(wait * random.uniform(0.8, 1.2))
            delay = min(delay * 2, 5.0)


class Client:
    """:class:`AsyncClient` for code that is not async: each method runs on a private event
    loop thread and returns its answer (``watch`` yields changes as they come). Close it
    (or use ``with``) to stop the thread."""

    def __init__(self, url: str, token: str, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tether-client",
                                        daemon=True)
        self._thread.start()
        try:
            self._async = self._run(_make(url, token, options))
        except BaseException:  # refused (a bad URL, no token): no thread is left behind
            self._stop()
            raise

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._thread.is_alive():
            self._run(self._async.close())
            self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._loop.is_running():
            self._loop.close()

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def submit(self, agent: str, input: Any = None, **options: Any) -> str:
        return self._run(self._async.submit(agent, input, **options))

    def emit(self, task_id: str, type: str, payload: Any = None, **options: Any
             ) -> dict[str, Any]:
        return self._run(self._async.emit(task_id, type, payload, **options))

    def get(self, task_id: str) -> RemoteTask:
        return self._run(self._async.get(task_id))

    def list(self, status: str | None = None, **options: Any) -> dict[str, Any]:
        return self._run(self._async.list(status, **options))

    def history(self, task_id: str) -> Rows:
        return self._run(self._async.history(task_id))

    def versions(self, task_id: str) -> Rows:
        return self._run(self._async.versions(task_id))

    def recovery(self, task_id: str) -> Rows:
        return self._run(self._async.recovery(task_id))

    def resume(self, task_id: str, message: str | None = None, **options: Any
               ) -> dict[str, Any]:
        return self._run(self._async.resume(task_id, message, **options))

    def decide(self, task_id: str, outcome: str, result: Any = None, **options: Any
               ) -> dict[str, Any]:
        return self._run(self._async.decide(task_id, outcome, result, **options))

    def rollback(self, task_id: str, version: int, **options: Any) -> dict[str, Any]:
        return self._run(self._async.rollback(task_id, version, **options))

    def cancel(self, task_id: str) -> dict[str, Any]:
        return self._run(self._async.cancel(task_id))

    def fork(self, task_id: str, version: int | None = None, **options: Any) -> str:
        return self._run(self._async.fork(task_id, version, **options))

    def delete(self, task_id: str) -> None:
        self._run(self._async.delete(task_id))

    def watch(self, task_id: str, after: Position | str | None = None) -> Iterator[Change]:
        changes = self._async.watch(task_id, after)

        async def step() -> Change:
            return await anext(changes)

        while True:
            try:
                yield self._run(step())
            except StopAsyncIteration:
                return


async def _make(url: str, token: str, options: Mapping[str, Any]) -> AsyncClient:
    return AsyncClient(url, token, **options)  # made on the loop that will use it


def _task(task_id: str) -> str:
    return f"/api/tasks/{quote(task_id, safe='')}"


def _error(response: httpx.Response) -> Exception:
    """The server's error as tether's own exception (its ``type``), else ServerError."""
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        body = None
    message = body.get("error") if isinstance(body, dict) else None
    text = str(message or f"the server answered {response.status_code}")
    named = str(body.get("type")) if isinstance(body, dict) else ""
    kind = next((k for k in API_ERRORS if k.__name__ == named), None)
    return kind(text) if kind is not None else ServerError(text, response.status_code)


def _retry_after(response: httpx.Response, default: float) -> float:
    """The server's Retry-After in seconds, bounded to 0-60 (anything else: *default*)."""
    try:
        wait = float(response.headers.get("Retry-After", default))
    except ValueError:
        return default
    return min(max(wait, 0.0), 60.0) if math.isfinite(wait) else default


def _position(text: str, before: Position) -> Position:
    try:
        return Position.parse(text) if text else before
    except errors.InvalidInput as error:
        raise ServerError(f"the server sent an event id that is no stream position: {error}"
                          ) from None


def _change(kind: str, data: str, position: Position) -> Change | None:
    """A server's event as a change: None for a kind this client does not know; data that is
    not a JSON object is refused (nothing from outside is trusted)."""
    if kind not in KINDS:
        return None
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        payload = None
    if not isinstance(payload, dict):
        raise ServerError(f"the server sent a {kind!r} event whose data is not a JSON object")
    return Change(kind, payload, position)  # type: ignore[arg-type]

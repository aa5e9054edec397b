"""What the model-agent conformance suite gives an adapter: the case, the shop, the endpoint.

An :class:`AdapterCase` says how to build a harness with one agent wired to a scripted model.
Its ``build(harness, shop, endpoint)`` registers the agent :data:`AGENT` on the harness, its
model talking to ``endpoint.url`` (a :class:`tether.testing.fake_openai.FakeOpenAI`, best
through :meth:`Endpoint.openai_client`), with two tools whose work the :class:`Shop` does:

- ``lookup(order: str)``: idempotent (a read), ``await shop.lookup(call, order)``;
- ``refund(order: str, amount: int)``: a side effect, ``await shop.refund(call, order,
  amount)``; with the reconcile hook ``shop.find_refund`` (tool-argument form ``(ctx,
  order, amount)``) when ``shop.reconcile``, and needing a person's approval when
  ``shop.needs_approval`` (for adapters that support approvals).

``call`` is the tether call the tool runs in (a native tool's ``ctx``, a framework tool's
:func:`tether.tools.current_call`). A tool's exceptions must reach tether (the Agents SDK's
``failure_error_function=None``): an in-doubt refund is a raised ``tt.OutcomeUnknown``.

Every lookup, refund and reconcile is written to a ledger file outside tether, so refunds paid
by worker processes that were SIGKILLed are counted too.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import pytest

import tether as tt
from tether.failpoints import failpoint

if TYPE_CHECKING:
    from openai import AsyncOpenAI

AGENT = "support"
"""The name every case registers its agent under."""
TASK = "t1"
PROMPT = "Refund 5 on order A1, after looking it up."
PROPERTIES = ("approvals", "unstreamed")
"""What a case may declare not applicable to its adapter (with the reason)."""


def refunded(order: str, amount: int) -> str:
    """What the refund tool returns."""
    return f"refunded {amount} dollars on order {order}"


def found(order: str, amount: int) -> str:
    """What the reconcile hook returns when the ledger holds the refund: a plain value,
    which must become the call's result (distinct from the tool's, to tell them apart)."""
    return f"refunded {amount} dollars on order {order} (found in the ledger)"


class Ledger:
    """Every lookup, refund and reconcile, by tool and idempotency key (a SQLite file,
    autocommitted: a row written before a SIGKILL is kept)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, timeout=10)
        db.execute("CREATE TABLE IF NOT EXISTS effects (tool TEXT, key TEXT, order_id TEXT)")
        return db

    def record(self, tool: str, key: str, order: str) -> None:
        db = self._db()
        try:
            db.execute("INSERT INTO effects VALUES (?, ?, ?)", (tool, key, order))
        finally:
            db.close()

    def keys(self, tool: str) -> list[str]:
        """The key of each row of *tool*, in order."""
        db = self._db()
        try:
            return [k for (k,) in db.execute("SELECT key FROM effects WHERE tool = ?"
                                             " ORDER BY rowid", (tool,))]
        finally:
            db.close()

    def count(self, tool: str) -> int:
        return len(self.keys(tool))


@dataclass
class Shop:
    """The tools' world outside tether. The flags (plain data, so a worker process gets the
    same shop) script how the refund behaves; the events gate the lookup in-process."""

    ledger_path: str
    reconcile: bool = True
    """The refund has the reconcile hook :meth:`find_refund`."""
    answer_lost: bool = False
    """The first attempt of a refund pays, then its answer is lost (``OutcomeUnknown``)."""
    lost_before_paying: bool = False
    """The first attempt of a refund is lost before the provider took it."""
    needs_approval: bool = False
    """The refund needs a person's approval (adapters that support approvals)."""
    looking: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    """Set when a lookup has started."""
    go_on: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    """A lookup waits for it; set from the start unless a test holds the lookup."""

    def __post_init__(self) -> None:
        self.go_on.set()

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.ledger_path)

    def to_json(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)
                           if f.name not in ("looking", "go_on")})

    @classmethod
    def from_json(cls, text: str) -> Shop:
        return cls(**json.loads(text))

    def hold_lookups(self) -> None:
        """Lookups wait until :attr:`go_on` is set again."""
        self.go_on.clear()

    async def lookup(self, call: tt.ToolContext, order: str) -> dict[str, Any]:
        self.ledger.record("lookup", call.idempotency_key, order)
        self.looking.set()
        await self.go_on.wait()
        return {"order": order, "paid": 40}

    async def refund(self, call: tt.ToolContext, order: str, amount: int) -> str:
        if self.lost_before_paying and call.attempt == 1:
            raise tt.OutcomeUnknown("the connection to the provider broke before it answered")
        self.ledger.record("refund", call.idempotency_key, order)
        failpoint("inside_tool")  # armed in kill tests: the provider took it, then SIGKILL
        if self.answer_lost and call.attempt == 1:
            raise tt.OutcomeUnknown("the provider took the refund; its answer was lost")
        return refunded(order, amount)

    async def find_refund(self, ctx: tt.ToolContext, order: str, amount: int) -> str | None:
        """The refund's reconcile hook: ``None`` if the provider never took it under this
        key (the call then runs, with the same key), else the refund's value."""
        self.ledger.record("reconcile", ctx.idempotency_key, order)
        return found(order, amount) if ctx.idempotency_key in self.ledger.keys("refund") \
            else None


def _http() -> Any:
    """The HTTP library the ``openai`` client is built on (``httpx``, or its successor
    ``httpx2`` in newer releases): the watched wire must speak the client's own."""
    from openai import DefaultAsyncHttpxClient

    base = next(c for c in DefaultAsyncHttpxClient.__mro__ if c.__name__ == "AsyncClient")
    return importlib.import_module(base.__module__.partition(".")[0])


class Wire:
    """The HTTP between an adapter's client and the fake model, watched: :attr:`text_read` is
    set once the client has read a streamed chunk carrying text. It is set just before the
    chunk is handed to the client, which parses it without giving the event loop away, so
    a test that waits for it knows the adapter holds some streamed text. (A transport of the
    ``openai`` client's HTTP library; see :meth:`Endpoint.http_client`.)"""

    def __init__(self) -> None:
        self.http = _http()
        self.inner = self.http.AsyncHTTPTransport()
        self.text_read = asyncio.Event()
        wire = self

        async def watched(stream: Any) -> AsyncIterator[bytes]:
            seen = b""
            async for chunk in stream.inner:
                if not wire.text_read.is_set():
                    seen += chunk
                    if _carries_text(seen):
                        wire.text_read.set()
                yield chunk

        async def aclose(stream: Any) -> None:
            await stream.inner.aclose()

        def init(stream: Any, inner: Any) -> None:
            stream.inner = inner

        self.stream_type = type("WatchedStream", (self.http.AsyncByteStream,), {
            "__init__": init, "__aiter__": watched, "aclose": aclose})

    async def handle_async_request(self, request: Any) -> Any:
        response = await self.inner.handle_async_request(request)
        if "text/event-stream" in response.headers.get("content-type", ""):
            response.stream = self.stream_type(response.stream)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> Wire:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _carries_text(stream: bytes) -> bool:
    """Whether a complete server-sent event in *stream* carries answer text."""
    for event in stream.split(b"\n\n")[:-1]:
        data = event.strip().removeprefix(b"data:").strip()
        if not data.startswith(b"{"):
            continue
        for choice in json.loads(data).get("choices") or []:
            if (choice.get("delta") or {}).get("content"):
                return True
    return False


@dataclass
class Endpoint:
    """Where the case's model is: the fake's ``url``. ``can_stream=False`` means the model
    cannot stream: wire the framework's model that only answers plain requests, if it has
    one (PydanticAI: a ``FunctionModel`` without ``stream_function``); the fake then refuses
    streamed requests as a real model without streaming does."""

    url: str
    can_stream: bool = True
    wire: Wire | None = None
    """In-process runs watch the wire (see :class:`Wire`); worker processes do not."""

    def http_client(self) -> Any:
        """An HTTP client of the ``openai`` client's library (an ``httpx.AsyncClient``, or
        ``httpx2``'s) through the watched wire: give it to the adapter's model client."""
        http = self.wire.http if self.wire else _http()
        return http.AsyncClient(transport=self.wire or http.AsyncHTTPTransport(),
                                timeout=http.Timeout(120.0))

    def openai_client(self) -> AsyncOpenAI:
        """The official ``openai`` client for the fake (no retries of its own: tether's)."""
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.url, api_key="none", max_retries=0,
                           http_client=self.http_client())


Build = Callable[[tt.Harness, Shop, Endpoint], None]
"""Registers :data:`AGENT` on the harness, wired to the endpoint, with the shop's tools."""


@dataclass(frozen=True)
class AdapterCase:
    """One adapter under the suite. *build* must be a module-level function (a worker
    process imports it by name); *preload* names the heavy modules (the framework's) that
    the fork server of worker processes imports once, before it forks them (tether and the
    worker are preloaded anyway; the case's module is imported by each worker); *not_applicable* maps a
    property of :data:`PROPERTIES` the adapter does not have to the reason, which the
    skipped test reports."""

    name: str
    build: Build
    preload: tuple[str, ...] = ()
    not_applicable: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        qualname = getattr(self.build, "__qualname__", "")
        module = getattr(self.build, "__module__", "__main__")
        if "<" in qualname or module == "__main__":
            raise tt.ConfigurationError(f"case {self.name}: build must be a module-level"
                                        f" function a worker process can import, not {qualname}")
        unknown = sorted(set(self.not_applicable) - set(PROPERTIES))
        if unknown:
            raise tt.ConfigurationError(f"case {self.name}: not_applicable names {unknown};"
                                        f" the properties are {PROPERTIES}")

    @property
    def ref(self) -> str:
        """``module:function`` of *build*, for a worker process."""
        return f"{self.build.__module__}:{self.build.__qualname__}"

    def harness(self, store: str, shop: Shop, endpoint: Endpoint,
                settings: tt.Settings) -> tt.Harness:
        h = tt.Harness(store, settings=settings)
        self.build(h, shop, endpoint)
        if AGENT not in h.agents:
            raise tt.ConfigurationError(f"case {self.name}: build did not register {AGENT!r}")
        return h

    def require(self, prop: str) -> None:
        """Skip the test, naming the adapter and the reason, if *prop* is not applicable."""
        if prop in self.not_applicable:
            pytest.skip(f"not applicable to {self.name}: {self.not_applicable[prop]}")

    def __str__(self) -> str:
        return self.name


# ---------------------------------------------------------------------------- reading requests


def text_of(message: Mapping[str, Any]) -> str:
    """A chat message's text (content as a string, or as a list of parts)."""
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def tool_results(request: Mapping[str, Any]) -> list[str]:
    """The text of each tool message a request to the model holds, in order."""
    return [text_of(m) for m in request.get("messages") or [] if m.get("role") == "tool"]


def index_of(request: Mapping[str, Any], role: str, text: str) -> list[int]:
    """Where messages of *role* whose text holds *text* are in a request's messages."""
    return [i for i, m in enumerate(request.get("messages") or [])
            if m.get("role") == role and text in text_of(m)]


async def strategies(h: tt.Harness, task_id: str = TASK) -> list[str]:
    """The resume strategies of a task's recovery log, in order."""
    return [str(r["resume_strategy"]) for r in await h.store.list_recovery_log(task_id)]


async def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Until *predicate* holds (a bounded wait for a condition, never a correctness check)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.005)

"""An MCP server's tools as tether tools, in one ``async with`` (extra ``mcp``)::

    async with MCPTools.stdio(h, "python", ["files_server.py"], prefix="files_") as files:
        h.add_agent("clerk", ChatAgent(tools=files.registered))  # or any agent naming them
        await h.run_until_idle()                                 # workers run inside the block

On entering, tether connects (a child process over stdio, or streamable HTTP), lists the
server's tools and registers one tether tool per MCP tool, named *prefix* + the MCP name
(keep to letters, digits, ``_`` and ``-`` if a model is to call them). Enter it before the
workers run and leave it after they stop: a worker that recovers a task needs its tools.
Under ``tether worker`` or ``tether serve --with-worker``, enter it from an app lifespan::

    payments = MCPTools.stdio(h, "python", ["payments_server.py"], prefix="pay_")
    h.add_agent("clerk", ChatAgent(tools=payments.registered))   # empty until entered

    @h.lifespan
    async def mcp_tools(h: tt.Harness) -> AsyncIterator[None]:
        async with payments:
            yield

``registered`` is one list for the life of the ``MCPTools``, filled when it is entered and
emptied when it is left: a ``ChatAgent`` made with it before the lifespan entered reads it
when it plans, so it offers the server's tools as registered then (never those of an
earlier entry). A lifespan whose server never answers is cut by the worker's first SIGTERM:
the connection being made is dropped and the server process stopped.

An ``MCPTools`` may be entered again once it has been left (each entry connects anew and
registers the tools again), but not twice at once.

- **What a crash means** comes from the tool's MCP annotations unless a
  :class:`tether.ToolPolicy` override says otherwise: ``readOnlyHint`` or
  ``idempotentHint`` make it idempotent (re-run with the same key after a crash); anything
  else, no annotations included, is a side effect (the spec's own defaults are
  destructive and open-world), never repeated blindly. Annotations come from the server:
  pass ``trust_annotations=False`` for a server you do not trust.
- **The idempotency key travels with every call**, in the request's ``_meta`` under
  :data:`META_KEY` (and the lease's fencing token under :data:`FENCE_KEY`). A server that
  deduplicates by it makes its side effects safe to repeat: say so with
  ``ToolPolicy(idempotent=True)``.
- **Results** are the ``structuredContent`` if the server sent one, else the text (one
  block: a string; several: a list); other content (images, resources) is described in
  plain data. A result with ``isError`` raises :class:`tether.NotRetryable` with the
  server's message: the agent sees it, nothing is retried.
- **A connection lost mid-call** (the process killed, the HTTP stream dropped) leaves a
  side-effecting call in doubt: :class:`tether.OutcomeUnknown`, so tether asks the
  ``reconcile`` hook or a person. An idempotent call raises :class:`MCPDisconnected`,
  which tether retries. The next call reconnects (a new process, a new HTTP session); a
  side-effecting call is only sent on a connection that has just answered a ping, so a
  server that died between calls never leaves a call in doubt.
"""

from __future__ import annotations

import asyncio
import inspect
import keyword
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from types import TracebackType
from typing import Any, TextIO, TypedDict, TypeVar, Unpack, cast

from tether.errors import ConfigurationError, MissingExtra, NotRetryable, OutcomeUnknown, TetherError
from tether.harness import Harness
from tether.tools import (
    KEY_IN_META,
    ReconcileFn,
    RetryPolicy,
    Tool,
    ToolContext,
    ToolPolicy,
    describe_error,
)

try:
    import httpx2
    from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
    from mcp import types as mcp_types
    from mcp.client.streamable_http import streamable_http_client
    from pydantic_core import core_schema  # the SDK is built on pydantic
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("MCP tools need the MCP SDK", "mcp") from exc

META_KEY = KEY_IN_META
"""The ``_meta`` entry of a ``tools/call`` request that holds tether's idempotency key."""
FENCE_KEY = "tether.dev/fence"
"""The ``_meta`` entry holding the lease's fencing token (see ``ToolContext.fence``)."""
PING_TIMEOUT = 10.0
"""Seconds a connection has to answer the ping sent before a side-effecting call."""
_LOST = (mcp_types.CONNECTION_CLOSED, mcp_types.REQUEST_TIMEOUT)
"""Error codes the SDK itself makes up when no answer can come: not the server's word."""

__all__ = ["FENCE_KEY", "META_KEY", "MCPDisconnected", "MCPOptions", "MCPTools"]

log = logging.getLogger("tether.mcp")
T = TypeVar("T")
Opener = Callable[[], AbstractAsyncContextManager[ClientSession]]


class MCPOptions(TypedDict, total=False):
    """What :meth:`MCPTools.stdio` and :meth:`MCPTools.http` take besides the server."""

    prefix: str
    overrides: Mapping[str, ToolPolicy]
    reconcile: Mapping[str, ReconcileFn]
    only: Collection[str]
    trust_annotations: bool
    timeout: float | None
    retry: RetryPolicy | None


class MCPDisconnected(TetherError):
    """The MCP server could not be reached, or dropped the connection before answering; an
    idempotent call is retried on a new connection."""


class _Link:
    """One open session, owned by its own asyncio task.

    The SDK's transports live in anyio task groups that must be left in the task that
    entered them, and a failing transport cancels that task. Owning each connection in a
    task of its own keeps tether's workers out of both: any worker may open or drop one.
    """

    def __init__(self, open_session: Opener, label: str) -> None:
        self._ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        self._ready.add_done_callback(_settle)  # a failed connection nobody waited for is quiet
        self._stop = asyncio.Event()
        self._label = label
        self.task = asyncio.create_task(self._own(open_session), name=f"mcp {label}")

    async def _own(self, open_session: Opener) -> None:
        try:
            async with open_session() as session:
                self._ready.set_result(session)
                await self._stop.wait()
        except Exception as error:  # a transport can fail in any way; the callers are told
            if not self._ready.done():
                self._ready.set_exception(error)
            log.debug("MCP connection to %s ended: %s", self._label, describe_error(error))
        finally:
            if not self._ready.done():
                self._ready.set_exception(MCPDisconnected(f"{self._label} closed while connecting"))

    @property
    def dead(self) -> bool:
        return self._stop.is_set() or self.task.done()

    def retire(self) -> None:
        """Let this connection go (its process is stopped); later calls open a new one. One
        still connecting is cut short: a server that never answers its handshake must not
        hold up the caller leaving (a lifespan cancelled on SIGTERM, say)."""
        self._stop.set()
        if not self._ready.done():
            self.task.cancel()

    async def session(self) -> ClientSession:
        return await asyncio.shield(self._ready)

    async def run(self, work: Awaitable[T]) -> T:
        """*work* on this connection, or CONNECTION_CLOSED if the connection ends first:
        never wait forever on a transport that died without telling its waiters."""
        call = asyncio.ensure_future(work)
        call.add_done_callback(_settle)
        try:
            done, _ = await asyncio.wait({call, self.task}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled (tether's timeout, say): the request goes with it
            call.cancel()
            raise
        if call in done:
            return call.result()
        call.cancel()
        raise MCPError(mcp_types.CONNECTION_CLOSED, "the connection ended during the call")

    async def answers(self) -> bool:
        """Whether the server still answers a ping; if not, the connection is retired."""
        try:
            session = await self.session()
            async with asyncio.timeout(PING_TIMEOUT):
                await self.run(session.send_ping())
            return True
        except Exception:  # any failure means this connection cannot be trusted
            self.retire()
            return False


class MCPTools:
    """The tools of one MCP server, registered on a harness while the context is open."""

    def __init__(self, harness: Harness, open_session: Opener, label: str, *, prefix: str = "",
                 overrides: Mapping[str, ToolPolicy] | None = None,
                 reconcile: Mapping[str, ReconcileFn] | None = None,
                 only: Collection[str] | None = None, trust_annotations: bool = True,
                 timeout: float | None = None, retry: RetryPolicy | None = None) -> None:
        """Use :meth:`stdio` or :meth:`http`; *open_session* yields an initialised session.

        *overrides* and *reconcile* are keyed by the server's tool names (without *prefix*);
        *only* limits registration to those tools; *timeout* and *retry* apply to the tools
        whose policy comes from their annotations.
        """
        self.harness = harness
        self.label = label
        self.prefix = prefix
        self.overrides = dict(overrides or {})
        self.reconcile = dict(reconcile or {})
        self.only = None if only is None else set(only)
        self.trust_annotations = trust_annotations
        self.timeout = timeout
        self.retry = retry
        self.registered: list[Tool] = []
        """The tether tools made from the server's tools, in the server's order: the same
        list object always, filled on entering and emptied on leaving (a live view, for
        ``ChatAgent(tools=...)`` made before the context is entered)."""
        self._open_session = open_session
        self._remote: dict[str, mcp_types.Tool] = {}
        self._links: set[_Link] = set()
        self._link: _Link | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._open = False

    @classmethod
    def stdio(cls, harness: Harness, command: str, args: Sequence[str] = (), *,
              env: Mapping[str, str] | None = None, cwd: str | None = None,
              errlog: TextIO | None = None, **options: Unpack[MCPOptions]) -> MCPTools:
        """A server run as a child process speaking over stdin/stdout.

        The child gets the MCP SDK's safe subset of the environment plus *env*; its stderr
        goes to *errlog* (default: ours). After a crash the next call starts a new one.
        *options* are those of the constructor (``prefix``, ``overrides``, ``reconcile``...).
        """
        params = StdioServerParameters(command=command, args=list(args),
                                       env=None if env is None else dict(env), cwd=cwd)

        @asynccontextmanager
        async def open_session() -> AsyncIterator[ClientSession]:
            async with stdio_client(params, errlog=errlog or sys.stderr) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                yield session

        return cls(harness, open_session, f"stdio:{' '.join([command, *args])}", **options)

    @classmethod
    def http(cls, harness: Harness, url: str, *, headers: Mapping[str, str] | None = None,
             **options: Unpack[MCPOptions]) -> MCPTools:
        """A server reached over streamable HTTP at *url* (``http://host:port/mcp``).

        *headers* go with every request (an ``Authorization`` header, say).
        """

        @asynccontextmanager
        async def open_session() -> AsyncIterator[ClientSession]:
            timeout = httpx2.Timeout(30.0, read=300.0)  # the SDK's own defaults
            async with httpx2.AsyncClient(headers=dict(headers or {}), timeout=timeout) as client, \
                    streamable_http_client(url, http_client=client) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                yield session

        return cls(harness, open_session, url, **options)

    # ------------------------------------------------------------------ the context

    async def __aenter__(self) -> MCPTools:
        if self._open:
            raise ConfigurationError(f"MCPTools for {self.label} is entered already: enter it in"
                                     " one place (one @harness.lifespan, or one 'async with')")
        self._open, self._closed = True, False
        self.registered.clear()
        self._remote.clear()
        self._link, self._lock = None, asyncio.Lock()  # an entry may be in another event loop
        try:
            link = await self._live_link()
            session = await link.session()
            remote = await self._list_tools(session)
            version = session.server_info.version if session.server_info else None
            self._register(remote, version or "1")
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Unregister the tools and close the connection (stopping a stdio server); one
        still being made is dropped (a server that never answered)."""
        self._closed, self._open = True, False
        for tool in self.registered:
            if self.harness.tools.get(tool.name) is tool:
                del self.harness.tools[tool.name]
        self.registered.clear()  # in place: an agent holding the list offers none of them now
        for link in list(self._links):
            link.retire()
        await asyncio.gather(*(link.task for link in self._links), return_exceptions=True)

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI-style ``tools=[...]`` entries, with each MCP tool's own input schema."""
        return [{"type": "function", "function": {
            "name": tool.name, "description": self._remote[tool.name].description or "",
            "parameters": self._remote[tool.name].input_schema}} for tool in self.registered]

    # ------------------------------------------------------------------ registration

    async def _list_tools(self, session: ClientSession) -> list[mcp_types.Tool]:
        listing = await session.list_tools()
        tools = list(listing.tools)
        while listing.next_cursor is not None:
            listing = await session.list_tools(
                params=mcp_types.PaginatedRequestParams(cursor=listing.next_cursor))
            tools.extend(listing.tools)
        return tools

    def _register(self, remote: list[mcp_types.Tool], version: str) -> None:
        """Make and register every tool, or none: every problem is found before the first."""
        names = {tool.name for tool in remote}
        for option, given in (("overrides", self.overrides), ("reconcile", self.reconcile),
                              ("only", self.only or ())):
            unknown = sorted(set(given) - names)
            if unknown:
                raise ConfigurationError(
                    f"MCPTools {option} names {', '.join(map(repr, unknown))}, which MCP server"
                    f" {self.label} does not have; its tools: {', '.join(sorted(names)) or 'none'}")
        chosen = [tool for tool in remote if self.only is None or tool.name in self.only]
        tools = [self._make_tool(tool, version) for tool in chosen]
        for tool in tools:
            if tool.name in self.harness.tools:
                raise ConfigurationError(
                    f"MCP server {self.label} has a tool {tool.name!r}, and a tool by that name"
                    " is already registered; pass a prefix= (say 'files_') to keep them apart")
        for tool, mcp_tool in zip(tools, chosen, strict=True):
            self.harness.add_tool(tool)
            self._remote[tool.name] = mcp_tool
            self.registered.append(tool)

    def _policy(self, remote: mcp_types.Tool, version: str) -> ToolPolicy:
        """The override if there is one, else what the annotations say (a side effect unless
        the server says reading or repeating is harmless), with the reconcile hook."""
        policy = self.overrides.get(remote.name)
        if policy is None:
            hints = remote.annotations if self.trust_annotations else None
            repeatable = bool(hints and (hints.read_only_hint or hints.idempotent_hint))
            policy = ToolPolicy(side_effect=not repeatable, idempotent=repeatable,
                                timeout=self.timeout, retry=self.retry, version=version)
        hook = self.reconcile.get(remote.name)
        if hook is None:
            return policy
        if policy.reconcile is not None:
            raise ConfigurationError(f"MCP tool {remote.name!r} has a reconcile hook both in"
                                     " its ToolPolicy and in reconcile=; keep one")
        if policy.idempotent or not policy.side_effect:
            raise ConfigurationError(
                f"MCP tool {remote.name!r} is idempotent (by its annotations or override), so a"
                " reconcile hook would never be asked; if repeating it is not safe, override it"
                " with ToolPolicy(side_effect=True)")
        return replace(policy, reconcile=hook)

    def _make_tool(self, remote: mcp_types.Tool, version: str) -> Tool:
        name = self.prefix + remote.name

        async def call_mcp_tool(ctx: ToolContext, **arguments: Any) -> Any:
            return await self._call(remote.name, tool, ctx, arguments)

        call_mcp_tool.__doc__ = remote.description
        call_mcp_tool.__name__ = call_mcp_tool.__qualname__ = name
        _describe_arguments(call_mcp_tool, remote.input_schema)
        tool = self._policy(remote, version).tool(call_mcp_tool, name)
        return tool  # the function above finds its own tool (and so its flags) through this

    # ------------------------------------------------------------------ calls

    async def _live_link(self) -> _Link:
        """The open connection, or a new one if there is none or it was lost."""
        async with self._lock:
            if self._closed:
                raise MCPDisconnected(f"MCPTools for {self.label} is closed: run the workers"
                                      " inside its 'async with' block, or enter it from an"
                                      " app lifespan (@harness.lifespan)")
            if self._link is None or self._link.dead:
                link = self._link = _Link(self._open_session, self.label)
                self._links.add(link)
                link.task.add_done_callback(lambda _: self._links.discard(link))
            link = self._link
        try:
            await link.session()
        except Exception as error:  # spawn failures, refused connections, failed handshakes
            link.retire()
            raise MCPDisconnected(f"could not connect to MCP server {self.label}:"
                                  f" {describe_error(_leaf(error))} (a server process that"
                                  " exits at once says why on its stderr)") from _leaf(error)
        return link

    async def _call(self, name: str, tool: Tool, ctx: ToolContext,
                    arguments: dict[str, Any]) -> Any:
        link = await self._live_link()
        if tool.side_effect and not await link.answers():
            link = await self._live_link()  # nothing was sent yet: a new connection is safe
        session = await link.session()
        meta = cast(mcp_types.RequestParamsMeta, {META_KEY: ctx.idempotency_key,
                                                  FENCE_KEY: ctx.fence})
        try:
            result = await link.run(session.call_tool(name, arguments, meta=meta))
        except MCPError as error:
            if error.code not in _LOST and await link.answers():
                raise NotRetryable(f"MCP server {self.label} refused {name} (error"
                                   f" {error.code}): {error.message}") from error
            link.retire()
            raise self._lost(name, tool, ctx, error) from _leaf(error)
        except Exception as error:  # a transport failure, or an answer that does not validate
            if not await link.answers():
                link.retire()
            raise self._lost(name, tool, ctx, error) from _leaf(error)
        return _plain(result, name, self.label)

    def _lost(self, name: str, tool: Tool, ctx: ToolContext, error: Exception) -> TetherError:
        what = f"MCP server {self.label} gave no answer to {name} (key {ctx.idempotency_key}):" \
               f" {describe_error(_leaf(error))}"
        if tool.side_effect:
            return OutcomeUnknown(f"{what}; the call may have run, so it is not repeated blindly")
        return MCPDisconnected(f"{what}; {name} is idempotent and is retried")


# ---------------------------------------------------------------------- results


def _leaf(error: BaseException) -> BaseException:
    """The first real error inside the exception groups the SDK's task groups raise."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _settle(call: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a call nobody waits for any more (no "never retrieved" noise)."""
    if not call.cancelled():
        call.exception()


def _plain(result: mcp_types.CallToolResult, name: str, label: str) -> Any:
    """A call's result as plain data: structured content, else the text, else a description."""
    items = [_content(block) for block in result.content]
    if result.is_error:
        text = "; ".join(item if isinstance(item, str) else repr(item) for item in items)
        raise NotRetryable(f"MCP tool {name} on {label} failed: {text or 'no message'}")
    if result.structured_content is not None:
        return result.structured_content
    if not items:
        return None
    return items[0] if len(items) == 1 else items


def _content(block: mcp_types.ContentBlock) -> Any:
    """A text block's text; any other block as plain data, with binary data left out (its
    size is kept): a tool result is stored with the task and must stay small."""
    if isinstance(block, mcp_types.TextContent):
        return block.text
    data: dict[str, Any] = block.model_dump(mode="json", exclude_none=True)
    resource = data.get("resource")
    for holder, key in ((data, "data"), (resource, "blob")):
        if isinstance(holder, dict) and isinstance(holder.get(key), str):
            holder[key] = f"<{len(holder[key])} base64 characters, not kept>"
    return data


# ---------------------------------------------------------------------- arguments


def _describe_arguments(fn: Callable[..., Any], schema: Mapping[str, Any]) -> None:
    """Give *fn* a signature whose hints carry the MCP input schema, property by property,
    so tether's ChatAgent describes the tool to a model as the server does (it reads the
    signature). Names that cannot be Python arguments leave the signature as it is; offer
    :meth:`MCPTools.schemas` to the model then."""
    properties: Mapping[str, Any] = _inline_refs(schema, schema.get("$defs", {})).get(
        "properties", {})
    if not all(name.isidentifier() and not keyword.iskeyword(name) for name in properties):
        return
    required = set(schema.get("required", ()))
    empty = inspect.Parameter.empty
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=ToolContext)]
    hints: dict[str, Any] = {"ctx": ToolContext}
    for name, prop in properties.items():
        prop = prop if isinstance(prop, dict) else {}
        hints[name] = _schema_type(prop)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                        default=empty if name in required else prop.get("default"),
                                        annotation=hints[name]))
    fn.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    fn.__annotations__ = hints


def _schema_type(schema: dict[str, Any]) -> type:
    """A type pydantic describes with exactly *schema* (and validates as anything)."""

    def core(cls: type, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.any_schema()

    def json_schema(cls: type, core: Any, handler: Any) -> dict[str, Any]:
        return dict(schema)

    return type("MCPArgument", (), {"__get_pydantic_core_schema__": classmethod(core),
                                    "__get_pydantic_json_schema__": classmethod(json_schema)})


def _inline_refs(node: Any, defs: Mapping[str, Any], depth: int = 0) -> Any:
    """*node* with local ``#/$defs/...`` references replaced by their definitions, so each
    property's schema stands alone (a recursive one becomes ``{}`` past a few levels)."""
    if isinstance(node, list):
        return [_inline_refs(item, defs, depth) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = defs.get(ref.removeprefix("#/$defs/"))
        return {} if target is None or depth > 8 else _inline_refs(target, defs, depth + 1)
    return {key: _inline_refs(value, defs, depth) for key, value in node.items() if key != "$defs"}

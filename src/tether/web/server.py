"""The HTTP API (``tether serve``): read and steer tasks, and take signed webhooks (R3, R23, R26).

**What is open.** Only ``GET /healthz`` and the console's sign-in page (``GET /console``);
the console's other pages need its session (:mod:`tether.web.console`), and ``POST
/hooks/{source}`` needs a valid signature instead of a token. Everything else, the
OpenAPI schema at ``/openapi.json`` included, needs ``Authorization: Bearer <token>``;
``/docs`` and ``/redoc`` are not served. A token is ``read`` (GET only) or ``operator`` (may
also submit, emit, resume, roll back, cancel and decide), at least 16 bytes long, checked
before any request body is read (:mod:`tether.web.security`, which also bounds bodies by
the bytes received, refuses request-smuggling framing and limits failed credentials per
client with ``429``: only a credential presented and wrong counts, and a valid one is
never refused for its address's failures).

Webhooks are signed: ``POST /hooks/{source}`` carries ``X-Tether-Timestamp`` (Unix
seconds) and ``X-Tether-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" with the
source's secret>``; a timestamp outside ``tolerance`` (or not a finite number) is refused, so
a captured request cannot be replayed later, and the sender's ``id`` becomes the event's
``source_event_id``, so a retried delivery is stored once (it must be printable: no NUL,
no line break). Each source may send only the
event types it is allowed, and never a lever (:mod:`tether.web.webhooks`). Every accepted event is
durable before the answer (``202``); a low-priority event refused by backpressure gets
``429`` with ``Retry-After``.

Errors are JSON (``{"error": "..."}``) with the status that fits, never a stack trace nor a
server file path; JSON bodies with NaN, Infinity or integers past 64 bits are refused
(``422``), and so are ids and search texts with control characters (a NUL, a line break:
``str.isprintable``), before they reach the store; the server binds to 127.0.0.1 unless told
otherwise.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal

import orjson

from tether.engine.calls import Decision
from tether.engine.inbox import MAX_NAME
from tether.engine.timers import MAX_AHEAD
from tether.errors import (
    ConfigurationError,
    IllegalTransition,
    InboxFull,
    InDoubtCall,
    InvalidInput,
    MissingExtra,
    ReservedEventType,
    ScheduleNotFound,
    StoreUnavailable,
    TaskClosed,
    TaskExists,
    TaskHeld,
    TaskNotFound,
    TetherError,
    UnknownAgent,
    UnknownEventType,
    VersionNotFound,
)
from tether.harness import Harness
from tether.model import LARGEST_COUNT, EmitReceipt, Event, EventStatus, Status, check_task_id
from tether.protocol import RESERVED_EVENTS
from tether.store import LimitUsage, TaskQuery
from tether.watching import POSITION_CHARS
from tether.web.console import install_console
from tether.web.live import StreamSlots, stream_response
from tether.web.security import (
    EdgeGuard,
    FailureLimiter,
    HTTPRefusal,
    Role,
    TokenTable,
    client_of,
    scrub_paths,
    strict_json,
    token_problem,
    wrong_credential,
)
from tether.web.webhooks import (
    BadSignature,
    WebhookSource,
    check_type,
    normalise,
    parse_sources,
    sign,
    verify,
)

try:
    from fastapi import FastAPI, Header, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from fastapi.routing import APIRoute
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from pydantic import AfterValidator, BaseModel, Field, ValidationError, model_validator
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("the HTTP API needs FastAPI", "server") from exc

__all__ = ["STATUS_FOR", "ServerConfig", "WebhookSource", "create_app", "render_metrics", "sign"]
log = logging.getLogger("tether.server")
STATUS_FOR: dict[type[TetherError], int] = {
    TaskNotFound: 404, VersionNotFound: 404, UnknownAgent: 422, UnknownEventType: 422,
    InvalidInput: 422, TaskExists: 409, TaskClosed: 409, IllegalTransition: 409, InboxFull: 429,
    ReservedEventType: 403, InDoubtCall: 409, StoreUnavailable: 503, TaskHeld: 409,
    ScheduleNotFound: 404,
}
"""Any other TetherError is a 500 (its message scrubbed of paths); 503 comes with Retry-After."""
TASK_ID = 128  # the longest id model.TASK_ID matches
_NAME = re.compile(r"[A-Za-z0-9._@-]{1,40}")
LEVER_ROUTES = {"cancel": "/cancel", "resume": "/resume", "rollback": "/rollback",
                "decide": "/decide"}
NOT_PRINTABLE = "must be printable text (no control characters such as NUL or a line break)"


def _printable(value: str) -> str:
    if not value.isprintable():
        raise ValueError(NOT_PRINTABLE)
    return value


Printable = Annotated[str, AfterValidator(_printable)]
"""A string that reaches the store as text: PostgreSQL refuses NUL, and ids are shown."""


def printable_parameter(name: str, value: str | None) -> None:
    """Refuse (422) a query or path parameter with control characters, naming it."""
    if value is not None and not value.isprintable():
        raise HTTPRefusal(422, f"parameter {name} {NOT_PRINTABLE}; {value[:40]!r} is not")


@dataclass(frozen=True)
class ServerConfig:
    """Who may do what. Tokens map to a role; webhook sources to their secret and types.

    A source given as a bare secret may send any event type but the reserved levers.
    Tokens shorter than 16 bytes are refused here, at start-up.
    """

    tokens: Mapping[str, Role] = field(default_factory=dict)
    webhook_sources: Mapping[str, WebhookSource | str] = field(default_factory=dict)
    tolerance: float = 300.0
    """Seconds a webhook's timestamp may be away from now (replay protection)."""
    max_body: int = 1 << 20
    failure_limit: int = 10
    """Failed credentials a client may have within ``failure_window`` seconds before 429."""
    failure_window: float = 60.0
    session_ttl: float = 8 * 3600
    """How long a console sign-in lasts (sessions also end when the server restarts)."""
    names: Mapping[str, str] = field(default_factory=dict)
    """Token -> the name of the person or service holding it, recorded as who pulled a
    lever (``api:alice``, ``console:alice``) instead of a hash of the token."""

    def __post_init__(self) -> None:
        for token, name in self.names.items():
            if token not in self.tokens or not _NAME.fullmatch(name):
                raise ConfigurationError(f"token name {name[:40]!r}: names a configured token"
                                         " with 1-40 letters, digits and . _ - @")
        for number, (token, role) in enumerate(self.tokens.items(), 1):
            problem = token_problem(token) if isinstance(token, str) else "it is not text"
            if problem is not None:
                raise ConfigurationError(f"token {number} of {len(self.tokens)}: {problem}")
            if role not in ("read", "operator"):
                raise ConfigurationError(f"token {number} of {len(self.tokens)}: its role must"
                                         " be read or operator")
        object.__setattr__(self, "webhook_sources", normalise(self.webhook_sources))
        if not (self.failure_limit >= 1 and self.failure_window > 0 and self.session_ttl > 0
                and self.max_body >= 0 and self.tolerance >= 0):
            raise ConfigurationError("failure_limit, failure_window, session_ttl, max_body"
                                     " and tolerance must be positive")

    @classmethod
    def from_text(cls, tokens: str = "", secrets: str = "", **kwargs: Any) -> ServerConfig:
        """``"token1:operator:alice,token2:read"`` (a name after the role is who holds the
        token, in the dialog and the recovery log) and
        ``"github:s1:approval|upstream_ready,billing:s2"``."""
        parsed_tokens: dict[str, Role] = {}
        names: dict[str, str] = {}
        for number, item in enumerate(filter(None, (t.strip() for t in tokens.split(","))), 1):
            token, _, role = item.rpartition(":")
            named = ""
            if role not in ("read", "operator"):  # token:role:name
                named, (token, _, role) = role, token.rpartition(":")
            if role not in ("read", "operator") or not token:
                raise ConfigurationError(f"token entry {number}: write token:read or"
                                         " token:operator (or token:operator:name)")
            parsed_tokens[token] = role  # type: ignore[assignment]
            if named:
                names[token] = named
        return cls(parsed_tokens, parse_sources(secrets), names=names, **kwargs)


class NewTask(BaseModel):
    agent: str = Field(min_length=1, max_length=MAX_NAME)
    input: Any = None
    task_id: str | None = Field(None, min_length=1, max_length=TASK_ID)
    deadline: float | None = Field(None, ge=0, le=MAX_AHEAD, allow_inf_nan=False,
                                   description="seconds from now")
    not_before: float | None = Field(None, ge=0, le=MAX_AHEAD, allow_inf_nan=False,
                                     description="seconds from now")


class NewEvent(BaseModel):
    type: str = Field(min_length=1, max_length=MAX_NAME)
    payload: Any = None
    priority: int | None = Field(None, ge=0, le=4)
    source_event_id: Printable | None = Field(None, min_length=1, max_length=MAX_NAME)


class Resume(BaseModel):
    message: str | None = None
    patch: dict[str, Any] | None = None
    input: Any = Field(None, description=(
        "A corrected task input, in place of the one submitted (the old one stays in the"
        " dialog); leave it out to keep the input"))
    earlier_result: bool = Field(False, description=(
        "for a task holding a repeat of a side effect that already succeeded: answer it with"
        " the earlier identical call's result instead of running it (409 if none is held)"))
    etag: str | None = Field(None, max_length=64, description=(
        "the etag of the task as shown (GET /api/tasks/{id} gives it); refused (409) if the"
        " task is no longer as shown, dropped if it moves on before a worker applies it"))


class Rollback(BaseModel):
    version: int = Field(ge=1, le=LARGEST_COUNT)
    redo_side_effects: bool = False


class Fork(BaseModel):
    version: int | None = Field(None, ge=1, le=LARGEST_COUNT,
                                description="A kept version; default: the newest")
    task_id: str | None = Field(None, max_length=TASK_ID, description="The fork's id")
    redo_side_effects: bool = False
    paused: bool = Field(False, description="Start it paused, for a person to resume")


class NewSchedule(BaseModel):
    cron: str = Field(max_length=200, description="Five fields (minute hour day month weekday)"
                      ", or six with the seconds first")
    agent: str = Field(max_length=MAX_NAME)
    input: Any = None
    timezone: str = Field("UTC", max_length=64)
    catch_up: int = Field(0, ge=0, le=100, description="Missed runs to start late (0: skip)")
    paused: bool = False


class Decide(BaseModel):
    """What became of a side-effecting call whose outcome is unknown."""

    outcome: Literal["happened", "not_happened", "skip"] = Field(description=(
        "happened: record result as the call's and carry on; not_happened: run it now with"
        " the same idempotency key; skip: drop it"))
    result: Any = Field(None, description="the call's result (only with happened)")
    key: str | None = Field(None, max_length=400, description=(
        "the idempotency key of the call the decision is about, as shown to the person; if"
        " the task's call in doubt is another by now, the decision is refused (409)"))
    attempt: int | None = Field(None, ge=0, le=LARGEST_COUNT, description=(
        "the attempt of that call, as shown; refused (409) if the call was attempted again"))
    etag: str | None = Field(None, max_length=64, description=(
        "the etag of the task as shown (GET /api/tasks/{id} gives it); refused (409) if the"
        " task is no longer as shown, e.g. its worker died since the call was seen running"))

    @model_validator(mode="after")
    def result_only_if_it_happened(self) -> Decide:
        if self.outcome != Decision.HAPPENED.value and self.result is not None:
            raise ValueError("a result goes only with the outcome happened")
        return self


class Hook(BaseModel):
    id: Printable = Field(min_length=1, max_length=MAX_NAME,
                          description="the sender's id for this delivery (printable): a"
                          " repeat is stored once")
    type: str = Field(min_length=1, max_length=MAX_NAME)
    task_id: str = Field(min_length=1, max_length=TASK_ID)
    payload: Any = None


class _StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_json(await self.body())
        return self._json


class _StrictJSONRoute(APIRoute):
    """Routes whose JSON bodies refuse NaN, Infinity, huge integers and deep nesting (422)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictJSONRequest(request.scope, request.receive))

        return strict


def create_app(harness: Harness, config: ServerConfig) -> FastAPI:
    """The API for one harness (its store, registries and levers)."""
    app = FastAPI(title="tether", version="1", description=__doc__, docs_url=None,
                  redoc_url=None)
    app.router.route_class = _StrictJSONRoute
    limiter = FailureLimiter(config.failure_limit, config.failure_window)
    app.add_middleware(EdgeGuard, tokens=TokenTable(config.tokens, config.names), limiter=limiter,
                       max_body=config.max_body)
    _install_errors(app)
    slots = StreamSlots()
    app.state.streams = slots
    install_console(app, harness, config.tokens, limiter, config.session_ttl, slots,
                    config.names)
    sources: Mapping[str, WebhookSource] = config.webhook_sources  # type: ignore[assignment]

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/api/tasks")
    async def list_tasks(status: Status | None = None,
                         agent: str | None = Query(None, max_length=MAX_NAME),
                         q: str = Query("", max_length=200),
                         offset: int = Query(0, ge=0, le=LARGEST_COUNT),
                         limit: int = Query(100, ge=1, le=1000)) -> dict[str, Any]:
        """Without filters: the newest tasks first. With *agent*, *q* (a piece of the id or
        reason) or *offset*: people's work first, then newest, a page at a time. *agent*
        and *q* must be printable (422 otherwise)."""
        printable_parameter("agent", agent)
        printable_parameter("q", q)
        if agent is None and not q and not offset:
            records = await harness.reads.tasks(status, limit)
        else:
            records = await harness.reads.find(TaskQuery(status, agent, q, offset, limit))
        return {"counts": await harness.reads.counts(),
                "tasks": [_record(r) for r in records]}

    @app.get("/api/tasks/{task_id}")
    async def get_task(task_id: str) -> dict[str, Any]:
        info = await harness.get(task_id)
        return {"task": _record(info.record), "version": info.version, "etag": info.etag,
                "snapshot": orjson.loads(info.snapshot.dumps())}

    @app.get("/api/tasks/{task_id}/history")
    async def history(task_id: str, offset: int = Query(0, ge=0, le=LARGEST_COUNT),
                      limit: int = Query(100, ge=1, le=1000)) -> dict[str, Any]:
        rows = await harness.history(task_id)
        return {"total": len(rows), "offset": offset, "rows": rows[offset:offset + limit]}

    @app.get("/api/tasks/{task_id}/versions")
    async def versions(task_id: str) -> list[dict[str, Any]]:
        await harness.reads.task(check_task_id(task_id))
        return [{"version": v, "created_at": at, "bytes": size}
                for v, at, size in await harness.reads.versions(task_id)]

    @app.get("/api/tasks/{task_id}/stream", response_class=StreamingResponse)
    async def stream(task_id: str, after: str | None = Query(None, max_length=POSITION_CHARS),
                     last_event_id: str | None = Header(None, max_length=POSITION_CHARS)
                     ) -> StreamingResponse:
        """The task's committed changes as server-sent events, until it finishes: ``state``
        (status, version, step, lease), ``row`` (a dialog row), ``recovery`` (a recovery
        record), ``reset`` (a rollback: the dialog starts again) and ``end``. Each event's
        id is the position to go on from (``Last-Event-ID`` or ``?after=``)."""
        return await stream_response(harness, check_task_id(task_id), last_event_id or after,
                                     slots)

    @app.get("/api/tasks/{task_id}/events")
    async def events(task_id: str) -> list[dict[str, Any]]:
        await harness.reads.task(check_task_id(task_id))
        return [{**e.event.to_dict(), "status": e.status, "coalesce": e.coalesce}
                for e in await harness.reads.events(task_id)]

    @app.get("/api/tasks/{task_id}/recovery")
    async def recovery_log(task_id: str) -> list[dict[str, Any]]:
        await harness.reads.task(check_task_id(task_id))
        return await harness.reads.recovery_log(task_id)

    @app.get("/api/tasks/{task_id}/bundle")
    async def bundle(task_id: str) -> dict[str, Any]:
        return await harness.export(task_id)

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus text format: this process's counters, and the store's gauges."""
        body = render_metrics(harness.counters, await harness.reads.counts(),
                              await harness.reads.inbox_depth(), await harness.reads.limits())
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.post("/api/tasks", status_code=201)
    async def submit(body: NewTask) -> dict[str, str]:
        task_id = await harness.submit(body.agent, body.input, task_id=body.task_id,
                                       deadline=body.deadline, not_before=body.not_before)
        return {"task_id": task_id}

    @app.post("/api/tasks/{task_id}/events", status_code=202)
    async def emit(task_id: str, body: NewEvent) -> dict[str, Any]:
        """Any event of the protocol but the levers, which have routes of their own."""
        if body.type in RESERVED_EVENTS:
            route = LEVER_ROUTES.get(body.type)
            raise HTTPRefusal(403, f"event type {body.type!r} is a lever: use POST"
                                   f" /api/tasks/{{task_id}}{route}" if route else
                              f"event type {body.type!r} is set by the harness itself (its"
                              " timers and deadlines); it cannot be sent")
        return _receipt(await harness.emit(Event(body.type, task_id, body.payload, body.priority,
                                                 body.source_event_id)))

    @app.post("/api/tasks/{task_id}/resume", status_code=202)
    async def resume(task_id: str, body: Resume, request: Request) -> dict[str, Any]:
        new_input = {"input": body.input} if "input" in body.model_fields_set else {}
        return await _lever(harness, task_id, harness.resume(
            task_id, body.message, body.patch, by=_by(request),
            earlier_result=body.earlier_result, etag=body.etag, **new_input))

    @app.post("/api/tasks/{task_id}/decide", status_code=202)
    async def decide(task_id: str, body: Decide, request: Request) -> dict[str, Any]:
        """Say what became of a side-effecting call in doubt (the task is needs_human)."""
        return await _lever(harness, task_id, harness.decide(
            task_id, body.outcome, body.result, by=_by(request), key=body.key,
            attempt=body.attempt, etag=body.etag))

    @app.post("/api/tasks/{task_id}/rollback", status_code=202)
    async def rollback(task_id: str, body: Rollback, request: Request) -> dict[str, Any]:
        return await _lever(harness, task_id, harness.rollback(
            task_id, body.version, body.redo_side_effects, by=_by(request)))

    @app.post("/api/tasks/{task_id}/fork", status_code=201)
    async def fork(task_id: str, body: Fork, request: Request) -> dict[str, str]:
        """A new task from a kept version of this one (which stays as it is): its own id and
        idempotency keys, this task's history up to that version."""
        fork_id = await harness.fork(task_id, body.version, new_task_id=body.task_id,
                                     redo_side_effects=body.redo_side_effects,
                                     paused=body.paused, by=_by(request))
        return {"task_id": fork_id, "forked_from": task_id}

    @app.get("/api/schedules")
    async def list_schedules() -> list[dict[str, Any]]:
        return [asdict(record) for record in await harness.reads.schedules()]

    @app.put("/api/schedules/{name}")
    async def put_schedule(name: str, body: NewSchedule) -> dict[str, Any]:
        """Create the schedule, or replace its definition."""
        printable_parameter("name", name)
        return asdict(await harness.schedule(name, body.cron, body.agent, body.input,
                                             timezone=body.timezone, catch_up=body.catch_up,
                                             paused=body.paused))

    @app.post("/api/schedules/{name}/{action}")
    async def steer_schedule(name: str, action: Literal["pause", "resume", "run"]
                             ) -> dict[str, Any]:
        """Pause, resume, or start one run now (its task id is returned)."""
        printable_parameter("name", name)
        if action == "run":
            return {"task_id": await harness.run_schedule_now(name)}
        return asdict(await harness.pause_schedule(name, paused=action == "pause"))

    @app.delete("/api/schedules/{name}")
    async def delete_schedule(name: str) -> dict[str, str]:
        printable_parameter("name", name)
        await harness.delete_schedule(name)
        return {"deleted": name}

    @app.delete("/api/tasks/{task_id}")
    async def delete(task_id: str, request: Request) -> dict[str, str]:
        """Delete the task and everything it stored; 409 while a worker holds it."""
        await harness.delete(task_id, by=_by(request))
        return {"deleted": task_id}

    @app.post("/api/tasks/{task_id}/cancel", status_code=202)
    async def cancel(task_id: str, request: Request) -> dict[str, Any]:
        return await _lever(harness, task_id, harness.cancel(task_id, by=_by(request)))

    @app.post("/hooks/{source}", status_code=202)
    async def webhook(source: str, request: Request,
                      x_tether_timestamp: str = Header(...),
                      x_tether_signature: str = Header(...)) -> dict[str, Any]:
        """A signed delivery from a configured source (see the module)."""
        sender = sources.get(source)
        if sender is None:
            raise HTTPRefusal(404, f"no webhook source {source[:MAX_NAME]!r} is configured")
        body = await request.body()
        try:
            verify(sender, x_tether_timestamp, x_tether_signature, body, config.tolerance,
                   time.time())
        except BadSignature as wrong:
            # the signature is the credential: a valid one was let through above, whatever
            # this address's failures; a wrong one counts, or is a 429 while it is limited
            raise wrong_credential(limiter, client_of(request.scope)) or wrong from None
        try:
            hook = Hook.model_validate(strict_json(body))
        except ValueError as exc:
            if isinstance(exc, ValidationError):
                raise
            raise HTTPRefusal(422, f"the webhook body is not JSON: {exc}") from None
        check_type(source, sender, hook.type)
        return _receipt(await harness.emit(Event(hook.type, hook.task_id, hook.payload,
                                                 source_event_id=f"{source}:{hook.id}")))

    return app


def _by(request: Request) -> str:
    """Who pulled a lever: set by the edge guard from the token (``api:`` and a short hash)."""
    return str(request.state.tether_by)


def _install_errors(app: FastAPI) -> None:
    """Every failure as JSON with a fitting status, never a traceback nor a server path."""

    @app.exception_handler(HTTPRefusal)
    async def refused(_: Request, exc: HTTPRefusal) -> Response:
        return _json(exc.status, str(exc), exc.headers)

    @app.exception_handler(ValidationError)
    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: ValidationError | RequestValidationError
                              ) -> Response:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                             for e in exc.errors())
        return _json(422, scrub_paths(f"the request is not what this endpoint takes: {problems}"))

    @app.exception_handler(StarletteHTTPException)
    async def http_exception(_: Request, exc: StarletteHTTPException) -> Response:
        return _json(exc.status_code, str(exc.detail))

    @app.exception_handler(TetherError)
    async def tether_error(_: Request, exc: TetherError) -> Response:
        status = next((code for kind, code in STATUS_FOR.items() if isinstance(exc, kind)), 500)
        if status >= 500:
            log.error("%s serving a request: %s", type(exc).__name__, exc)
        headers = {"Retry-After": "1"} if isinstance(exc, InboxFull) else \
            {"Retry-After": "5"} if status == 503 else None
        return _json(status, scrub_paths(str(exc)), headers, type(exc).__name__)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> Response:
        log.error("unexpected error serving a request", exc_info=exc)
        return _json(500, "internal error; see the server's log")


def render_metrics(counters: Mapping[str, int], tasks: Mapping[str, int], pending: int,
                   limits: Sequence[LimitUsage] = ()) -> bytes:
    """Counters and gauges in the Prometheus exposition format."""
    by_status = GaugeMetricFamily("tether_tasks", "Tasks in the store by status", labels=["status"])
    for status in Status:
        by_status.add_metric([status.value], tasks.get(status.value, 0))
    steps = CounterMetricFamily("tether_steps", "Steps this process carried out")
    steps.add_metric([], counters.get("steps", 0))
    recoveries = CounterMetricFamily("tether_recoveries", "Recovery actions by strategy",
                                     labels=["strategy"])
    events = CounterMetricFamily("tether_events", "Events sent through this process, by outcome",
                                 labels=["outcome"])
    for key, value in sorted(counters.items()):
        if key.startswith("recovery:"):
            recoveries.add_metric([key.removeprefix("recovery:")], value)
    for outcome in ("stored", "duplicate", "coalesced", "refused"):
        events.add_metric([outcome], counters.get(f"events_{outcome}", 0))
    completions = CounterMetricFamily("tether_model_completions",
                                      "Model completions this process's tasks paid for")
    completions.add_metric([], counters.get("model_completions", 0))
    tokens = CounterMetricFamily("tether_model_tokens", "Model tokens this process's tasks"
                                 " used, by kind", labels=["kind"])
    for kind in ("prompt", "completion"):
        tokens.add_metric([kind], counters.get(f"model_{kind}_tokens", 0))
    depth = GaugeMetricFamily("tether_inbox_depth", "Events stored and not yet applied")
    depth.add_metric([], pending)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([by_status, steps, recoveries, events, completions, tokens,
                                   depth, *_limit_gauges(limits)]))
    return generate_latest(registry)


def _limit_gauges(limits: Sequence[LimitUsage]) -> list[Any]:
    """Each named limit and key: slots in use, tasks held back, admissions in the last
    minute, seconds a provider's 429 still closes it for."""
    labels = ["limit", "key"]
    families = {
        "in_use": GaugeMetricFamily("tether_limit_in_use", "Slots of a limit held now", labels=labels),
        "waiting": GaugeMetricFamily("tether_limit_waiting", "Tasks held back by a limit",
                                     labels=labels),
        "admitted": GaugeMetricFamily("tether_limit_admitted_last_minute",
                                      "Calls a rate limit admitted in the last minute",
                                      labels=labels),
        "blocked": GaugeMetricFamily("tether_limit_blocked_seconds", "Seconds a provider's 429"
                                     " still closes a limit for", labels=labels)}
    now = time.time()
    for usage in limits:
        at = [usage.name, usage.key]
        families["in_use"].add_metric(at, usage.in_use)
        families["waiting"].add_metric(at, usage.waiting)
        families["admitted"].add_metric(at, usage.admitted_last_minute)
        families["blocked"].add_metric(at, max(0.0, (usage.blocked_until or now) - now))
    return list(families.values())


class _Families:
    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


def _json(status: int, message: str, headers: dict[str, str] | None = None,
          kind: str | None = None) -> Response:
    """An error as JSON: the message, and for tether's own errors their class (``type``),
    which ``tether.client`` raises again on its side."""
    body = {"error": message} if kind is None else {"error": message, "type": kind}
    return JSONResponse(body, status_code=status, headers=headers)


def _record(record: Any) -> dict[str, Any]:
    return {**asdict(record), "status": record.status.value}


def _receipt(receipt: EmitReceipt) -> dict[str, Any]:
    return {"event_id": receipt.event_id, "outcome": receipt.outcome, "coalesced": receipt.coalesced}


async def _lever(harness: Harness, task_id: str, lever: Awaitable[EmitReceipt]) -> dict[str, Any]:
    """A lever's receipt, the task's status now, and, while the lever waits for a worker,
    what of the task's code this server lacks (it applies no lever it cannot judge)."""
    receipt = await lever
    info = await harness.get(task_id)
    answer = {**_receipt(receipt), "status": info.record.status.value, "version": info.version}
    event = next((e for e in await harness.reads.events(task_id)
                  if e.event.id == receipt.event_id), None)
    if event is not None and event.status == EventStatus.PENDING:
        answer["queued"] = True
        lacking = harness.lacks_code(info.snapshot)
        if lacking:
            answer["lacks_code"] = lacking
    return answer

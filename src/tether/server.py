"""The HTTP API (``tether serve``): read and steer tasks, and take signed webhooks (R3, R23, R26).

Every route but ``/healthz`` needs a bearer token; a token is ``read`` (GET only) or
``operator`` (may also submit, emit, resume, roll back, cancel). Webhooks are signed
instead: ``POST /hooks/{source}`` carries ``X-Tether-Timestamp`` (Unix seconds) and
``X-Tether-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" with the source's
secret>``; a timestamp outside ``tolerance`` is refused, so a captured request cannot be
replayed later, and the sender's ``id`` becomes the event's ``source_event_id``, so a
retried delivery is stored once. Every accepted event is durable before the answer
(``202``); a low-priority event refused by backpressure gets ``429`` with ``Retry-After``.

Errors are JSON (``{"error": "..."}``) with the status that fits, never a stack trace;
request bodies are bounded; the server binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import orjson

from tether.console import install_console
from tether.errors import (
    ConfigurationError,
    IllegalTransition,
    InboxFull,
    InvalidInput,
    TaskClosed,
    TaskExists,
    TaskNotFound,
    TetherError,
    UnknownAgent,
    UnknownEventType,
    VersionNotFound,
)
from tether.harness import Harness
from tether.model import EmitReceipt, Event, Status

try:
    from fastapi import Depends, FastAPI, Header, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from pydantic import BaseModel, Field, ValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ConfigurationError("the HTTP API needs FastAPI: pip install 'tether[server]'") from exc

log = logging.getLogger("tether.server")
Role = Literal["read", "operator"]
STATUS_FOR: dict[type[TetherError], int] = {
    TaskNotFound: 404, VersionNotFound: 404, UnknownAgent: 422, UnknownEventType: 422,
    InvalidInput: 422, TaskExists: 409, TaskClosed: 409, IllegalTransition: 409, InboxFull: 429,
}


@dataclass(frozen=True)
class ServerConfig:
    """Who may do what. Tokens map to a role; webhook sources map to their secret."""

    tokens: Mapping[str, Role] = field(default_factory=dict)
    webhook_secrets: Mapping[str, str] = field(default_factory=dict)
    tolerance: float = 300.0
    """Seconds a webhook's timestamp may be away from now (replay protection)."""
    max_body: int = 1 << 20

    @classmethod
    def from_text(cls, tokens: str = "", secrets: str = "", **kwargs: Any) -> ServerConfig:
        """``"token1:operator,token2:read"`` and ``"github:secret1,billing:secret2"``."""
        parsed_tokens: dict[str, Role] = {}
        for item in filter(None, (t.strip() for t in tokens.split(","))):
            token, _, role = item.rpartition(":")
            if role not in ("read", "operator") or not token:
                raise ConfigurationError(f"token entry {item[:4]}...: write token:read or"
                                         " token:operator")
            parsed_tokens[token] = role  # type: ignore[assignment]
        parsed_secrets = {}
        for item in filter(None, (s.strip() for s in secrets.split(","))):
            source, _, secret = item.partition(":")
            if not source or not secret:
                raise ConfigurationError(f"webhook secret entry for {source!r}: write source:secret")
            parsed_secrets[source] = secret
        return cls(parsed_tokens, parsed_secrets, **kwargs)


class NewTask(BaseModel):
    agent: str
    input: Any = None
    task_id: str | None = None
    deadline: float | None = Field(None, description="seconds from now")
    not_before: float | None = Field(None, description="seconds from now")


class NewEvent(BaseModel):
    type: str
    payload: Any = None
    priority: int | None = Field(None, ge=0, le=4)
    source_event_id: str | None = None


class Resume(BaseModel):
    message: str | None = None
    patch: dict[str, Any] | None = None


class Rollback(BaseModel):
    version: int
    redo_side_effects: bool = False


class Hook(BaseModel):
    id: str = Field(description="the sender's id for this delivery: a repeat is stored once")
    type: str
    task_id: str
    payload: Any = None


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The signature a webhook sender puts in ``X-Tether-Signature``."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def create_app(harness: Harness, config: ServerConfig) -> FastAPI:
    """The API for one harness (its store, registries and levers)."""
    app = FastAPI(title="tether", version="1", description=__doc__)
    _install_guards(app, config)
    auth = _Auth(config)
    reader, operator = Depends(auth.require("read")), Depends(auth.require("operator"))

    install_console(app, harness, config.tokens)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/api/tasks", dependencies=[reader])
    async def list_tasks(status: Status | None = None,
                         limit: int = Query(100, ge=1, le=1000)) -> dict[str, Any]:
        records = await harness.store.list_tasks(status, limit)
        return {"counts": await harness.store.count_by_status(),
                "tasks": [_record(r) for r in records]}

    @app.get("/api/tasks/{task_id}", dependencies=[reader])
    async def get_task(task_id: str) -> dict[str, Any]:
        info = await harness.get(task_id)
        return {"task": _record(info.record), "version": info.version,
                "snapshot": orjson.loads(info.snapshot.dumps())}

    @app.get("/api/tasks/{task_id}/history", dependencies=[reader])
    async def history(task_id: str, offset: int = Query(0, ge=0),
                      limit: int = Query(100, ge=1, le=1000)) -> dict[str, Any]:
        rows = await harness.history(task_id)
        return {"total": len(rows), "offset": offset, "rows": rows[offset:offset + limit]}

    @app.get("/api/tasks/{task_id}/versions", dependencies=[reader])
    async def versions(task_id: str) -> list[dict[str, Any]]:
        await harness.store.get_task(task_id)
        return [{"version": v, "created_at": at, "bytes": size}
                for v, at, size in await harness.store.list_versions(task_id)]

    @app.get("/api/tasks/{task_id}/events", dependencies=[reader])
    async def events(task_id: str) -> list[dict[str, Any]]:
        await harness.store.get_task(task_id)
        return [{**e.event.to_dict(), "status": e.status, "coalesce": e.coalesce}
                for e in await harness.store.list_events(task_id)]

    @app.get("/api/tasks/{task_id}/recovery", dependencies=[reader])
    async def recovery_log(task_id: str) -> list[dict[str, Any]]:
        await harness.store.get_task(task_id)
        return await harness.store.list_recovery_log(task_id)

    @app.get("/api/tasks/{task_id}/bundle", dependencies=[reader])
    async def bundle(task_id: str) -> dict[str, Any]:
        return await harness.export(task_id)

    @app.get("/metrics", dependencies=[reader])
    async def metrics() -> Response:
        """Prometheus text format: this process's counters, and the store's gauges."""
        body = render_metrics(harness.counters, await harness.store.count_by_status(),
                              await harness.store.count_pending_events())
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.post("/api/tasks", status_code=201, dependencies=[operator])
    async def submit(body: NewTask) -> dict[str, str]:
        task_id = await harness.submit(body.agent, body.input, task_id=body.task_id,
                                       deadline=body.deadline, not_before=body.not_before)
        return {"task_id": task_id}

    @app.post("/api/tasks/{task_id}/events", status_code=202, dependencies=[operator])
    async def emit(task_id: str, body: NewEvent) -> dict[str, Any]:
        return _receipt(await harness.emit(Event(body.type, task_id, body.payload, body.priority,
                                                 body.source_event_id)))

    @app.post("/api/tasks/{task_id}/resume", status_code=202, dependencies=[operator])
    async def resume(task_id: str, body: Resume) -> dict[str, Any]:
        return await _lever(harness, task_id, harness.resume(task_id, body.message, body.patch))

    @app.post("/api/tasks/{task_id}/rollback", status_code=202, dependencies=[operator])
    async def rollback(task_id: str, body: Rollback) -> dict[str, Any]:
        return await _lever(harness, task_id, harness.rollback(task_id, body.version,
                                                               body.redo_side_effects))

    @app.post("/api/tasks/{task_id}/cancel", status_code=202, dependencies=[operator])
    async def cancel(task_id: str) -> dict[str, Any]:
        return await _lever(harness, task_id, harness.cancel(task_id))

    @app.post("/hooks/{source}", status_code=202)
    async def webhook(source: str, request: Request,
                      x_tether_timestamp: str = Header(...),
                      x_tether_signature: str = Header(...)) -> dict[str, Any]:
        body = await request.body()
        _verify(config, source, x_tether_timestamp, x_tether_signature, body)
        hook = Hook.model_validate_json(body)
        return _receipt(await harness.emit(Event(hook.type, hook.task_id, hook.payload,
                                                 source_event_id=f"{source}:{hook.id}")))

    return app


class _Auth:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config

    def require(self, role: Role) -> Callable[..., Awaitable[None]]:
        async def check(authorization: str | None = Header(None)) -> None:
            token = (authorization or "").removeprefix("Bearer ").strip()
            granted = self.config.tokens.get(token) if token else None
            if granted is None:
                raise _HTTPError(401, "a valid bearer token is needed (Authorization: Bearer ...)")
            if role == "operator" and granted != "operator":
                raise _HTTPError(403, "this token may read but not change tasks")
        return check


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


def _verify(config: ServerConfig, source: str, timestamp: str, signature: str, body: bytes) -> None:
    secret = config.webhook_secrets.get(source)
    if secret is None:
        raise _HTTPError(404, f"no webhook source {source!r} is configured")
    if not hmac.compare_digest(sign(secret, timestamp, body), signature):
        raise _HTTPError(401, "the webhook signature does not match its body and timestamp")
    try:
        age = abs(time.time() - float(timestamp))
    except ValueError:
        raise _HTTPError(401, "X-Tether-Timestamp must be Unix seconds") from None
    if age > config.tolerance:
        raise _HTTPError(401, f"the webhook timestamp is {age:.0f}s away from now (tolerance"
                              f" {config.tolerance:.0f}s): a replay, or a clock to fix")


def _install_guards(app: FastAPI, config: ServerConfig) -> None:
    """Bounded bodies, and every failure as JSON with a fitting status, never a traceback."""

    @app.middleware("http")
    async def bound_body(request: Request, call_next: Callable[[Request], Awaitable[Response]]
                         ) -> Response:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > config.max_body):
            return _json(413, f"request body over {config.max_body} bytes")
        if declared is None and "chunked" in request.headers.get("transfer-encoding", ""):
            return _json(411, "send a Content-Length: bodies of unknown size are not accepted")
        return await call_next(request)

    @app.exception_handler(_HTTPError)
    async def http_error(_: Request, exc: _HTTPError) -> Response:
        return _json(exc.status, str(exc), exc.headers)

    @app.exception_handler(ValidationError)
    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: ValidationError | RequestValidationError
                              ) -> Response:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                             for e in exc.errors())
        return _json(422, f"the request is not what this endpoint takes: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def http_exception(_: Request, exc: StarletteHTTPException) -> Response:
        return _json(exc.status_code, str(exc.detail))

    @app.exception_handler(TetherError)
    async def tether_error(_: Request, exc: TetherError) -> Response:
        status = next((code for kind, code in STATUS_FOR.items() if isinstance(exc, kind)), 500)
        headers = {"Retry-After": "1"} if isinstance(exc, InboxFull) else None
        return _json(status, str(exc), headers)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> Response:
        log.error("unexpected error serving a request", exc_info=exc)
        return _json(500, "internal error; see the server's log")


def render_metrics(counters: Mapping[str, int], tasks: Mapping[str, int], pending: int) -> bytes:
    """Counters and gauges in the Prometheus exposition format."""
    by_status = GaugeMetricFamily("tether_tasks", "Tasks in the store by status", labels=["status"])
    for status in Status:
        by_status.add_metric([status.value], tasks.get(status.value, 0))
    steps = CounterMetricFamily("tether_steps", "Steps this process carried out")
    steps.add_metric([], counters.get("steps", 0))
    recoveries = CounterMetricFamily("tether_recoveries", "Recovery actions by strategy (R23)",
                                     labels=["strategy"])
    events = CounterMetricFamily("tether_events", "Events sent through this process, by outcome",
                                 labels=["outcome"])
    for key, value in sorted(counters.items()):
        if key.startswith("recovery:"):
            recoveries.add_metric([key.removeprefix("recovery:")], value)
    for outcome in ("stored", "duplicate", "coalesced", "refused"):
        events.add_metric([outcome], counters.get(f"events_{outcome}", 0))
    depth = GaugeMetricFamily("tether_inbox_depth", "Events stored and not yet applied")
    depth.add_metric([], pending)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([by_status, steps, recoveries, events, depth]))
    return generate_latest(registry)


class _Families:
    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


def _json(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _record(record: Any) -> dict[str, Any]:
    return {**asdict(record), "status": record.status.value}


def _receipt(receipt: EmitReceipt) -> dict[str, Any]:
    return {"event_id": receipt.event_id, "outcome": receipt.outcome, "coalesced": receipt.coalesced}


async def _lever(harness: Harness, task_id: str, lever: Awaitable[EmitReceipt]) -> dict[str, Any]:
    receipt = await lever
    info = await harness.get(task_id)
    return {**_receipt(receipt), "status": info.record.status.value, "version": info.version}

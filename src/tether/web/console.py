"""The web console, served by ``tether serve`` (R2, R26): see every task, step in where needed.

Server-rendered HTML (Jinja2 templates in ``tether/web/templates``) and a few lines of plain
JavaScript for live updates; no front-end build. A person signs in with an API token; the
browser then holds only a session id (:mod:`tether.web.sessions`: HttpOnly,
SameSite=Strict, 8 hours, ended by signing out or by a server restart). A ``read`` token
can look; an ``operator`` token can also resume, roll back, cancel and decide what became
of a call in doubt. Every form is checked for its origin and its session's CSRF token.

Open without signing in: only the sign-in page itself (``GET /console``).
"""

from __future__ import annotations

import difflib
import secrets
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import orjson

from tether.agent import completion_summary
from tether.engine.decisions import DECISIONS, Decision
from tether.engine.timers import local_time
from tether.errors import TetherError
from tether.harness import Harness
from tether.model import LARGEST_COUNT, CallStatus, Status
from tether.web.security import FailureLimiter, Role, TokenTable, client_of, operator_id

try:
    from fastapi import FastAPI, Form, Query, Request
    from fastapi.responses import HTMLResponse, RedirectResponse, Response
    from jinja2 import Environment, PackageLoader, select_autoescape
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    from tether.errors import ConfigurationError

    raise ConfigurationError("the console needs FastAPI and Jinja2: pip install 'tether[server]'"
                             ) from exc

from tether.web.sessions import (
    COOKIE_PATH,
    LOGIN_COOKIE,
    LOGIN_TTL,
    SESSION_COOKIE,
    Session,
    Sessions,
    new_login_token,
    same_origin,
    secure,
    tokens_match,
)

ORDER = [Status.NEEDS_HUMAN, Status.RUNNING, Status.PAUSED, Status.WAITING, Status.PENDING,
         Status.FAILED, Status.COMPLETED, Status.CANCELLED]
_templates = Environment(loader=PackageLoader("tether.web", "templates"),
                         autoescape=select_autoescape(["html"]))


def install_console(app: FastAPI, harness: Harness, tokens: Mapping[str, Role],
                    limiter: FailureLimiter, session_ttl: float = 8 * 3600) -> None:
    """Add the console's pages to the API app."""
    table = TokenTable(tokens)
    sessions = Sessions(session_ttl)

    def session_of(request: Request) -> Session | None:
        return sessions.get(request.cookies.get(SESSION_COOKIE))

    def page(name: str, request: Request, session: Session | None, code: int = 200,
             flash: list[tuple[str, bool]] | None = None, **context: Any) -> HTMLResponse:
        nonce = secrets.token_urlsafe(16)
        shown = flash if flash is not None else (session.flash if session else [])
        html = _templates.get_template(name).render(
            worker=harness.worker_id, when=local_time, flash=list(shown), session=session,
            csrf=session.csrf if session else "", nonce=nonce, **context)
        if session is not None:
            session.flash = []
        return HTMLResponse(html, code, headers=_headers(nonce))

    def sign_in_page(request: Request, message: str | None = None, code: int = 200
                     ) -> Response:
        login = new_login_token()
        answer = page("login.html", request, None, code,
                      flash=[(message, True)] if message else [], login_csrf=login)
        answer.set_cookie(LOGIN_COOKIE, login, max_age=LOGIN_TTL, path=COOKIE_PATH,
                          httponly=True, samesite="strict", secure=secure(request))
        return answer

    @app.get("/console", response_class=HTMLResponse, include_in_schema=False)
    async def tasks(request: Request, status: Status | None = None) -> Response:
        session = session_of(request)
        if session is None:
            return sign_in_page(request)
        counts = await harness.reads.counts()
        return page("tasks.html", request, session, tasks=await _listing(harness, status),
                    status=status.value if status else "", total=sum(counts.values()),
                    counts=[(s.value, counts[s.value]) for s in ORDER if s.value in counts])

    @app.get("/console/rows", response_class=HTMLResponse, include_in_schema=False)
    async def rows(request: Request, status: Status | None = None) -> Response:
        session = session_of(request)
        if session is None:
            return Response(status_code=401)
        return page("rows.html", request, None, tasks=await _listing(harness, status))

    @app.post("/console/login", include_in_schema=False)
    async def login(request: Request, token: str = Form(""), csrf: str = Form("")) -> Response:
        client = client_of(request.scope)
        if not same_origin(request) or not tokens_match(request.cookies.get(LOGIN_COOKIE), csrf):
            limiter.failed(client)
            return _refused("the sign-in form did not come from this console: reload the"
                            " page and sign in again")
        role = table.role_of(token) if token else None
        if role is None:
            limiter.failed(client)
            return sign_in_page(request, "That token is not valid", code=401)
        previous = session_of(request)
        if previous is not None:  # a new sign-in never keeps an old session id alive
            sessions.end(previous.id)
        session = sessions.start(role, operator_id("console", token))
        answer = RedirectResponse("/console", 303)
        answer.set_cookie(SESSION_COOKIE, session.id, max_age=int(sessions.ttl),
                          path=COOKIE_PATH, httponly=True, samesite="strict",
                          secure=secure(request))
        answer.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
        return answer

    @app.post("/console/logout", include_in_schema=False)
    async def logout(request: Request, csrf: str = Form("")) -> Response:
        session = session_of(request)
        if session is None or not same_origin(request) or not tokens_match(session.csrf, csrf):
            return _refused("sign out from the console's own page")
        sessions.end(session.id)
        answer = RedirectResponse("/console", 303)
        answer.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH, httponly=True,
                             samesite="strict", secure=secure(request))
        return answer

    @app.get("/console/tasks/{task_id}", response_class=HTMLResponse, include_in_schema=False)
    async def task(request: Request, task_id: str) -> Response:
        session = session_of(request)
        if session is None:
            return RedirectResponse("/console", 303)
        info = await harness.get(task_id)
        reads = harness.reads
        call = info.snapshot.call
        return page("task.html", request, session, record=info.record, snap=info.snapshot,
                    version=info.version, history=await harness.history(task_id),
                    versions=[{"version": v} for v, _, _ in await reads.versions(task_id)],
                    events=await reads.events(task_id),
                    calls=await reads.calls(task_id),
                    recoveries=await reads.recovery_log(task_id),
                    in_doubt=info.record.status is Status.NEEDS_HUMAN and call is not None
                    and call.status == CallStatus.STARTED,
                    describe=_describe, detail=_detail)

    @app.get("/console/tasks/{task_id}/diff", response_class=HTMLResponse, include_in_schema=False)
    async def diff(request: Request, task_id: str, a: int = Query(ge=1, le=LARGEST_COUNT),
                   b: int = Query(ge=1, le=LARGEST_COUNT)) -> Response:
        session = session_of(request)
        if session is None:
            return RedirectResponse("/console", 303)
        old, new = (await _pretty(harness, task_id, a)), (await _pretty(harness, task_id, b))
        lines = list(difflib.unified_diff(old, new, f"version {a}", f"version {b}", lineterm=""))
        return page("diff.html", request, session, task_id=task_id, a=a, b=b,
                    lines=lines or ["(no difference)"])

    @app.get("/console/tasks/{task_id}/bundle", include_in_schema=False)
    async def bundle(request: Request, task_id: str) -> Response:
        if session_of(request) is None:
            return RedirectResponse("/console", 303)
        body = orjson.dumps(await harness.export(task_id), option=orjson.OPT_INDENT_2)
        return Response(body, media_type="application/json", headers={
            "content-disposition": f'attachment; filename="{quote(task_id, safe="")}.json"'})

    @app.post("/console/tasks/{task_id}/{lever}", include_in_schema=False)
    async def act(request: Request, task_id: str, lever: str) -> Response:
        session = session_of(request)
        form = await request.form() if session is not None and same_origin(request) else None
        if session is None or form is None or not tokens_match(session.csrf, form.get("csrf")):
            return _refused("the form did not come from this console's page: reload it and"
                            " try again")
        if session.role != "operator":
            return _back(session, task_id, "Only an operator token may change tasks", True)
        try:
            done = await _pull(harness, task_id, lever, form, session.by)
        except (TetherError, ValueError) as exc:
            return _back(session, task_id, str(exc), True)
        return _back(session, task_id, done, False)


async def _pull(harness: Harness, task_id: str, lever: str, form: Any, by: str) -> str:
    """Pull one lever from a console form; what to tell the person."""
    if lever == "resume":
        await harness.resume(task_id, message=str(form.get("message") or "") or None, by=by)
    elif lever == "rollback":
        version = int(str(form.get("version")))
        if not 1 <= version <= LARGEST_COUNT:
            raise ValueError(f"no version {version}")
        await harness.rollback(task_id, version, by=by)
    elif lever == "cancel":
        await harness.cancel(task_id, by=by)
    elif lever == "decide":
        outcome = str(form.get("outcome") or "")
        if outcome not in DECISIONS:
            raise ValueError("choose happened, did not happen or skip")
        text = str(form.get("result") or "").strip()
        try:
            result = orjson.loads(text) if outcome == Decision.HAPPENED and text else None
        except orjson.JSONDecodeError:
            raise ValueError("the result must be JSON (a quoted string, a number, an object"
                             " ...)") from None
        await harness.decide(task_id, outcome, result, by=by)
        return f"decision sent: {outcome.replace('_', ' ')}"
    else:
        raise ValueError(f"no such action {lever!r}")
    return f"{lever} sent"


def _headers(nonce: str) -> dict[str, str]:
    """No framing (clickjacking), scripts only with this page's nonce, nothing cached."""
    return {"Content-Security-Policy": f"default-src 'self'; script-src 'nonce-{nonce}';"
            " style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none';"
            " form-action 'self'; base-uri 'none'",
            "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin", "Cache-Control": "no-store"}


def _refused(message: str) -> Response:
    return HTMLResponse(f"<!doctype html><title>refused</title><p>{message}</p>"
                        '<p><a href="/console">back to the console</a></p>', 403,
                        headers=_headers(secrets.token_urlsafe(8)))


async def _listing(harness: Harness, status: Status | None) -> list[Any]:
    records = await harness.reads.tasks(status, limit=500)
    return sorted(records, key=lambda r: (ORDER.index(r.status), -r.updated_at))


async def _pretty(harness: Harness, task_id: str, version: int) -> list[str]:
    _, head = await harness.reads.head(task_id, version)
    return orjson.dumps(orjson.loads(head), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
                        ).decode().splitlines()


def _back(session: Session, task_id: str, message: str, error: bool) -> Response:
    session.flash[:] = [*session.flash[-4:], (message[:500], error)]
    return RedirectResponse(f"/console/tasks/{quote(task_id, safe='')}", 303)


def _describe(row: Mapping[str, Any]) -> str:
    if "tool_call" in row:
        return f"tool call {row['tool_call']['name']}"
    if row.get("role") == "tool":
        return f"{row.get('name')} {'failed' if 'error' in row else 'returned'}"
    if row.get("role") in ("user", "event"):
        return f"event {row.get('type')}"
    if row.get("role") == "assistant":
        return "reply (cut off)" if row.get("cut_off") else "reply"
    if row.get("role") == "model":
        return "model call"
    return str(row.get("event") or row.get("role"))


def _detail(row: Mapping[str, Any]) -> str:
    if "tool_call" in row:
        call = row["tool_call"]
        return f"key {call['key']}  args {orjson.dumps(call['args']).decode()[:300]}"
    if row.get("role") == "model":
        return completion_summary(row)
    value = row.get("error") or row.get("content")
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return text[:500]

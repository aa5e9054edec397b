"""The web console, served by ``tether serve`` (R2, R26): see every task, step in where needed.

Server-rendered HTML (Jinja2 templates in ``tether/web/templates``) and a few lines of plain
JavaScript for live updates; no front-end build. A person signs in with an API token; the
browser then holds only a session id (:mod:`tether.web.sessions`: HttpOnly,
SameSite=Strict, 8 hours, ended by signing out or by a server restart). A ``read`` token
can look; an ``operator`` token can also resume, roll back, cancel and decide what became
of a call in doubt. Every form is checked for its origin and its session's CSRF token.

Open without signing in: only the sign-in page itself (``GET /console``) and the icon
browsers ask for on every page (``/favicon.ico``, ``/favicon.svg``: cacheable, no credential
needed, so fetching it is never a failed credential). A sign-in counts towards the
failure limit only when it presents a token and the token is wrong; a valid token signs
in even while the address is limited (:mod:`tether.web.security`). Search texts and agent
names in the list's query must be printable (a NUL or a line break is a ``422`` page).
"""

from __future__ import annotations

import secrets
import struct
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

import orjson

from tether.engine.calls import DECISIONS, Decision, awaiting_decision
from tether.engine.limits import held_repeat
from tether.engine.timers import local_time
from tether.errors import MissingExtra, TaskNotFound, TetherError, VersionNotFound
from tether.harness import FINAL, Harness
from tether.model import LARGEST_COUNT, TASK_ID, CallStatus, Event, Status
from tether.protocol import RESERVED_EVENTS
from tether.store import TaskQuery
from tether.watching import POSITION_CHARS, Position
from tether.web.live import StreamSlots, stream_response
from tether.web.security import (
    FailureLimiter,
    HTTPRefusal,
    Role,
    TokenTable,
    client_of,
    wrong_credential,
)
from tether.web.timeline import LiveShape, pretty, side_by_side, timeline, version_labels

try:
    from fastapi import FastAPI, Form, Query, Request
    from fastapi.responses import HTMLResponse, RedirectResponse, Response
    from jinja2 import Environment, PackageLoader, select_autoescape
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("the console needs FastAPI and Jinja2", "server") from exc

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
                    limiter: FailureLimiter, session_ttl: float = 8 * 3600,
                    slots: StreamSlots | None = None,
                    names: Mapping[str, str] | None = None) -> None:
    """Add the console's pages to the API app."""
    table = TokenTable(tokens, names)
    sessions = Sessions(session_ttl)
    streams = slots or StreamSlots()

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

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon_ico() -> Response:
        return Response(FAVICON_ICO, media_type="image/x-icon", headers=ICON_HEADERS)

    @app.get("/favicon.svg", include_in_schema=False)
    async def favicon_svg() -> Response:
        return Response(FAVICON_SVG, media_type="image/svg+xml", headers=ICON_HEADERS)

    @app.get("/console", response_class=HTMLResponse, include_in_schema=False)
    async def tasks(request: Request, status: str = "", agent: str = "", q: str = "",
                    page_no: int = Query(1, alias="page", ge=1, le=LARGEST_COUNT)) -> Response:
        session = session_of(request)
        if session is None:
            return sign_in_page(request)
        if not (agent.isprintable() and q.isprintable()):
            return page("error.html", request, session, 422, title="Not a search",
                        message=NOT_PRINTABLE)
        counts = await harness.reads.counts()
        chosen = _status(status)
        shown, more = await _listing(harness, chosen, agent, q, page_no)
        query = {k: v for k, v in (("status", chosen.value if chosen else ""), ("agent", agent),
                                   ("q", q)) if v}
        return page("tasks.html", request, session, tasks=shown, ago=_ago, page_no=page_no,
                    more=more, status=chosen.value if chosen else "", agent=agent, q=q,
                    agents=sorted(harness.agents), statuses=[s.value for s in ORDER],
                    refresh="/console/rows?" + urlencode({**query, "page": page_no}),
                    prev_link="/console?" + urlencode({**query, "page": page_no - 1})
                    if page_no > 1 else "",
                    next_link="/console?" + urlencode({**query, "page": page_no + 1})
                    if more else "",
                    total=sum(counts.values()), limits=await harness.reads.limits(),
                    counts=[(s.value, counts[s.value]) for s in ORDER if s.value in counts])

    @app.get("/console/rows", response_class=HTMLResponse, include_in_schema=False)
    async def rows(request: Request, status: str = "", agent: str = "", q: str = "",
                   page_no: int = Query(1, alias="page", ge=1, le=LARGEST_COUNT)) -> Response:
        session = session_of(request)
        if session is None:
            return Response(status_code=401)
        if not (agent.isprintable() and q.isprintable()):
            return Response(NOT_PRINTABLE, 422)
        shown, _ = await _listing(harness, _status(status), agent, q, page_no)
        return page("rows.html", request, None, tasks=shown, ago=_ago)

    @app.post("/console/login", include_in_schema=False)
    async def login(request: Request, token: str = Form(""), csrf: str = Form("")) -> Response:
        if not same_origin(request) or not tokens_match(request.cookies.get(LOGIN_COOKIE), csrf):
            # no token was looked at, so nothing was guessed: not a failed credential
            return _refused("the sign-in form did not come from this console: reload the"
                            " page and sign in again")
        role = table.role_of(token) if token else None
        if role is None:
            if not token:  # nothing presented: not a failed credential either
                return sign_in_page(request, "Paste an API token to sign in", code=401)
            # a valid token was let through above, whatever this address's failures
            limited = wrong_credential(limiter, client_of(request.scope))
            if limited is not None:
                answer = sign_in_page(request, str(limited), code=429)
                answer.headers.update(limited.headers)
                return answer
            return sign_in_page(request, "That token is not valid", code=401)
        previous = session_of(request)
        if previous is not None:  # a new sign-in never keeps an old session id alive
            sessions.end(previous.id)
        session = sessions.start(role, table.who("console", token))
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

    async def own_form(request: Request) -> tuple[Session, Any] | None:
        """The session and form of a POST that came from this console's own page (its
        origin and its session's CSRF token), or None."""
        session = session_of(request)
        form = await request.form() if session is not None and same_origin(request) else None
        if session is None or form is None or not tokens_match(session.csrf, form.get("csrf")):
            return None
        return session, form

    def not_found(request: Request, session: Session | None, what: str) -> Response:
        return page("error.html", request, session, 404, title="Not found", message=what)

    @app.get("/console/tasks/{task_id}", response_class=HTMLResponse, include_in_schema=False)
    async def task(request: Request, task_id: str) -> Response:
        session = session_of(request)
        if session is None:
            return RedirectResponse("/console", 303)
        try:
            info = await harness.get(task_id)
        except TaskNotFound:
            return not_found(request, session, f"There is no task {task_id!r}.")
        reads = harness.reads
        snap = info.snapshot
        call = snap.call
        status = info.record.status
        settled_by_person = info.record.runner() is None and status not in FINAL \
            and await awaiting_decision(harness.store, snap, harness.tools) is not None
        in_doubt = settled_by_person or (  # a call that settles itself may be decided too
            call is not None and call.status == CallStatus.STARTED
            and status is Status.NEEDS_HUMAN)
        history = await harness.history(task_id)
        recoveries = await reads.recovery_log(task_id)
        operator = session.role == "operator"
        wait = snap.frame.wait if snap.stack else None
        return page("task.html", request, session, record=info.record, snap=snap,
                    version=info.version, etag=info.etag, history=history,
                    timeline=timeline(history, recoveries),
                    position=Position(len(history), len(recoveries)),
                    versions=await version_labels(harness, task_id),
                    events=await reads.events(task_id),
                    calls=await reads.calls(task_id),
                    recoveries=recoveries, in_doubt=in_doubt, operator=operator,
                    held=held_repeat(snap, history) if operator else None,
                    can_resume=operator and not settled_by_person and status in RESUMABLE,
                    can_rollback=operator and status is not Status.CANCELLED,
                    can_fork=operator,
                    can_delete=operator and _deletable(info.record),
                    can_cancel=operator and not status.is_terminal,
                    can_send=operator and not status.is_terminal,
                    awaited=str(wait["event_type"]) if operator and wait
                    and status is Status.WAITING else None,
                    awaited_wait=wait.get("id") if wait else None,
                    waits=wait if wait and status is Status.WAITING else None,
                    forked_from=next((r["forked_from"] for r in recoveries
                                      if isinstance(r.get("forked_from"), dict)), None),
                    event_types=_event_types(harness))

    @app.get("/console/tasks/{task_id}/stream", include_in_schema=False)
    async def stream(request: Request, task_id: str,
                     after: str = Query("", max_length=POSITION_CHARS)) -> Response:
        """The task page's live feed: timeline entries shaped as the page shows them."""
        session = session_of(request)
        if session is None:
            return Response("sign in again", 401)
        try:
            position = Position.parse(request.headers.get("last-event-id") or after)
            history = await harness.history(task_id)
            shown = [row.get("at") for row in history[:position.rows]]
            previous = next((float(a) for a in reversed(shown) if isinstance(a, int | float)),
                            None)
            return await stream_response(harness, task_id, str(position), streams,
                                         until_finished=False,
                                         shape=LiveShape(position.rows, previous))
        except TaskNotFound:
            return Response(f"no task {task_id!r}", 404)
        except HTTPRefusal as exc:
            return Response(str(exc), exc.status, headers=exc.headers)
        except TetherError as exc:
            return Response(str(exc), 400)

    @app.get("/console/tasks/{task_id}/diff", response_class=HTMLResponse, include_in_schema=False)
    async def diff(request: Request, task_id: str, a: int = Query(ge=1, le=LARGEST_COUNT),
                   b: int = Query(ge=1, le=LARGEST_COUNT)) -> Response:
        session = session_of(request)
        if session is None:
            return RedirectResponse("/console", 303)
        if not TASK_ID.fullmatch(task_id):  # no such task can exist: the store never sees it
            return not_found(request, session, f"There is no task {task_id!r}.")
        try:
            old, new = (await pretty(harness, task_id, a)), (await pretty(harness, task_id, b))
        except (TaskNotFound, VersionNotFound):
            return not_found(request, session, f"Task {task_id!r} has no version {a} or {b}.")
        rows = side_by_side(old, new)
        changed = sum(row["kind"] not in ("same", "fold") for row in rows)
        return page("diff.html", request, session, task_id=task_id, a=a, b=b, rows=rows,
                    changed=changed)

    @app.get("/console/tasks/{task_id}/bundle", include_in_schema=False)
    async def bundle(request: Request, task_id: str) -> Response:
        session = session_of(request)
        if session is None:
            return RedirectResponse("/console", 303)
        try:
            exported = await harness.export(task_id)
        except TaskNotFound:
            return not_found(request, session, f"There is no task {task_id!r}.")
        body = orjson.dumps(exported, option=orjson.OPT_INDENT_2)
        return Response(body, media_type="application/json", headers={
            "content-disposition": f'attachment; filename="{quote(task_id, safe="")}.json"'})

    @app.post("/console/tasks/{task_id}/{lever}", include_in_schema=False)
    async def act(request: Request, task_id: str, lever: str) -> Response:
        posted = await own_form(request)
        if posted is None:
            return _refused(NOT_OURS)
        session, form = posted
        if not TASK_ID.fullmatch(task_id):  # no such task can exist: the store never sees it
            return not_found(request, session, f"There is no task {task_id!r}.")
        if session.role != "operator":
            return _back(session, task_id, "Only an operator token may change tasks", True)
        try:
            await harness.reads.task(task_id)
        except TaskNotFound:
            return not_found(request, session, f"There is no task {task_id!r}.")
        try:
            if lever == "fork":
                fork_id, done = await _fork(harness, task_id, form, session.by)
                return _back(session, fork_id, done, False)
            if lever == "delete":
                if form.get("sure") != "1":
                    raise ValueError("tick the box to say you mean to delete it for good")
                await harness.delete(task_id, by=session.by)
                _flash(session, f"task {task_id} deleted", False)
                return RedirectResponse("/console", 303)
            done = await _pull(harness, task_id, lever, form, session.by)
        except (TetherError, ValueError) as exc:
            return _back(session, task_id, str(exc), True)
        return _back(session, task_id, done, False)

    @app.get("/console/schedules", response_class=HTMLResponse, include_in_schema=False)
    async def schedule_list(request: Request) -> Response:
        session = session_of(request)
        if session is None:
            return RedirectResponse("/console", 303)
        return page("schedules.html", request, session,
                    schedules=await harness.reads.schedules(),
                    operator=session.role == "operator")

    @app.post("/console/schedules/{name}/{action}", include_in_schema=False)
    async def steer_schedule(request: Request, name: str, action: str) -> Response:
        posted = await own_form(request)
        if posted is None:
            return _refused(NOT_OURS)
        session = posted[0]
        try:
            if session.role != "operator":
                raise ValueError("Only an operator token may change schedules")
            if not name.isprintable():
                raise ValueError(f"schedule name {name[:40]!r} {PRINTABLE_ONLY}")
            if action == "run":
                done = f"schedule {name}: run started as {await harness.run_schedule_now(name)}"
            elif action in ("pause", "resume"):
                await harness.pause_schedule(name, paused=action == "pause")
                done = f"schedule {name}: {action}d"
            else:
                raise ValueError(f"no such action {action[:40]!r}")
            _flash(session, done, False)
        except (TetherError, ValueError) as exc:
            _flash(session, str(exc), True)
        return RedirectResponse("/console/schedules", 303)

    @app.get("/console/{rest:path}", response_class=HTMLResponse, include_in_schema=False)
    async def nowhere(request: Request, rest: str) -> Response:
        # a 404 page for anyone: signed out, it names nothing but the console's sign-in
        return not_found(request, session_of(request), "There is no such page in the console.")


async def _pull(harness: Harness, task_id: str, lever: str, form: Any, by: str) -> str:
    """Pull one lever from a console form; what to tell the person."""
    if lever == "resume":
        earlier = form.get("earlier_result") == "1"
        await harness.resume(task_id, message=str(form.get("message") or "") or None, by=by,
                             earlier_result=earlier, etag=str(form.get("etag") or "") or None)
        if earlier:
            return "sent: answer the held call with the earlier result"
    elif lever == "rollback":
        version = _version(form)
        redo = form.get("redo_side_effects") == "1"
        await harness.rollback(task_id, version, redo, by=by)
        return f"rollback to version {version} sent" + (" (side effects redone)" if redo else "")
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
        attempt = str(form.get("attempt") or "")
        await harness.decide(task_id, outcome, result, by=by, key=str(form.get("key") or "")
                             or None, attempt=int(attempt) if attempt.isdigit() else None,
                             etag=str(form.get("etag") or "") or None)
        return f"decision sent: {outcome.replace('_', ' ')}"
    elif lever == "event":
        return await _send_event(harness, task_id, form)
    elif lever == "approve":
        info = await harness.get(task_id)
        wait = info.snapshot.frame.wait if info.snapshot.stack else None
        if wait is None or info.record.status is not Status.WAITING:
            raise ValueError(f"task {task_id} is not waiting for an event: nothing to approve")
        kind = str(wait["event_type"])
        shown = str(form.get("wait") or "") or None
        if shown != wait.get("id"):
            raise ValueError(f"task {task_id} no longer waits for what the page showed (it has"
                             " moved on since): reload the page and decide again")
        answer: dict[str, Any] = {"approved": True, "by": by}
        if shown is not None:  # the engine applies it only to the wait the person saw
            answer["wait"] = shown
        await harness.emit(Event(kind, task_id, answer))
        return f"{kind} sent"
    else:
        raise ValueError(f"no such action {lever!r}")
    return f"{lever} sent"


async def _fork(harness: Harness, task_id: str, form: Any, by: str) -> tuple[str, str]:
    """A fork from the console's form: a kept version, an optional id, redo or not."""
    version = _version(form)
    new_id = str(form.get("task_id") or "").strip() or None
    redo = form.get("redo_side_effects") == "1"
    fork_id = await harness.fork(task_id, version, new_task_id=new_id, redo_side_effects=redo,
                                 by=by)
    return fork_id, f"forked from {task_id} version {version}" + (
        " (side effects redone)" if redo else "")


def _deletable(record: Any) -> bool:
    """No worker holds it (or it finished and its worker died before letting it go)."""
    return record.lease_owner is None or (record.status.is_terminal
                                          and (record.lease_until or 0) < time.time())


def _version(form: Any) -> int:
    text = str(form.get("version") or "")
    if not text.isdigit() or not 1 <= int(text) <= LARGEST_COUNT:
        raise ValueError(f"choose a kept version, not {text[:20]!r}")
    return int(text)


async def _send_event(harness: Harness, task_id: str, form: Any) -> str:
    """An event from the console's form: a type of the protocol, a JSON payload, a priority."""
    kind = str(form.get("type") or "")
    if kind not in _event_types(harness):
        raise ValueError(f"choose an event type of the protocol, not {kind[:60]!r}")
    text = str(form.get("payload") or "").strip()
    try:
        payload = orjson.loads(text) if text else None
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"the payload is not valid JSON ({exc.msg} at line {exc.lineno},"
                         f" column {exc.colno}); leave it empty to send none") from None
    raw = str(form.get("priority") or "")
    if raw and raw not in {"0", "1", "2", "3", "4"}:
        raise ValueError("the priority must be 0 to 4 (or the protocol's default)")
    receipt = await harness.emit(Event(kind, task_id, payload, int(raw) if raw else None))
    return f"event {kind} sent (#{receipt.event_id}, {receipt.outcome})"


RESUMABLE = frozenset({Status.PAUSED, Status.NEEDS_HUMAN, Status.FAILED, Status.WAITING,
                       Status.RUNNING})
"""Where a resume acts (on a running task it adds the person's message); elsewhere it is
ignored, so the console does not offer it."""


def _event_types(harness: Harness) -> list[str]:
    """The event types a person may send: the protocol's, less the levers and timers."""
    return sorted(t for t in harness.protocol.table() if t not in RESERVED_EVENTS)


def _ago(at: float, now: float | None = None) -> str:
    """A past time relative to now: just now, 5 s ago, 3 min ago, 2 h ago, 4 d ago."""
    seconds = max((now if now is not None else time.time()) - at, 0.0)
    if seconds < 5:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds)} s ago"


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


PAGE_SIZE = 50
"""Tasks per page of the console's list."""
SEARCH_CHARS = 200
"""The longest search text the list takes."""


def _status(text: str) -> Status | None:
    try:
        return Status(text) if text else None
    except ValueError:
        return None


async def _listing(harness: Harness, status: Status | None, agent: str = "", q: str = "",
                   page_no: int = 1) -> tuple[list[Any], bool]:
    """One page of the list (most urgent status first, newest first), and whether there is
    another: filtered by status, agent and a piece of the task id or reason, in the store."""
    query = TaskQuery(status, agent or None, q.strip()[:SEARCH_CHARS],
                      (page_no - 1) * PAGE_SIZE, PAGE_SIZE + 1)
    found = await harness.reads.find(query)
    return found[:PAGE_SIZE], len(found) > PAGE_SIZE


NOT_OURS = "the form did not come from this console's page: reload it and try again"
PRINTABLE_ONLY = "must be printable text (no control characters such as NUL or a line break)"
NOT_PRINTABLE = f"A search text or agent name {PRINTABLE_ONLY}."


# --------------------------------------------------------------------------- the icon

ICON_HEADERS = {"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff",
                "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'"}
"""A day in any cache; an icon opened on its own runs nothing."""
FAVICON_SVG = (b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
               b'<rect width="16" height="16" rx="3" fill="#2f5bea"/>'
               b'<path d="M6 3h2v3h3v2H8v3.5c0 .6.3 1 1 1h2V14H9c-2 0-3-1-3-2.5V8H4V6h2z"'
               b' fill="#fff"/></svg>')
_GLYPH = ("################",
          "################",
          "################",
          "######..########",
          "######..########",
          "######..########",
          "####.......#####",
          "####.......#####",
          "######..########",
          "######..########",
          "######..########",
          "######..########",
          "######.....#####",
          "#######....#####",
          "################",
          "################")
"""The icon as 16 rows of 16 pixels: ``#`` the console's blue, ``.`` white (a "t")."""


def _ico(rows: tuple[str, ...]) -> bytes:
    """A 16x16 32-bit ICO of *rows* (corners transparent): a BMP bottom-up, then its mask."""
    blue, white, clear = b"\xea\x5b\x2f\xff", b"\xff\xff\xff\xff", b"\x00\x00\x00\x00"
    corners = {(0, 0), (0, 15), (15, 0), (15, 15)}
    pixels = b"".join(
        clear if (y, x) in corners else blue if rows[y][x] == "#" else white
        for y in reversed(range(16)) for x in range(16))
    mask = bytes(16 * 4)  # every pixel shown; the alpha channel makes the corners clear
    bitmap = struct.pack("<IiiHHIIiiII", 40, 16, 32, 1, 32, 0, len(pixels) + len(mask),
                         0, 0, 0, 0) + pixels + mask
    return struct.pack("<HHH", 0, 1, 1) + struct.pack("<BBBBHHII", 16, 16, 0, 0, 1, 32,
                                                      len(bitmap), 22) + bitmap


FAVICON_ICO = _ico(_GLYPH)


def _flash(session: Session, message: str, error: bool) -> None:
    """A line for the next page the person sees (the last five are kept)."""
    session.flash[:] = [*session.flash[-4:], (message[:500], error)]


def _back(session: Session, task_id: str, message: str, error: bool) -> Response:
    _flash(session, message, error)
    return RedirectResponse(f"/console/tasks/{quote(task_id, safe='')}", 303)

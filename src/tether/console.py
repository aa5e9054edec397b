"""The web console, served by ``tether serve`` (R2, R26): see every task, step in where needed.

Server-rendered HTML (Jinja2 templates in ``tether/templates``) and a few lines of plain
JavaScript for live updates; no front-end build. A person signs in with an API token,
kept in an HttpOnly, SameSite=Strict cookie; a ``read`` token can look, an ``operator``
token can also resume, roll back and cancel.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import orjson

from tether.errors import TetherError
from tether.harness import Harness
from tether.model import Status
from tether.timers import local_time

try:
    from fastapi import FastAPI, Form, Request
    from fastapi.responses import HTMLResponse, RedirectResponse, Response
    from jinja2 import Environment, PackageLoader, select_autoescape
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    from tether.errors import ConfigurationError

    raise ConfigurationError("the console needs FastAPI and Jinja2: pip install 'tether[server]'"
                             ) from exc

COOKIE = "tether_token"
ORDER = [Status.NEEDS_HUMAN, Status.RUNNING, Status.PAUSED, Status.WAITING, Status.PENDING,
         Status.FAILED, Status.COMPLETED, Status.CANCELLED]
_templates = Environment(loader=PackageLoader("tether", "templates"),
                         autoescape=select_autoescape(["html"]))


def install_console(app: FastAPI, harness: Harness, tokens: Mapping[str, str]) -> None:
    """Add the console's pages to the API app."""

    def role(request: Request) -> str | None:
        return tokens.get(request.cookies.get(COOKIE, ""))

    def page(name: str, request: Request, **context: Any) -> HTMLResponse:
        html = _templates.get_template(name).render(
            worker=harness.worker_id, when=local_time, flash=request.query_params.get("flash"),
            flash_error=request.query_params.get("error") == "1", **context)
        return HTMLResponse(html)

    @app.get("/console", response_class=HTMLResponse, include_in_schema=False)
    async def tasks(request: Request, status: Status | None = None) -> Response:
        if role(request) is None:
            return page("login.html", request)
        counts = await harness.store.count_by_status()
        return page("tasks.html", request, tasks=await _listing(harness, status),
                    status=status.value if status else "", total=sum(counts.values()),
                    counts=[(s.value, counts[s.value]) for s in ORDER if s.value in counts])

    @app.get("/console/rows", response_class=HTMLResponse, include_in_schema=False)
    async def rows(request: Request, status: Status | None = None) -> Response:
        if role(request) is None:
            return Response(status_code=401)
        return page("rows.html", request, tasks=await _listing(harness, status))

    @app.post("/console/login", include_in_schema=False)
    async def login(token: str = Form("")) -> Response:
        if token not in tokens:
            return RedirectResponse("/console?flash=That+token+is+not+valid&error=1", 303)
        answer = RedirectResponse("/console", 303)
        answer.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return answer

    @app.get("/console/tasks/{task_id}", response_class=HTMLResponse, include_in_schema=False)
    async def task(request: Request, task_id: str) -> Response:
        if role(request) is None:
            return RedirectResponse("/console", 303)
        info = await harness.get(task_id)
        store = harness.store
        return page("task.html", request, record=info.record, snap=info.snapshot,
                    version=info.version, history=await harness.history(task_id),
                    versions=[{"version": v} for v, _, _ in await store.list_versions(task_id)],
                    events=await store.list_events(task_id),
                    calls=await store.list_idempotency(task_id),
                    recoveries=await store.list_recovery_log(task_id),
                    describe=_describe, detail=_detail)

    @app.get("/console/tasks/{task_id}/diff", response_class=HTMLResponse, include_in_schema=False)
    async def diff(request: Request, task_id: str, a: int, b: int) -> Response:
        if role(request) is None:
            return RedirectResponse("/console", 303)
        old, new = (await _pretty(harness, task_id, a)), (await _pretty(harness, task_id, b))
        lines = list(difflib.unified_diff(old, new, f"version {a}", f"version {b}", lineterm=""))
        return page("diff.html", request, task_id=task_id, a=a, b=b,
                    lines=lines or ["(no difference)"])

    @app.get("/console/tasks/{task_id}/bundle", include_in_schema=False)
    async def bundle(request: Request, task_id: str) -> Response:
        if role(request) is None:
            return RedirectResponse("/console", 303)
        body = orjson.dumps(await harness.export(task_id), option=orjson.OPT_INDENT_2)
        return Response(body, media_type="application/json", headers={
            "content-disposition": f'attachment; filename="{task_id}.json"'})

    @app.post("/console/tasks/{task_id}/{lever}", include_in_schema=False)
    async def act(request: Request, task_id: str, lever: str) -> Response:
        if role(request) != "operator":
            return _back(task_id, "Only an operator token may change tasks", error=True)
        form = await request.form()
        try:
            if lever == "resume":
                await harness.resume(task_id, message=str(form.get("message") or "") or None)
            elif lever == "rollback":
                await harness.rollback(task_id, int(str(form.get("version"))))
            elif lever == "cancel":
                await harness.cancel(task_id)
            else:
                return _back(task_id, f"No such action {lever!r}", error=True)
        except (TetherError, ValueError) as exc:
            return _back(task_id, str(exc), error=True)
        return _back(task_id, f"{lever} sent")


async def _listing(harness: Harness, status: Status | None) -> list[Any]:
    records = await harness.store.list_tasks(status, limit=500)
    return sorted(records, key=lambda r: (ORDER.index(r.status), -r.updated_at))


async def _pretty(harness: Harness, task_id: str, version: int) -> list[str]:
    _, head = await harness.store.load_head(task_id, version)
    return orjson.dumps(orjson.loads(head), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
                        ).decode().splitlines()


def _back(task_id: str, message: str, error: bool = False) -> Response:
    from urllib.parse import quote

    suffix = "&error=1" if error else ""
    return RedirectResponse(f"/console/tasks/{task_id}?flash={quote(message)}{suffix}", 303)


def _describe(row: Mapping[str, Any]) -> str:
    if "tool_call" in row:
        return f"tool call {row['tool_call']['name']}"
    if row.get("role") == "tool":
        return f"{row.get('name')} {'failed' if 'error' in row else 'returned'}"
    if row.get("role") in ("user", "event"):
        return f"event {row.get('type')}"
    if row.get("role") == "assistant":
        return "reply (cut off)" if row.get("cut_off") else "reply"
    return str(row.get("event") or row.get("role"))


def _detail(row: Mapping[str, Any]) -> str:
    if "tool_call" in row:
        call = row["tool_call"]
        return f"key {call['key']}  args {orjson.dumps(call['args']).decode()[:300]}"
    value = row.get("error") or row.get("content")
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return text[:500]

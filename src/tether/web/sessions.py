"""The console's sign-in sessions and its defence against cross-site forms (issue 13).

Signing in with an API token starts a session: a random id, kept in this server's memory
with the token's role, who it is (``console:`` and a short hash of the token, never the
token) and an expiry (8 hours by default). The browser holds only the id, in an HttpOnly,
SameSite=Strict cookie limited to ``/console``, ``Secure`` when the request came over HTTPS
(as uvicorn reports it: behind a TLS proxy, let uvicorn trust that proxy's
``X-Forwarded-Proto``), with a ``Max-Age``. Sessions end at sign-out, at expiry, and when
the server restarts (a person signs in again).

Every form the console posts is checked twice:

- its ``Origin`` (or, without one, its ``Referer``) must be this server's own origin, as
  the request's ``Host`` and scheme give it; a form with neither is refused;
- its hidden ``csrf`` field must equal the session's CSRF token (compared in constant
  time). The sign-in form, before there is a session, is paired with a short-lived cookie
  holding the same random value instead.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import Request

from tether.web.security import origin_of

SESSION_COOKIE = "tether_session"
LOGIN_COOKIE = "tether_login"
COOKIE_PATH = "/console"
LOGIN_TTL = 3600


@dataclass
class Session:
    id: str
    role: str
    by: str
    csrf: str
    expires: float
    flash: list[tuple[str, bool]] = field(default_factory=list)
    """Messages for the next page (text, is it an error), shown once."""


class Sessions:
    """Signed-in sessions in this process's memory, at most ``max_sessions`` (oldest go first)."""

    def __init__(self, ttl: float = 8 * 3600, max_sessions: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl, self.max_sessions, self.clock = ttl, max_sessions, clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def start(self, role: str, by: str) -> Session:
        now = self.clock()
        for sid in [s.id for s in self._sessions.values() if s.expires <= now]:
            del self._sessions[sid]
        session = Session(secrets.token_urlsafe(32), role, by, secrets.token_urlsafe(32),
                          now + self.ttl)
        self._sessions[session.id] = session
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return session

    def get(self, sid: str | None) -> Session | None:
        session = self._sessions.get(sid) if sid else None
        if session is not None and session.expires <= self.clock():
            del self._sessions[session.id]
            return None
        return session

    def end(self, sid: str) -> None:
        self._sessions.pop(sid, None)


def same_origin(request: Request) -> bool:
    """The form was posted from a page of this server (Origin, else Referer, vs Host)."""
    host = request.headers.get("host")
    if not host:
        return False
    sent = request.headers.get("origin") or request.headers.get("referer")
    theirs = origin_of(sent) if sent and sent != "null" else None
    ours = origin_of(f"{request.url.scheme}://{host}")
    return theirs is not None and ours is not None and theirs.lower() == ours.lower()


def tokens_match(expected: str | None, given: object) -> bool:
    """Constant-time comparison of a CSRF token with what the form sent."""
    if not expected or not isinstance(given, str) or not given:
        return False
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogateescape"))


def secure(request: Request) -> bool:
    return request.url.scheme == "https"


def new_login_token() -> str:
    return secrets.token_urlsafe(24)

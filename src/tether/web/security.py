"""The HTTP edge's guard (issue 13): what every request meets before a route sees it.

:class:`EdgeGuard` is a pure ASGI middleware in front of the API and the console. In order:

1. **Framing.** A request carrying both ``Content-Length`` and ``Transfer-Encoding`` (the
   shape of request smuggling), several ``Content-Length`` headers, or one that is not a
   number, gets ``400``.
2. **Bearer token, before any body is read.** Every path but ``/healthz``, the favicon
   (``/favicon.ico``, ``/favicon.svg``), the console (its own session cookies,
   :mod:`tether.web.sessions`) and the signed ``/hooks/`` needs ``Authorization: Bearer
   <token>`` (scheme in any case, one space, the token): the token is compared in constant
   time with every configured one. ``GET``/``HEAD`` need a ``read`` or ``operator`` token,
   anything else an ``operator`` token (``403``). New routes are closed unless added to
   the open list here.
3. **Failures, client by client.** Only a credential that was presented and is wrong
   counts: a bearer token that matches none, a sign-in with a wrong token, a webhook whose
   signature does not match. A request that presents none (a browser's favicon or
   ``robots.txt``, a link followed without a token, a console page without a session) is
   answered ``401`` and counted nowhere. A client (by IP address) with ``limit`` such
   failures within ``window`` seconds gets ``429`` with ``Retry-After`` for every further
   *wrong* credential until the oldest failure ages out. A valid credential is checked
   first and always let through, so failures recorded for an address (everyone behind
   one proxy shares it) never lock out a person holding a good token. The price: a
   guesser that ignores the ``429`` would still be let in by a right guess, so what keeps
   guessing hopeless is the tokens' length (16 bytes at least; ``openssl rand -hex 16``
   makes 32); the limit turns a run of wrong guesses into 429s, and a client that heeds
   ``Retry-After`` into a slow one. Successes are never counted. The record is in memory and bounded
   (:class:`FailureLimiter`): behind a reverse proxy, run uvicorn with proxy headers from
   that proxy only, or every client shares its address.
4. **Body size, counted.** A declared ``Content-Length`` over the limit is ``413`` at once;
   whatever the headers say, the bytes actually received are counted, and the request is
   answered ``413`` as soon as they pass the limit (chunked bodies included). Before that
   answer, up to one more limit's worth is read and dropped, so a client still sending
   reads the ``413`` rather than a reset connection; the route never sees the body.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

Role = Literal["read", "operator"]
TOKEN_MIN_BYTES = 16
READ_METHODS = frozenset({"GET", "HEAD"})
LARGEST_INT = (1 << 64) - 1
"""JSON integers outside [-2**63, 2**64) are refused: the store cannot hold them."""


class HTTPRefusal(Exception):
    """A request refused with *status* and a message for the caller."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


# --------------------------------------------------------------------------- tokens


def token_problem(token: str) -> str | None:
    """Why *token* may not be an API token, without repeating it; None when it may."""
    if len(token.encode()) < TOKEN_MIN_BYTES:
        return (f"an API token must be at least {TOKEN_MIN_BYTES} bytes long (one given is"
                f" {len(token.encode())}); make one with: openssl rand -hex 16")
    if not token.isprintable() or any(c.isspace() for c in token):
        return "an API token may not contain spaces or control characters"
    return None


def bearer_token(values: list[str]) -> str | None:
    """The token of exactly one ``Authorization: Bearer <token>`` header, else None."""
    if len(values) != 1:
        return None
    scheme, space, token = values[0].partition(" ")
    if not space or scheme.lower() != "bearer" or not token or token != token.strip() \
            or any(c.isspace() for c in token):
        return None
    return token


class TokenTable:
    """The configured tokens, matched in constant time against every one of them, each with
    its role and, if the operator gave one, the name of the person or service holding it."""

    def __init__(self, tokens: Mapping[str, Role], names: Mapping[str, str] | None = None
                 ) -> None:
        named = names or {}
        self._digests = [(hashlib.sha256(t.encode()).digest(), role, named.get(t))
                         for t, role in tokens.items()]

    def _match(self, token: str | None) -> tuple[Role, str | None] | None:
        if token is None:
            return None
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        found: tuple[Role, str | None] | None = None
        for candidate, role, name in self._digests:  # no early exit: every token is compared
            if hmac.compare_digest(candidate, digest):
                found = (role, name)
        return found

    def role_of(self, token: str | None) -> Role | None:
        found = self._match(token)
        return None if found is None else found[0]

    def who(self, prefix: str, token: str) -> str:
        """Who pulled a lever, as recorded: the channel and the token's name (``--tokens
        alice=TOKEN:operator``), else a short hash of the token; never the token itself."""
        found = self._match(token)
        if found is not None and found[1]:
            return f"{prefix}:{found[1]}"
        return f"{prefix}:{hashlib.sha256(token.encode()).hexdigest()[:8]}"


# --------------------------------------------------------------------------- failures


class FailureLimiter:
    """Failed credentials per client in a sliding window, in bounded memory.

    A client with ``limit`` failures younger than ``window`` seconds is refused until the
    oldest of them ages out. At most ``max_clients`` clients are remembered: the one whose
    last failure is oldest is forgotten first.
    """

    def __init__(self, limit: int = 10, window: float = 60.0, max_clients: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window, self.max_clients, self.clock = limit, window, max_clients, clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def failed(self, client: str) -> None:
        times = self._failures.pop(client, None) or deque(maxlen=self.limit)
        times.append(self.clock())
        self._failures[client] = times
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)

    def retry_after(self, client: str) -> int | None:
        """Seconds until *client* may try again, or None when it is not limited."""
        times = self._failures.get(client)
        if times is None:
            return None
        now = self.clock()
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[client]
            return None
        if len(times) < self.limit:
            return None
        return max(1, math.ceil(times[0] + self.window - now))


def client_of(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


# --------------------------------------------------------------------------- the guard


OPEN_PATHS = frozenset({"/healthz", "/favicon.ico", "/favicon.svg"})
"""Paths anyone may fetch: the health check and the console's icon (browsers ask for it on
every page, without any credential)."""


def takes_token(path: str) -> bool:
    """Whether *path* needs a bearer token (everything but the open and self-guarded paths)."""
    return not (path in OPEN_PATHS or path == "/console" or path.startswith("/console/")
                or path.startswith("/hooks/"))


def presents_credential(values: list[str]) -> bool:
    """Whether ``Authorization`` headers with these *values* present a credential at all
    (well-formed or not): only such a request can be a failed credential."""
    return any(value.strip() for value in values)


def too_many_failures(limiter: FailureLimiter, client: str) -> HTTPRefusal | None:
    """The ``429`` for a wrong credential from *client* while it is limited, else None."""
    wait = limiter.retry_after(client)
    if wait is None:
        return None
    return HTTPRefusal(429, f"too many failed credentials from this client; try again in"
                            f" {wait}s", {"Retry-After": str(wait)})


def wrong_credential(limiter: FailureLimiter, client: str) -> HTTPRefusal | None:
    """A presented credential was wrong: the ``429`` if *client* is limited already (not
    counted again), else None, with the failure counted."""
    refusal = too_many_failures(limiter, client)
    if refusal is None:
        limiter.failed(client)
    return refusal


class EdgeGuard:
    """Framing, bearer tokens, failure limits and counted body bytes (see the module)."""

    def __init__(self, app: ASGIApp, tokens: TokenTable, limiter: FailureLimiter,
                 max_body: int) -> None:
        self.app, self.tokens, self.limiter, self.max_body = app, tokens, limiter, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._check(scope)
        if refusal is not None:
            await send_json(send, refusal.status, str(refusal), refusal.headers)
            return
        await self._bounded(scope, receive, send)

    def _check(self, scope: Scope) -> HTTPRefusal | None:
        headers: dict[bytes, list[str]] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.lower(), []).append(value.decode("latin-1"))
        lengths = headers.get(b"content-length", [])
        if lengths and b"transfer-encoding" in headers:
            return HTTPRefusal(400, "a request may not carry both Content-Length and"
                                    " Transfer-Encoding (the shape of request smuggling)")
        if len(lengths) > 1 or (lengths and not lengths[0].isdigit()):
            return HTTPRefusal(400, "Content-Length must be one number")
        path, method = scope["path"], scope["method"]
        if takes_token(path):
            values = headers.get(b"authorization", [])
            token = bearer_token(values)
            role = self.tokens.role_of(token)
            if role is None or token is None:
                # a valid token was checked first: only a wrong one meets the limit
                limited = wrong_credential(self.limiter, client_of(scope)) \
                    if presents_credential(values) else None
                return limited or HTTPRefusal(401, "a valid bearer token is needed"
                                                   " (Authorization: Bearer <token>)",
                                              {"WWW-Authenticate": "Bearer"})
            if method not in READ_METHODS and role != "operator":
                return HTTPRefusal(403, "this token may read but not change tasks")
            scope.setdefault("state", {})["tether_by"] = self.tokens.who("api", token)
        if lengths and int(lengths[0]) > self.max_body:
            return HTTPRefusal(413, f"request body over {self.max_body} bytes")
        return None

    async def _bounded(self, scope: Scope, receive: Receive, send: Send) -> None:
        received, started, refused = 0, False, False

        async def counted() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request" and not refused:
                received += len(message.get("body", b""))
                if received > self.max_body:
                    refused = True
                    if not started:
                        await _drain(receive, message, self.max_body)
                        await send_json(send, 413, f"request body over {self.max_body} bytes",
                                        {"Connection": "close"})
            return {"type": "http.disconnect"} if refused else message

        async def watched(message: Message) -> None:
            nonlocal started
            if refused and not started:
                return  # the 413 went out: whatever the app says after it is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except Exception:
            if not refused:
                raise


async def _drain(receive: Receive, last: Message, limit: int) -> None:
    """Read and drop up to *limit* more body bytes before a 413 (kept nowhere), so a client
    still sending a body a little too large reads the answer instead of a reset connection.
    Past that, the connection is closed on whatever is left."""
    dropped = 0
    while last.get("more_body", False) and dropped <= limit:
        last = await receive()
        if last["type"] != "http.request":
            return
        dropped += len(last.get("body", b""))


async def send_json(send: Send, status: int, message: str,
                    headers: Mapping[str, str] | None = None) -> None:
    """A JSON error answer straight on the ASGI channel."""
    body = orjson.dumps({"error": message})
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


# --------------------------------------------------------------------------- bodies and messages


def strict_json(data: bytes | str) -> Any:
    """JSON as the standard says: no NaN or Infinity, finite numbers, integers the store can
    hold, bounded nesting; anything else raises :class:`json.JSONDecodeError`."""
    text = data if isinstance(data, str) else ""
    try:
        text = data.decode() if isinstance(data, bytes) else data
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite,
                          parse_int=_bounded_int)
    except json.JSONDecodeError:
        raise
    except (ValueError, RecursionError) as exc:
        message = str(exc) if isinstance(exc, ValueError) else "nested too deeply"
        raise json.JSONDecodeError(message, text, 0) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    value = int(text)
    if not -(1 << 63) <= value <= LARGEST_INT:
        raise ValueError(f"integer {text[:20]}... is out of range (64 bits)")
    return value


_PATH = re.compile(r"""(?<![^\s'"(=:\[{,])(?:[A-Za-z]:[\\/]|\\\\|/)[^\s'"()<>\[\]{},;:]+""")


def scrub_paths(message: str) -> str:
    """*message* with absolute file paths replaced by ``<path>`` (POSIX, Windows and UNC)."""
    return _PATH.sub("<path>", message)


def origin_of(url: str) -> str | None:
    """``scheme://host[:port]`` of *url*, the default port left out; None if it has none."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    default = {"http": 80, "https": 443}[parts.scheme]
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port not in (None, default) else "")

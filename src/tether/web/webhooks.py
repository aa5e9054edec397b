"""Webhook sources: each one's secret and the event types it may send (R3, issue 13).

A source is configured as ``source:secret[:types]``, several separated by commas, e.g.
``"github:s3cret:approval|upstream_ready,billing:0th3r:*"``. ``types`` is a ``|``-separated
allow-list; ``*``, or no list at all, allows any type **except** the reserved levers
(:data:`tether.protocol.RESERVED_EVENTS`: cancel, resume, rollback, decide and the harness's
own timers), which no webhook may send, listed or not: listing one is a configuration error.
A secret may not contain ``:`` and must be at least 16 bytes long.

A delivery is verified in this order: the source exists (``404``); its signature matches
(``401``, counted as a failed credential for the sender's address; ``429`` while that
address is limited; a matching signature is never refused for its address's failures, and
a delivery without the signature headers is ``422`` and counted nowhere); its
``X-Tether-Timestamp`` is plain Unix seconds, finite and within the tolerance of now
(``401``: a replay, or a clock to fix); then, once its body is read, its delivery ``id``
is 1-200 printable characters (``422``: no NUL, no line break) and its type is one the
source may send (``403``).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from tether.errors import ConfigurationError
from tether.protocol import RESERVED_EVENTS
from tether.web.security import HTTPRefusal

ANY = "*"
SECRET_MIN_BYTES = 16
_TIMESTAMP = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")


@dataclass(frozen=True)
class WebhookSource:
    """One sender: its HMAC secret and the event types it may send (``*``: any but levers)."""

    secret: str = field(repr=False)
    allowed: frozenset[str] = frozenset({ANY})

    def __post_init__(self) -> None:
        if len(self.secret.encode()) < SECRET_MIN_BYTES:
            raise ConfigurationError(f"a webhook secret must be at least {SECRET_MIN_BYTES}"
                                     " bytes long; make one with: openssl rand -hex 24")
        levers = sorted(self.allowed & RESERVED_EVENTS)
        if levers:
            raise ConfigurationError(f"webhooks may not send the reserved lever types"
                                     f" {', '.join(levers)}: take them out of the source's list")
        if not self.allowed:
            raise ConfigurationError("a webhook source's list of types is empty: name the"
                                     " types it may send, or * for any but the levers")

    def allows(self, event_type: str) -> bool:
        if event_type in RESERVED_EVENTS:
            return False
        return ANY in self.allowed or event_type in self.allowed


def parse_sources(text: str) -> dict[str, WebhookSource]:
    """``"github:secret1:approval|upstream_ready,billing:secret2:*"`` (list optional)."""
    sources = {}
    for number, item in enumerate(filter(None, (s.strip() for s in text.split(","))), 1):
        source, _, rest = item.partition(":")
        secret, _, types = rest.partition(":")
        if not source or not secret or ":" in types:
            raise ConfigurationError(f"webhook entry {number} ({source or '?'}): write"
                                     " source:secret or source:secret:type1|type2 (a secret"
                                     " may not contain ':')")
        allowed = frozenset(filter(None, (t.strip() for t in types.split("|")))) if types \
            else frozenset({ANY})
        sources[source] = WebhookSource(secret, allowed)
    return sources


def normalise(sources: Mapping[str, WebhookSource | str]) -> dict[str, WebhookSource]:
    """Sources given as a bare secret get the default list (any type but the levers)."""
    return {name: s if isinstance(s, WebhookSource) else WebhookSource(s)
            for name, s in sources.items()}


class BadSignature(HTTPRefusal):
    """A delivery whose signature does not match: a failed credential, limited per client."""

    def __init__(self) -> None:
        super().__init__(401, "the webhook signature does not match its body and timestamp")


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The signature a webhook sender puts in ``X-Tether-Signature``."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def verify(source: WebhookSource, timestamp: str, signature: str, body: bytes,
           tolerance: float, now: float) -> None:
    """Refuse (401) a delivery whose signature or timestamp is wrong."""
    if not hmac.compare_digest(sign(source.secret, timestamp, body).encode(),
                               signature.encode("utf-8", "surrogateescape")):
        raise BadSignature
    if not _TIMESTAMP.fullmatch(timestamp) or not math.isfinite(float(timestamp)):
        raise HTTPRefusal(401, "X-Tether-Timestamp must be Unix seconds (digits, optionally"
                               " a fraction)")
    age = abs(now - float(timestamp))
    if not age <= tolerance:
        raise HTTPRefusal(401, f"the webhook timestamp is {age:.0f}s away from now (tolerance"
                               f" {tolerance:.0f}s): a replay, or a clock to fix")


def check_type(name: str, source: WebhookSource, event_type: str) -> None:
    """Refuse (403) a type the source may not send, naming both."""
    if event_type in RESERVED_EVENTS:
        raise HTTPRefusal(403, f"webhook source {name!r} may not send {event_type!r}: it is a"
                               " lever reserved to operators (the API's own routes, the console,"
                               " the CLI)")
    if not source.allows(event_type):
        raise HTTPRefusal(403, f"webhook source {name!r} may not send event type"
                               f" {event_type!r} (it may send: {', '.join(sorted(source.allowed))})")

"""Named limits in the store, shared by every worker on every machine: admitting a call under
a concurrency or rate limit, letting it go, and a provider's 429 blocking a limit for all.

Written once as steps (:mod:`tether.store.steps`) for every SQL backend. Each admission locks
its limit's row (PostgreSQL: ``FOR UPDATE``; SQLite: the file's write lock), so two workers
never both take the last slot. A hold counts while its task is leased under the fence it was
taken with: a worker that dies frees its slots when its task is taken over, with no clock
involved. Tasks held back wait in the store, served by priority, then by how long they have
waited; letting a slot go wakes the first of them.
"""

from __future__ import annotations

import orjson

from tether.errors import StoreError
from tether.store import queries as q
from tether.store.base import SLOT_NOTICE, LimitAnswer, LimitRequest, LimitUsage
from tether.store.steps import Notify, Steps, change, every, one

BACKSTOP = 5.0
"""Seconds after which a task held back by a concurrency limit looks again even if no slot
was let go (a holder that died frees its slot only when its task is taken over)."""


def acquire(request: LimitRequest, now: float) -> Steps[LimitAnswer]:
    name, key = request.name, request.key
    yield change(q.LIMIT_SIZED_ROW, name, key, size_of(request))
    lock = yield one(q.LIMIT_LOCK, name, key, lock=True)
    blocked = lock["blocked_until"] if lock is not None else None
    if blocked is not None and blocked > now:
        return (yield from _hold_back(request, now, float(blocked), "blocked"))
    if request.concurrency is not None:
        yield change(q.LIMIT_DROP_DEAD_HOLDS, name, key)
        holders = [row["holder"] for row in (yield every(q.LIMIT_HOLDS, name, key))]
        if request.holder in holders:
            return LimitAnswer(True)  # taken already (a retried admission)
        if len(holders) >= request.concurrency:
            return (yield from _hold_back(request, now, now + BACKSTOP, "full", len(holders)))
    ahead = yield from _waiter_ahead(request, now)
    if ahead is not None:
        yield from _wake(ahead, now)  # a slot is free: the one ahead takes it first
        return (yield from _hold_back(request, now, now + BACKSTOP, "ahead"))
    windows = [w for w in (request.rate, request.tokens) if w is not None]
    if windows:
        yield change(q.LIMIT_FORGET_GRANTS, name, key, now - max(s for _, s in windows))
        full = yield from _window_full(request, now)
        if full is not None:
            return full
        yield change(q.LIMIT_GRANT, name, key, now, request.holder)
    if request.concurrency is not None:
        yield change(q.LIMIT_HOLD, name, key, request.holder, request.task_id, request.fence,
                     now)
    unqueued = yield change(q.LIMIT_UNWAIT, name, key, request.task_id)
    if unqueued:  # it was first in line: the next may fit too, and looks at once
        following = yield one(q.LIMIT_FIRST_WAITER, name, key)
        if following is not None:
            yield from _wake(str(following["task_id"]), now)
    return LimitAnswer(True)


def held_back(request: LimitRequest, retry_at: float, reason: str, amount: float = 0
              ) -> LimitAnswer:
    """A refusal, worded for people from its *reason* ('blocked', 'full', 'ahead', 'rate',
    'tokens', as these steps and PostgreSQL's ``tether_acquire_limit`` give it) and the
    *amount* it names (slots in use, admissions or tokens in the window)."""
    if reason == "blocked":
        why = "the provider asked everyone to wait (429)"
    elif reason == "full":
        why = f"{int(amount)} of {request.concurrency} in use"
    elif reason == "ahead":
        why = "others wait ahead"
    elif reason == "rate" and request.rate is not None:
        why = f"{request.rate[0]} admitted in the last {request.rate[1]:g}s"
    elif reason == "tokens" and request.tokens is not None:
        why = f"{int(amount)} of {request.tokens[0]} tokens used in the last {request.tokens[1]:g}s"
    else:
        raise StoreError(f"limit {request.name!r}: the store held a call back for a reason"
                         f" this tether does not know ({reason!r}); upgrade tether")
    slot = reason == "full" or (reason == "ahead" and request.concurrency is not None)
    return LimitAnswer(False, retry_at, why, slot=slot)


def _window_full(request: LimitRequest, now: float) -> Steps[LimitAnswer | None]:
    """Held back if the rate window holds its count of admissions, or the token window
    the tokens the admitted calls reported; None if there is room in both."""
    for window, column, reason in ((request.rate, "n", "rate"),
                                   (request.tokens, "tokens", "tokens")):
        if window is None:
            continue
        most, seconds = window
        found = yield one(q.LIMIT_GRANTS, request.name, request.key, now - seconds)
        if found is not None and int(found[column]) >= most:
            return (yield from _hold_back(request, now, float(found["oldest"]) + seconds,
                                          reason, int(found[column])))
    return None


def spent(name: str, key: str, holder: str, tokens: int) -> Steps[None]:
    """The tokens an admitted call used, counted in its token window from its admission."""
    yield change(q.LIMIT_SPENT, tokens, name, key, holder)


def _waiter_ahead(request: LimitRequest, now: float) -> Steps[str | None]:
    """Another task still waiting that comes before this one (by priority, then age)."""
    yield change(q.LIMIT_DROP_GONE_WAITERS, request.name, request.key, now)
    mine = yield one(q.LIMIT_WAITER_SINCE, request.name, request.key, request.task_id)
    since = float(mine["since"]) if mine is not None else now
    priority = min(request.priority, int(mine["priority"])) if mine is not None \
        else request.priority
    row = yield one(q.LIMIT_AHEAD, request.name, request.key, request.task_id, priority,
                    priority, since)
    return None if row is None else str(row["task_id"])


def _hold_back(request: LimitRequest, now: float, retry_at: float, reason: str,
               amount: float = 0) -> Steps[LimitAnswer]:
    yield change(q.LIMIT_WAIT, request.name, request.key, request.task_id, request.priority, now,
                 retry_at + BACKSTOP)
    return held_back(request, retry_at, reason, amount)


def release(name: str, key: str, holder: str, now: float) -> Steps[str | None]:
    """Let a slot go and wake the first task waiting for this limit; that task's id."""
    yield change(q.LIMIT_UNHOLD, name, key, holder)
    yield change(q.LIMIT_DROP_GONE_WAITERS, name, key, now)
    first = yield one(q.LIMIT_FIRST_WAITER, name, key)
    if first is None:
        return None
    yield from _wake(str(first["task_id"]), now)
    return str(first["task_id"])


def _wake(task_id: str, now: float) -> Steps[None]:
    """A parked task is made due, and the workers are told of it; one a worker holds (waiting
    in memory for a slot) is only told of, so that its worker lets it ask again at once."""
    woken = yield change(q.WAKE_PARKED, now, task_id)
    yield Notify(task_id if woken else SLOT_NOTICE + task_id)



def block(name: str, key: str, until: float, now: float) -> Steps[None]:
    """A provider said "wait until *until*" (a 429 with Retry-After): nobody is admitted
    under this limit before then."""
    yield change(q.LIMIT_ROW, name, key)
    yield change(q.LIMIT_BLOCK, until, name, key, until)


def usage(now: float) -> Steps[list[LimitUsage]]:
    found = yield every(q.LIMIT_USAGE, now, now - 60.0)
    return [LimitUsage(str(row["name"]), str(row["key"]), int(row["in_use"]),
                       int(row["waiting"]), int(row["admitted_last_minute"]),
                       float(row["blocked_until"]) if row["blocked_until"] is not None
                       and float(row["blocked_until"]) > now else None,
                       *_sized(row["size"]))
            for row in found]


def size_of(request: LimitRequest) -> str:
    """The limit's size as stored: JSON, the same text for the same size."""
    return orjson.dumps({"concurrency": request.concurrency, "rate": request.rate,
                         "tokens": request.tokens}).decode()


Size = tuple[int | None, tuple[int, float] | None, tuple[int, float] | None]
"""A limit's concurrency, rate and tokens."""


def _sized(stored: str | None) -> Size:
    """The size of a usage row; unknown (all None) when no admission recorded one (a limit
    only a provider's 429 blocked, or rows kept from before sizes were recorded) or the text
    is not one tether wrote."""
    try:
        size = orjson.loads(stored) if stored else {}
        concurrency, rate, tokens = size["concurrency"], size["rate"], size["tokens"]
        return (None if concurrency is None else int(concurrency),
                None if rate is None else (int(rate[0]), float(rate[1])),
                None if tokens is None else (int(tokens[0]), float(tokens[1])))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, IndexError):
        return None, None, None

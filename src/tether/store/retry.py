"""Riding out a store outage (issue 13): bounded exponential back-off with jitter, and an
outage logged once when it begins and once when it ends, never once per retry.

A worker meets :class:`~tether.errors.StoreUnavailable` (PostgreSQL restarting, a SQLite
write lock held past the busy timeout) in its claims, lease renewals and tasks. It reports
each to one :class:`Outage`, waits the delay it returns, and asks the store again
(``Store.ping``: can it take a write?); the first yes ends the outage.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable


class Backoff:
    """Delays of *first* seconds doubling up to *cap*, each drawn from its upper half (so
    workers that failed together do not retry together, and no delay exceeds *cap*)."""

    def __init__(self, first: float = 0.1, cap: float = 5.0,
                 rng: Callable[[], float] = random.random) -> None:
        self.first = first
        self.cap = cap
        self.rng = rng
        self.attempts = 0

    def next(self) -> float:
        ceiling = min(self.cap, self.first * 2.0 ** min(self.attempts, 30))
        self.attempts += 1
        return ceiling * (0.5 + 0.5 * self.rng())

    def reset(self) -> None:
        self.attempts = 0


class Outage:
    """One worker's view of its store's availability."""

    def __init__(self, log: logging.Logger, backoff: Backoff | None = None) -> None:
        self.log = log
        self.backoff = backoff or Backoff()
        self.began: float | None = None
        self.ended: float | None = None
        self.failures = 0
        self.outages = 0
        """Outages seen so far (ended or not)."""
        self.last_error: BaseException | None = None

    @property
    def active(self) -> bool:
        return self.began is not None

    def failed(self, error: BaseException) -> float:
        """Note a failed attempt; returns how long to wait before the next one."""
        self.noted(error)
        return self.backoff.next()

    def noted(self, error: BaseException) -> None:
        """Note a failure met elsewhere (a task's write, a renewal) without waiting on it.
        The first failure of an outage is logged as a WARNING; the others are only counted.
        A call that began before the last outage ended (it waited for a connection all
        through it) failed in that outage: it does not start a new one."""
        began = time.monotonic() - getattr(error, "waited", 0.0)
        if self.began is None and self.ended is not None and began < self.ended:
            return
        self.last_error = error
        self.failures += 1
        if self.began is None:
            self.began = time.monotonic()
            self.outages += 1
            self.log.warning("store unavailable: %s; riding it out (retrying with back-off up"
                             " to %.0f s); tasks whose leases lapse meanwhile are taken up"
                             " again from their last checkpoint", error, self.backoff.cap)

    def succeeded(self) -> bool:
        """Note a successful store call; True (logged once, as INFO) if it ends an outage."""
        if self.began is None:
            return False
        took = time.monotonic() - self.began
        self.log.info("store available again after %.1f s (%d failed attempt%s)", took,
                      self.failures, "" if self.failures == 1 else "s")
        self.began, self.failures = None, 0
        self.ended = time.monotonic()
        self.backoff.reset()
        return True

"""Named limits that tools and agents declare: "at most 8 calls to provider X at once",
"600 requests a minute", "2 at once per tenant". They hold across every worker process and
machine, through the store (:mod:`tether.store.limit_steps`); a task held back waits in the
store, not in memory (:mod:`tether.engine.admission`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tether.errors import ConfigurationError, InvalidInput

_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,100}")
MAX_KEY = 200
"""The longest key a limit's *key* function may return (longer ones are refused)."""


@dataclass(frozen=True)
class Limit:
    """One named limit: *concurrency* calls at once and/or *rate* = (count, seconds)
    admissions in any window; with *key*, each value it returns for a task's input (a
    tenant, a user) has limits of its own."""

    name: str
    concurrency: int | None = None
    rate: tuple[int, float] | None = None
    key: Callable[[Any], object] | None = None
    tokens: tuple[int, float] | None = None
    """(budget, seconds): calls are admitted while those admitted in the last *seconds*
    reported fewer than *budget* tokens (a model call reports its usage; a tool may set
    ``ctx.tokens``). The check is before the call, the count after: one call may go over."""

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ConfigurationError(f"limit name {self.name!r}: use 1-100 letters, digits and"
                                     " _ . : -")
        if self.concurrency is None and self.rate is None and self.tokens is None:
            raise ConfigurationError(f"limit {self.name!r} limits nothing: give concurrency=,"
                                     " per_minute= (or per_second=, rate=) or"
                                     " tokens_per_minute=")
        if self.concurrency is not None and not 1 <= self.concurrency <= 100_000:
            raise ConfigurationError(f"limit {self.name!r}: concurrency must be 1 to 100000")
        if self.rate is not None:
            count, seconds = self.rate
            if not (1 <= count <= 10_000_000 and 0.001 <= seconds <= 86_400):
                raise ConfigurationError(f"limit {self.name!r}: a rate is 1 or more calls per"
                                         " 0.001 s to one day")
        if self.tokens is not None:
            budget, seconds = self.tokens
            if not (1 <= budget <= 10**12 and 0.001 <= seconds <= 86_400):
                raise ConfigurationError(f"limit {self.name!r}: a token budget is 1 or more"
                                         " tokens per 0.001 s to one day")

    def key_for(self, task_input: Any) -> str:
        """The key this task's calls count under ("" without a *key* function)."""
        if self.key is None:
            return ""
        try:
            value = self.key(task_input)
        except Exception as error:  # user code: say which limit and why
            raise InvalidInput(f"limit {self.name!r}: its key could not be read from the task's"
                               f" input ({type(error).__name__}: {error})") from error
        text = str(value)
        if len(text) > MAX_KEY:
            raise InvalidInput(f"limit {self.name!r}: its key is {len(text)} characters long"
                               f" (at most {MAX_KEY})")
        return text


def make_limit(name: str, *, concurrency: int | None = None, per_minute: int | None = None,
               per_second: int | None = None, rate: tuple[int, float] | None = None,
               key: Callable[[Any], object] | None = None,
               tokens_per_minute: int | None = None,
               tokens: tuple[int, float] | None = None) -> Limit:
    """A :class:`Limit` from the words people use for one."""
    if tokens is not None and tokens_per_minute:
        raise ConfigurationError(f"limit {name!r}: give one of tokens_per_minute=, tokens=")
    rates = [r for r in (rate, (per_minute, 60.0) if per_minute else None,
                         (per_second, 1.0) if per_second else None) if r is not None]
    if len(rates) > 1:
        raise ConfigurationError(f"limit {name!r}: give one of per_minute=, per_second=, rate=")
    return Limit(name, concurrency, (int(rates[0][0]), float(rates[0][1])) if rates else None,
                 key, (int(tokens_per_minute), 60.0) if tokens_per_minute else
                 (int(tokens[0]), float(tokens[1])) if tokens else None)

"""Preemption: a P0 event cancels the model call or interruptible tool in flight (E1).

The runner runs such work through a :class:`Preemptible` slot; a P0 event, the task's
deadline or a graceful stop cancels it at once. Work cut that way raises
:class:`Preempted` in the runner, never the bare ``CancelledError``, so a cancellation of
the worker itself (shutdown) is still told apart from a preemption.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tether.agent import CutOff

T = TypeVar("T")


class Preempted(Exception):
    """Internal: a P0 event cancelled the plan or interruptible tool in flight."""


class Preemptible:
    """The one piece of work of a task that a P0 may cut off, if any is in flight."""

    def __init__(self) -> None:
        self._work: asyncio.Future[Any] | None = None
        self._preempting = False
        self._cut_unspent = False

    async def run(self, work: Awaitable[T], keep_partial: Callable[[str], None]) -> T:
        """Run *work*; a cut-off model answer's partial text goes to *keep_partial*.

        A cut that came since the runner last looked (:meth:`looked`) and found no work in
        flight stops this work before it starts: otherwise a P0 or a deadline falling due
        between the inbox read and the model call would wait for the whole call."""
        if self._cut_unspent:
            self._cut_unspent = False
            if inspect.iscoroutine(work):
                work.close()
            raise Preempted
        future: asyncio.Future[T] = asyncio.ensure_future(work)
        self._work = future
        try:
            return await future
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self._preempting and (current is None or not current.cancelling()):
                raise Preempted from None
            raise
        except CutOff as cut:
            if not self._preempting:
                raise
            keep_partial(cut.partial)
            raise Preempted from None
        finally:
            self._work = None
            self._preempting = False

    def cut(self) -> None:
        """Cancel the work in flight now, or the next work before it starts if none is."""
        if self._work is not None and not self._work.done():
            self._preempting = True
            self._work.cancel()
        else:
            self._cut_unspent = True

    def looked(self) -> None:
        """The runner is about to read its inbox and clock: a cut made before now is answered
        by what it reads, so it no longer stops the next work."""
        self._cut_unspent = False

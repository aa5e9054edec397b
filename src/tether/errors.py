"""tether's exception hierarchy.

Every error tether raises derives from :class:`TetherError`, so one ``except``
catches them all. Each class's docstring is its default message; callers pass
a more specific message naming the task, event, tool or version involved.
"""

from __future__ import annotations

from typing import Any


class TetherError(Exception):
    """Something went wrong inside tether."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigurationError(TetherError):
    """The harness is misconfigured: check the settings, protocol table and registrations."""


class MissingExtra(ConfigurationError):
    """An optional part of tether is used without the libraries it needs."""

    def __init__(self, what: str, extra: str) -> None:
        super().__init__(f"{what}: install tether's {extra!r} extra (in tether's clone:"
                         f" pip install -e '.[{extra}]')")


class StoreURLError(ConfigurationError):
    """The store URL is not understood; use sqlite:///path.db or memory://."""


class UnknownAgent(ConfigurationError):
    """No agent is registered under that name."""


class UnknownEventType(ConfigurationError):
    """The event type is not in the interruption protocol; pass priority= or add it."""


class LifespanFailed(TetherError):
    """An application lifespan (``@harness.lifespan``) raised: on enter, so the workers did not
    start and no task was claimed; or on exit, after the workers had stopped."""


class InvalidInput(TetherError):
    """The input is not valid: it must be JSON-serialisable and well formed."""


class ReservedEventType(TetherError):
    """That event type is a lever reserved to operators (cancel, resume, rollback, decide and
    the harness's own timers); use the Harness method, the CLI, the console or the API route."""


class InDoubtCall(TetherError):
    """A side-effecting call's outcome is unknown: say what happened (happened, not_happened
    or skip) instead of a plain resume, so it is never repeated blindly."""


class TaskNotFound(TetherError):
    """No task with that id exists in the store."""


class TaskExists(TetherError):
    """A task with that id already exists."""


class VersionNotFound(TetherError):
    """That snapshot version is not kept for this task."""


class IllegalTransition(TetherError):
    """The task cannot move from its current status to the one requested."""


class CallInFlight(IllegalTransition):
    """The call is running under a live worker's lease: its outcome is not in doubt, so
    there is nothing to decide yet; wait for it to finish (or for its worker to die)."""


class StaleDecision(IllegalTransition):
    """A decision was made about a call in a state the task has since left (the call ran
    again, was settled, or the task was rolled back): it is dropped, never applied."""


class TaskClosed(TetherError):
    """The task has finished (completed, failed or cancelled) and takes no more events."""


class ScheduleNotFound(TetherError):
    """No schedule has that name."""


class TaskHeld(TetherError):
    """A worker holds the task under a live lease: it cannot be deleted under the worker."""


class InboxFull(TetherError):
    """The task's inbox is full: low-priority events are refused until it drains; retry later."""


class LeaseLost(TetherError):
    """This worker no longer holds the task's lease; another worker owns it now."""


class InboxMoved(TetherError):
    """Events the runner has not seen reached the task's inbox before a commit that asked
    not to be written then (a call's resume point): nothing of it was written."""


class CorruptSnapshot(TetherError):
    """A stored snapshot could not be read back."""


class SnapshotTooNew(TetherError):
    """A stored snapshot was written by a newer tether; this worker leaves the task alone."""


class StoreError(TetherError):
    """The store failed to carry out an operation."""

    waited: float = 0.0
    """Seconds the failed call had been waiting (for a pooled connection, say) before it
    failed: it began that long ago, perhaps in an outage that has ended since."""


class ToolTimeout(TetherError):
    """The tool call did not finish within its timeout."""


class OutcomeUnknown(TetherError):
    """Raise this from a side-effecting tool when the request may have gone out but no answer
    came: tether will not retry it blindly; it asks the reconcile hook or a person."""


class RateLimited(TetherError):
    """Raise this from a tool (or an agent's plan) when the provider refused the request for
    now (an HTTP 429) and did not act on it: the limits the tool (or agent) declares are
    closed for everyone until *retry_after* seconds have passed, and this call runs again
    then, with the same key, without counting as a failure."""

    def __init__(self, retry_after: float, message: str = "") -> None:
        super().__init__(message or f"the provider asked to wait {retry_after:g}s (429)")
        self.retry_after = max(0.0, min(float(retry_after), 3600.0))


class NeedsPerson(TetherError):
    """Raised by an agent's plan when no retry can help (a provider's content filter refused
    the answer, the model keeps sending calls it cannot make): the task goes to a person at
    once, with this message as the reason."""


class NotRetryable(TetherError):
    """Raise this from a tool to stop its retries: the failure will not go away by itself."""


class ServerError(TetherError):
    """A tether server (``tether serve``) answered with an error the client has no other
    exception for (a refused token, a server fault), or could not be reached; ``status`` is
    the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class CallNotMade(TetherError):
    """Raised where a graph's node made a call that a person told tether to skip (``decide
    skip``): the call was not made, and the node may handle that or fail."""


class ResultUnusable(TetherError):
    """Raise this from a tool (or an adapter running one) that ran but whose result cannot be
    kept: running it again would repeat what it did, so the call is recorded as done, not
    repeated, and the task goes to a person with this message. *value* is what it returned."""

    def __init__(self, message: str, value: Any = None) -> None:
        super().__init__(message)
        self.value = value


class GraphBaseGone(StoreError):
    """A LangGraph channel value stored as what it added to an earlier version named a
    version that is not there any more (pruned or deleted meanwhile); nothing was written.
    TetherSaver then stores the value whole."""


class StoreUnavailable(StoreError):
    """The store is unavailable for now (a server restarting or unreachable, a connection
    reset, a database lock held past the busy timeout, a serialization failure). A write is
    all or nothing, as always; retrying later may succeed, and workers ride it out."""


class CorruptStore(StoreError):
    """The store's file or tables are damaged: run `tether check` to see what is affected,
    and restore the store from a backup."""


class StoreReplaced(CorruptStore):
    """The store's file was deleted or replaced while this process had it open: what it
    writes would go to a file that is no longer there, so it writes nothing more to it.
    Start the process again on the file that is there now (or put back the one you meant)."""

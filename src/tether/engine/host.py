"""What the engine needs from the application around it (the :class:`~tether.harness.Harness`).

The runner and the worker are handed their host instead of importing the harness, so the
engine sits below the harness with no import back up. Anything that satisfies this
protocol can host a runner: a harness in production, a small object in a test.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol

from tether.agent import Agent
from tether.engine.inbox import Inbox
from tether.resources import ResourceKinds
from tether.settings import Settings
from tether.store import WorkerStore
from tether.telemetry import Telemetry
from tether.throttling import Limit
from tether.tools import Tool


class RunnerHost(Protocol):
    """The registries, settings and services a runner reads while it runs a task."""

    @property
    def settings(self) -> Settings: ...

    @property
    def agents(self) -> Mapping[str, Agent]: ...

    @property
    def tools(self) -> Mapping[str, Tool]: ...

    @property
    def limits(self) -> Mapping[str, Limit]: ...

    @property
    def resource_kinds(self) -> ResourceKinds: ...

    @property
    def telemetry(self) -> Telemetry: ...

    @property
    def counters(self) -> Counter[str]: ...

    @property
    def log(self) -> logging.Logger: ...

    @property
    def degraded(self) -> dict[str, Any] | None:
        """Worker-wide degradation every task follows (R3)."""

    @property
    def store(self) -> WorkerStore: ...

    @property
    def inbox(self) -> Inbox: ...

    def slot_freed(self, task_id: str) -> None:
        """A limit's slot was let go for *task_id*: if this process runs it and it waits in
        memory for one, it asks again at once."""

    def captured_head(self, event_id: int, version: int) -> bytes | None:
        """The head a rollback lever of this process read when it was asked, if still held."""

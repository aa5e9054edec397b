"""Named kill points for crash tests: free when off, SIGKILL when armed.

Arm with ``TETHER_FAILPOINTS=name[@n][,name2...]`` in the environment of a
worker process: the *n*-th time (default 1st) the code passes ``name``, the
process kills itself with SIGKILL, mid-flight, with no cleanup. Tests use
this to kill at exactly the dangerous instants instead of at random ones.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "before_plan_recorded",
    "after_resume_point",
    "inside_tool",
    "after_tool_before_commit",
    "mid_checkpoint",
    "after_checkpoint",
    "event_stored",
    "during_recovery",
    "during_rollback",
    "schedule_run_started",
)
"""Every point the code checks; ``inside_tool`` is for tools to call themselves."""


def _parse(spec: str) -> dict[str, int]:
    armed: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, count = item.partition("@")
        armed[name] = int(count or 1)
    return armed


_ARMED = _parse(os.environ.get("TETHER_FAILPOINTS", ""))
_SEEN: dict[str, int] = {}


def failpoint(name: str) -> None:
    """Die here with SIGKILL if this point is armed and its count is reached."""
    if not _ARMED or name not in _ARMED:
        return
    _SEEN[name] = _SEEN.get(name, 0) + 1
    if _SEEN[name] >= _ARMED[name]:
        os.kill(os.getpid(), signal.SIGKILL)

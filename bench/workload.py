"""The one workload every compared system runs (issue 7), and how a run is measured.

An agent runs S steps. Each step the (fake, local) model looks at how many tool
results the dialog holds and proposes the next tool call, with a ~200-byte
argument; the tool answers ~500 bytes, which goes into the dialog. Every system
gets this same logic, written in its own idiom.

A step is timed from one tool invocation to the next, so a step's time holds
everything the system does between two tool calls: the model's turn, its
checkpoints, the dialog append. Bytes written are read from the kernel
(``wchar`` in ``/proc/self/io``, every ``write()`` the process made, SQLite's
WAL frames included) or, for PostgreSQL, from the server's WAL position.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ARG = "a" * 200
RESULT = "r" * 500


def fake_model(tool_results: int, steps: int) -> dict[str, Any] | None:
    """The model's turn: the next tool call, or None when the work is done."""
    if tool_results >= steps:
        return None
    return {"name": "work", "args": {"payload": ARG, "n": tool_results}}


def process_bytes_written() -> int:
    """Bytes this process has passed to ``write()`` so far (all threads)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no wchar line")


WINDOW = 100
"""Bytes are counted over this many steps from each mark: a few steps are lumpy (a SQLite
WAL checkpoint copies about a thousand pages back into the database every hundred steps or
so, and a page split lands on some steps and not others)."""


def byte_marks(steps: int) -> tuple[int, ...]:
    """Where write volume is measured: from step 10, from step 100, and over the last steps."""
    window = byte_window(steps)
    return tuple(sorted({k for k in (10, 100, steps - 1 - window) if 0 < k <= steps - 1 - window}))


def byte_window(steps: int) -> int:
    return max(1, min(WINDOW, steps // 4))


@dataclass
class Meter:
    """Timestamps of each tool invocation, and byte counters around the marked steps."""

    steps: int
    count_bytes: Callable[[], int] | None = None
    hang_at: int | None = None
    """In a child that is to be killed: the call that says READY and never returns."""
    started: float = field(default_factory=time.perf_counter)
    stamps: list[float] = field(default_factory=list)
    byte_counts: dict[int, int] = field(default_factory=dict)

    def tool_called(self, n: int, payload: str = "") -> str:
        """Called first thing in the tool body; returns the tool's ~500-byte result."""
        self.stamps.append(time.perf_counter())
        if n == self.hang_at:
            print("READY", flush=True)
            time.sleep(3600)
        if self.count_bytes is not None:
            marks = byte_marks(self.steps)
            if n in marks or n - byte_window(self.steps) in marks:
                self.byte_counts[n] = self.count_bytes()
        return RESULT

    def report(self) -> dict[str, Any]:
        """Per-step seconds and, for each marked step k, bytes written per step from k on."""
        deltas = [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)]
        window = byte_window(self.steps)
        written = {k: (self.byte_counts[k + window] - self.byte_counts[k]) / window
                   for k in byte_marks(self.steps)
                   if k in self.byte_counts and k + window in self.byte_counts}
        return {"step_seconds": deltas, "calls": len(self.stamps), "bytes_at": written,
                "first_call_s": self.stamps[0] - self.started if self.stamps else None}

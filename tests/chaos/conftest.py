"""Shared bookkeeping for the torture schedules: totals, and the summary line at the end."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from test_sigkill_recovery import children, paths  # noqa: F401  (fixtures other chaos files use)

TORTURE_STATS = pytest.StashKey[dict[str, Any]]()


@pytest.fixture(scope="session")
def torture_stats(pytestconfig: pytest.Config) -> dict[str, Any]:
    """Kills per point, seeds, workers and time of every torture run in this session."""
    return pytestconfig.stash.setdefault(TORTURE_STATS, {
        "seeds": [], "kills": Counter(), "incarnations": 0, "seconds": 0.0, "violations": 0,
        "statuses": Counter(), "events": Counter()})


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    stats = config.stash.get(TORTURE_STATS, None)
    if not stats or not stats["seeds"]:
        return
    kills: Counter[str] = stats["kills"]
    seeds = stats["seeds"]
    total = sum(kills.values())
    terminalreporter.write_line(
        f"tether torture: {total} kills ({total - kills['event_stored']} of"
        f" {stats['incarnations']} workers, {kills['event_stored']} emitters) over"
        f" {len(seeds)} seeds ({min(seeds)}..{max(seeds)}) in {stats['seconds']:.1f}s;"
        f" {stats['violations']} violations; points covered ({len(kills)}):"
        f" {', '.join(f'{p}={n}' for p, n in sorted(kills.items()))};"
        f" tasks ended {dict(stats['statuses'])};"
        f" events { {str(outcome): n for outcome, n in stats['events'].items()} }")

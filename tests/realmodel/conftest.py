"""The real-model tier: llama.cpp's ``llama-server`` with a 135M model, offline (issue 16).

The server is built once per machine (``llama_server.py``; about ten minutes on two cores,
cached outside the clone) and started once per test session. Only a machine that cannot
build it (no compiler, no cmake, no package index) skips the tier, with one line saying
why; a build that fails is a failure, and under CI so is a missing server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import llama_server
import pytest
import server

FIGURES = pytest.StashKey[dict[str, Any]]()


@pytest.fixture(scope="session")
def figures(pytestconfig: pytest.Config) -> dict[str, Any]:
    """What the tier measured, printed at the end of the run."""
    return pytestconfig.stash.setdefault(FIGURES, {})


@pytest.fixture(scope="session")
def real_model(figures: dict[str, Any]) -> Iterator[server.RealServer]:
    try:
        _, _, seconds = llama_server.ensure_built()
    except llama_server.BuildImpossible as why:
        pytest.skip(f"the real-model tier cannot build llama-server here: {why}")
    figures["build_seconds"] = round(seconds)
    with server.running_server() as running:
        figures["server_start_seconds"] = round(running.started_in, 2)
        yield running


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    found = config.stash.get(FIGURES, None)
    if found:
        terminalreporter.write_line(f"real-model tier: {found}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The first test may wait for the build (``.ci/test`` builds before pytest starts)."""
    for item in items:
        if "realmodel" in str(item.path):
            item.add_marker(pytest.mark.timeout(1800))

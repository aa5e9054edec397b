"""Options shared by the whole test tree."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--torture-seeds", type=int, default=None, metavar="N",
                     help="run the chaos torture schedules with seeds 1..N (default 9, or"
                          " TETHER_TORTURE_SEEDS)")

"""Fixtures for the in-process acceptance tests (requirements R1-R26, edges E1-E8).

Every test builds its own small agents and tools on a fresh harness.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _support import fast_settings

import tether as tt


@pytest.fixture
async def harness():
    h = tt.Harness("memory://", settings=fast_settings())
    yield h
    await h.close()


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tether.db'}"

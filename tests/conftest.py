"""Options shared by the whole test tree."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import services


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--torture-seeds", type=int, default=None, metavar="N",
                     help="run the chaos torture schedules with seeds 1..N (default 9, or"
                          " TETHER_TORTURE_SEEDS)")


TIERS = {"chaos": "tests/chaos/", "realmodel": "tests/realmodel/",
         "browser": "tests/integration/test_console_browser", "bench": "tests/integration/test_bench_"}
"""The slow tiers, by where their tests live: `pytest -m "not chaos and not realmodel and not
browser and not bench"` runs the rest in a few minutes; CI runs everything."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        where = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        for tier, prefix in TIERS.items():
            if where.startswith(prefix):
                item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """This run's own PostgreSQL database (created now, dropped at the end)."""
    url = services.create_database()
    yield url
    services.drop_database(url)


@pytest.fixture
def pg_url(pg_database: str) -> str:
    """The run's database, emptied for this test."""
    services.reset_database(pg_database)
    return pg_database

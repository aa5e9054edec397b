"""Options shared by the whole test tree."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import services


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--torture-seeds", type=int, default=None, metavar="N",
                     help="run the chaos torture schedules with seeds 1..N (default 9, or"
                          " TETHER_TORTURE_SEEDS)")


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

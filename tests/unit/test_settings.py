"""Settings defaults and validation (R7, R12, R14)."""

from __future__ import annotations

from typing import Any

import pytest

from tether.errors import ConfigurationError
from tether.settings import Settings


def test_defaults_are_sensible() -> None:
    """R12, R14, R6: bounded recovery 3-5, 10 kept versions, 1-2 s coalescing, durable SQLite."""
    settings = Settings()
    assert 3 <= settings.max_recovery_attempts <= 5
    assert settings.keep_versions == 10
    assert settings.coalesce_window >= 1.0 and settings.coalesce_window <= 2.0
    assert settings.checkpoint_every_steps == 1
    assert settings.inbox_capacity >= 1
    assert settings.recovery_timeout > 0
    assert settings.sqlite_synchronous == "FULL"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_recovery_attempts", 0),
        ("checkpoint_every_steps", 0),
        ("inbox_capacity", 0),
        ("keep_versions", 0),
        ("keep_versions", -3),
        ("recovery_timeout", 0.0),
        ("recovery_timeout", -1.0),
        ("lease_seconds", 0.0),
        ("poll_interval", -0.1),
    ],
)
def test_out_of_range_settings_name_the_setting(name: str, value: Any) -> None:
    """R12: a setting out of range is a configuration error naming it."""
    with pytest.raises(ConfigurationError, match=name):
        Settings(**{name: value})


@pytest.mark.parametrize(("name", "value"), [("coalesce_window", -1.0), ("recovery_backoff", -0.5)])
def test_negative_durations_are_refused(name: str, value: Any) -> None:
    """R6, R12: windows and back-offs cannot be negative."""
    with pytest.raises(ConfigurationError, match=name):
        Settings(**{name: value})


def test_zero_window_and_backoff_are_allowed() -> None:
    """R6, R25: coalescing and recovery back-off may be switched off."""
    settings = Settings(coalesce_window=0.0, recovery_backoff=0.0)
    assert settings.coalesce_window == 0.0 and settings.recovery_backoff == 0.0


@pytest.mark.parametrize("value", ["OFF", "fast", ""])
def test_sqlite_synchronous_must_be_durable_level(value: str) -> None:
    """R13: only FULL, NORMAL or EXTRA are accepted for the SQLite synchronous level."""
    with pytest.raises(ConfigurationError, match="sqlite_synchronous"):
        Settings(sqlite_synchronous=value)


@pytest.mark.parametrize("value", ["FULL", "NORMAL", "EXTRA", "normal"])
def test_sqlite_synchronous_accepts_levels(value: str) -> None:
    """R13: the durable levels are accepted, case-insensitively."""
    assert Settings(sqlite_synchronous=value).sqlite_synchronous == value


def test_replace_returns_validated_copy() -> None:
    """R12: replace() changes one knob, leaves the original alone, and still validates."""
    base = Settings()
    changed = base.replace(keep_versions=3)
    assert changed.keep_versions == 3 and base.keep_versions == 10
    assert changed.max_recovery_attempts == base.max_recovery_attempts
    with pytest.raises(ConfigurationError, match="keep_versions"):
        base.replace(keep_versions=0)


def test_settings_are_immutable() -> None:
    """R12: settings cannot change under a running harness."""
    settings = Settings()
    with pytest.raises(AttributeError):
        settings.keep_versions = 1  # type: ignore[misc]
    assert settings.keep_versions == 10

"""The interruption protocol table (R4, R24, E2)."""

from __future__ import annotations

import pytest

from tether.errors import ConfigurationError, UnknownEventType
from tether.model import Priority
from tether.protocol import DEFAULT_RULES, InterruptionProtocol, Rule


@pytest.fixture
def protocol() -> InterruptionProtocol:
    return InterruptionProtocol()


@pytest.mark.parametrize(
    ("event_type", "priority"),
    [
        ("user_interrupt", Priority.P0),
        ("cancel", Priority.P0),
        ("user_message", Priority.P1),
        ("approval", Priority.P1),
        ("tool_timeout", Priority.P2),
        ("tool_error", Priority.P2),
        ("model_error", Priority.P2),
        ("progress", Priority.P3),
        ("heartbeat", Priority.P4),
    ],
)
def test_default_priorities(protocol: InterruptionProtocol, event_type: str, priority: Priority) -> None:
    """R4: preemption is P0, user input P1, faults P2, progress P3, heartbeats P4."""
    assert protocol.rule_for(event_type).priority is priority


def test_call_faults_share_one_coalescing_class(protocol: InterruptionProtocol) -> None:
    """E2: a tool timeout, tool error, retry and degrade for one call collapse into one instruction."""
    classes = {protocol.rule_for(t).coalesce for t in ("tool_timeout", "tool_error", "retry", "degrade")}
    assert len(classes) == 1
    assert None not in classes


def test_model_error_is_coalesced_apart_from_tool_faults(protocol: InterruptionProtocol) -> None:
    """E2: model failures coalesce among themselves, not with a tool call's recovery."""
    model = protocol.rule_for("model_error").coalesce
    assert model is not None
    assert model != protocol.rule_for("tool_error").coalesce


@pytest.mark.parametrize("event_type", ["user_message", "follow_up", "amend", "approval", "webhook",
                                        "user_interrupt", "cancel"])
def test_content_events_are_never_coalesced_by_default(
    protocol: InterruptionProtocol, event_type: str
) -> None:
    """E2: nothing a person said (or an approval carried) is silently dropped by coalescing."""
    assert protocol.rule_for(event_type).coalesce is None


def test_progress_and_heartbeat_coalesce(protocol: InterruptionProtocol) -> None:
    """R6: state-only events of one type collapse to the newest."""
    assert protocol.rule_for("progress").coalesce == "progress"
    assert protocol.rule_for("heartbeat").coalesce == "heartbeat"


def test_overrides_by_rule_priority_or_int() -> None:
    """R24: the treatment of each event type is configuration in one place."""
    protocol = InterruptionProtocol({
        "progress": Priority.P1,
        "heartbeat": 2,
        "deploy": Rule(Priority.P0, coalesce="deploy"),
    })
    # a bare priority keeps the default coalescing class (E2)
    assert protocol.rule_for("progress") == Rule(Priority.P1, coalesce="progress")
    assert protocol.rule_for("heartbeat").priority is Priority.P2
    assert protocol.rule_for("deploy") == Rule(Priority.P0, coalesce="deploy")
    assert protocol.rule_for("cancel").priority is Priority.P0
    # the defaults are not changed for other harnesses
    assert InterruptionProtocol().rule_for("progress").priority is Priority.P3
    assert DEFAULT_RULES["progress"].priority is Priority.P3


def test_explicit_priority_overrides_table_but_keeps_coalescing(protocol: InterruptionProtocol) -> None:
    """R4: a sender may pass a priority; the type's coalescing class still applies."""
    assert protocol.rule_for("progress", priority=1) == Rule(Priority.P1, coalesce="progress")
    assert protocol.rule_for("custom_signal", priority=Priority.P3) == Rule(Priority.P3)


def test_unknown_event_type_names_it(protocol: InterruptionProtocol) -> None:
    """R24: an event type not in the table is refused, naming it and how to fix it."""
    with pytest.raises(UnknownEventType, match="mystery_event") as info:
        protocol.rule_for("mystery_event")
    assert isinstance(info.value, ConfigurationError)
    assert "priority=" in str(info.value)


@pytest.mark.parametrize("bad", [5, -1, 99, "urgent"])
def test_bad_priority_in_overrides_is_a_configuration_error(bad: object) -> None:
    """R4, R24: priorities are P0-P4; anything else is a configuration error naming the type."""
    with pytest.raises(ConfigurationError, match="my_event"):
        InterruptionProtocol({"my_event": bad})  # type: ignore[dict-item]


@pytest.mark.parametrize("bad", [5, -1])
def test_bad_explicit_priority_is_a_configuration_error(protocol: InterruptionProtocol, bad: int) -> None:
    """R4: an explicit priority outside P0-P4 is refused."""
    with pytest.raises(ConfigurationError, match="user_message"):
        protocol.rule_for("user_message", priority=bad)


def test_bad_priority_inside_a_rule_is_a_configuration_error() -> None:
    """R4, R24: a Rule override is validated like a bare priority (P0-P4 only)."""
    with pytest.raises(ConfigurationError, match="my_event"):
        InterruptionProtocol({"my_event": Rule(9)})  # type: ignore[arg-type]


def test_table_is_a_copy(protocol: InterruptionProtocol) -> None:
    """R24: the table can be shown without being changed behind the protocol's back."""
    table = protocol.table()
    assert table["cancel"] == Rule(Priority.P0)
    table["cancel"] = Rule(Priority.P4)
    assert protocol.rule_for("cancel").priority is Priority.P0

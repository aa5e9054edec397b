"""R1, R3, R4, R10, R12, R17, R26, E1: the model-agent conformance suite over ``CrewAIAgent``,
in-process and with worker processes SIGKILLed at every failpoint (issue 31). CrewAI pins
what other extras need otherwise, so the tests of this folder run in its own environment
(``.ci/crewai-venv``) and are skipped where CrewAI is not installed."""

from __future__ import annotations

import pytest

pytest.importorskip("crewai", reason="CrewAI runs in its own environment: .ci/crewai-venv")

from tether.testing.agents import AgentConformance, AgentKillConformance
from tether.testing.agents_crewai import CREWAI
from tether.testing.agents_world import AdapterCase

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def case() -> AdapterCase:
    return CREWAI


class TestCrewAI(AgentConformance):
    """Every property of the suite, for the CrewAI adapter."""


class TestCrewAIKilled(AgentKillConformance):
    """Worker processes running the crew, SIGKILLed at each failpoint."""

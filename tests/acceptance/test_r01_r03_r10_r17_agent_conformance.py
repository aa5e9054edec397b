"""R1, R3, R4, R10, R12, R17, R26, E1: the model-agent conformance suite, in-process, over every
model adapter tether ships (ChatAgent, PydanticAIAgent, OpenAIAgentsAgent), each talking to
``tether.testing.fake_openai`` over HTTP through its own client. The suite is
``tether.testing.agents``; adapter authors run it the same way over their own case."""

from __future__ import annotations

import pytest

from tether.testing.agents import TETHER_CASES, AdapterCase, AgentConformance

pytestmark = pytest.mark.timeout(120)

KNOWN_BUGS: dict[tuple[str, str], str] = {}
"""Properties an adapter fails today, each named by its bug: strict, so a fix shows."""


@pytest.fixture(params=TETHER_CASES, ids=str)
def case(request: pytest.FixtureRequest) -> AdapterCase:
    param: AdapterCase = request.param
    bug = KNOWN_BUGS.get((param.name, request.node.originalname))
    if bug:
        request.applymarker(pytest.mark.xfail(strict=True, reason=bug))
    return param


class TestTetherAdapters(AgentConformance):
    """Every property of the suite, for each of tether's model adapters."""

"""A conformance suite for model agents: every adapter (tether's, or yours) must pass it.

It is one suite, parametrised over adapters, as :mod:`tether.store.conformance` is over
stores. Describe your adapter with an :class:`AdapterCase`: a module-level ``build(harness,
shop, endpoint)`` that registers your agent as :data:`AGENT` with the model at
``endpoint.url`` and the shop's two tools (see :mod:`tether.testing.agents_world`). Then
subclass the suites in your tests and give them a ``case`` fixture::

    import pytest
    from tether.testing.agents import AdapterCase, AgentConformance, AgentKillConformance

    def build(h, shop, endpoint):          # in an importable module (workers import it)
        ...                                # h.add_agent(AGENT, MyAgent(..., endpoint.openai_client()))

    MINE = AdapterCase("mine", build, preload=("my_framework",))

    @pytest.fixture(params=[MINE], ids=str)
    def case(request):
        return request.param

    class TestMine(AgentConformance): ...          # in-process: P0, P1, approvals, hooks, bounds
    class TestMineKilled(AgentKillConformance): ...  # worker processes SIGKILLed

The model is :class:`tether.testing.fake_openai.FakeOpenAI`, a real HTTP server of the chat
completions API, so a case wires its framework's own OpenAI client to it (best
:meth:`Endpoint.openai_client`: the P0 test watches that client's wire to know streamed text
arrived). tether's own cases are :data:`CHAT`, :data:`PYDANTIC_AI`, :data:`OPENAI_AGENTS`,
:data:`LANGCHAIN` (a ``create_agent`` agent), :data:`LANGGRAPH` (a hand-built graph) and
:data:`ADK` (a Google ADK ``LlmAgent``) (:data:`TETHER_CASES`).
"""

from tether.testing.agents_cases import (
    ADK,
    CHAT,
    LANGCHAIN,
    LANGGRAPH,
    OPENAI_AGENTS,
    PYDANTIC_AI,
    TETHER_CASES,
)
from tether.testing.agents_kills import KILL_POINTS, AgentKillConformance, KillPoint, KillRun
from tether.testing.agents_suite import AgentConformance
from tether.testing.agents_world import (
    AGENT,
    PROPERTIES,
    AdapterCase,
    Build,
    Endpoint,
    Ledger,
    Shop,
    Wire,
)

__all__ = ["ADK", "AGENT", "CHAT", "KILL_POINTS", "LANGCHAIN", "LANGGRAPH", "OPENAI_AGENTS", "PROPERTIES",
           "PYDANTIC_AI", "TETHER_CASES", "AdapterCase", "AgentConformance",
           "AgentKillConformance", "Build", "Endpoint", "KillPoint", "KillRun", "Ledger", "Shop",
           "Wire"]

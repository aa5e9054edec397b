"""The conformance cases of tether's own model adapters: ``ChatAgent``, ``PydanticAIAgent`` and
``OpenAIAgentsAgent``, each talking to the fake model through its own client (the official
``openai`` client under each framework's OpenAI model), as a user wires them.

Each ``build`` imports its framework when called, so this module imports without the extras.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tether as tt
from tether.testing.agents_world import AGENT, AdapterCase, Endpoint, Shop

if TYPE_CHECKING:
    import agents
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models.function import AgentInfo

__all__ = ["ADK", "CHAT", "LANGCHAIN", "LANGGRAPH", "OPENAI_AGENTS", "PYDANTIC_AI", "TETHER_CASES"]


# ---------------------------------------------------------------------------- ChatAgent


def build_chat(h: tt.Harness, shop: Shop, endpoint: Endpoint) -> None:
    """``ChatAgent`` with two tether tools. It has no non-streaming model of its own: a server
    that cannot stream is the model that cannot, and the agent is built the same way."""
    from tether.agents.chat import ChatAgent

    @h.tool(idempotent=True)
    async def lookup(ctx: tt.ToolContext, order: str) -> dict[str, Any]:
        """Look an order up."""
        return await shop.lookup(ctx, order)

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, order: str, amount: int) -> str:
        """Refund an order."""
        return await shop.refund(ctx, order, amount)

    if shop.reconcile:
        refund.reconcile(shop.find_refund)
    h.add_agent(AGENT, ChatAgent("fake-model", client=endpoint.openai_client(),
                                 tools=[lookup, refund]))


CHAT = AdapterCase(
    "chat", build_chat, preload=("tether.agents.chat",),
    not_applicable={"approvals": "ChatAgent has no tool approval: a tether tool cannot"
                                 " require one, and the model's calls run as planned"})


# ---------------------------------------------------------------------------- PydanticAI


def build_pydantic_ai(h: tt.Harness, shop: Shop, endpoint: Endpoint) -> None:
    """A ``pydantic_ai.Agent`` on PydanticAI's OpenAI chat model; when the model cannot
    stream, a ``FunctionModel`` without ``stream_function`` (as PydanticAI's docs write
    them) whose function sends that chat model's plain request."""
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from tether.integrations.pydantic_ai import PydanticAIAgent, current_call

    chat = OpenAIChatModel("fake-model",
                           provider=OpenAIProvider(openai_client=endpoint.openai_client()))

    async def plain(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return await chat.request(messages, info.model_settings, info.model_request_parameters)

    agent: Agent[None, str] = Agent(chat if endpoint.can_stream else FunctionModel(plain),
                                    name=AGENT)

    @agent.tool_plain
    async def lookup(order: str) -> dict[str, Any]:
        """Look an order up."""
        return await shop.lookup(current_call(), order)

    @agent.tool_plain(requires_approval=shop.needs_approval)
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return await shop.refund(current_call(), order, amount)

    h.add_agent(AGENT, PydanticAIAgent(agent, tools={
        "lookup": tt.ToolPolicy(idempotent=True),
        "refund": tt.ToolPolicy(side_effect=True,
                                reconcile=shop.find_refund if shop.reconcile else None)}))


PYDANTIC_AI = AdapterCase(
    "pydantic_ai", build_pydantic_ai,
    preload=("tether.integrations.pydantic_ai", "pydantic_ai.models.openai",
             "pydantic_ai.providers.openai"))


# ---------------------------------------------------------------------------- Agents SDK


def build_openai_agents(h: tt.Harness, shop: Shop, endpoint: Endpoint) -> None:
    """An ``agents.Agent`` on the SDK's ``OpenAIChatCompletionsModel``; when the model cannot
    stream, a model that implements only ``get_response`` (what ``Runner.run`` calls)."""
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, function_tool

    from tether.integrations.openai_agents import OpenAIAgentsAgent, current_call

    @function_tool(failure_error_function=None)  # tether sees the tool's errors
    async def lookup(order: str) -> dict[str, Any]:
        """Look an order up."""
        return await shop.lookup(current_call(), order)

    @function_tool(failure_error_function=None)
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return await shop.refund(current_call(), order, amount)

    chat = OpenAIChatCompletionsModel("fake-model", openai_client=endpoint.openai_client())
    model = chat if endpoint.can_stream else _unstreamed(chat)
    agent = Agent(name=AGENT, model=model, tools=[lookup, refund])
    h.add_agent(AGENT, OpenAIAgentsAgent(agent, run_config=RunConfig(tracing_disabled=True), tools={
        "lookup": tt.ToolPolicy(idempotent=True),
        "refund": tt.ToolPolicy(side_effect=True,
                                reconcile=shop.find_refund if shop.reconcile else None)}))


def _unstreamed(inner: agents.Model) -> agents.Model:
    """An SDK model that answers plain requests only, as a model without streaming does."""
    import agents

    class Unstreamed(agents.Model):
        async def get_response(self, *args: Any, **kwargs: Any) -> agents.ModelResponse:
            return await inner.get_response(*args, **kwargs)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("this model cannot stream")

    return Unstreamed()


OPENAI_AGENTS = AdapterCase(
    "openai_agents", build_openai_agents, preload=("tether.integrations.openai_agents",),
    not_applicable={"approvals": "OpenAIAgentsAgent refuses the SDK's needs_approval tools"
                                 " when it is made (not mapped yet; guide section 13)"})

# ---------------------------------------------------------------------------- LangChain


def _langchain_shop(shop: Shop, endpoint: Endpoint) -> tuple[list[Any], Any]:
    """The shop's two tools as LangChain tools, and ``langchain-openai``'s ``ChatOpenAI`` on
    the endpoint; when the model cannot stream, ``disable_streaming=True`` (LangChain's own
    switch)."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from tether.integrations.langchain import current_call

    @tool
    async def lookup(order: str) -> dict[str, Any]:
        """Look an order up."""
        return await shop.lookup(current_call(), order)

    @tool
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return await shop.refund(current_call(), order, amount)

    model = ChatOpenAI(model="fake-model", base_url=endpoint.url, api_key="none",  # type: ignore[arg-type]
                       max_retries=0, http_async_client=endpoint.http_client(),
                       disable_streaming=not endpoint.can_stream, stream_usage=True)
    return [lookup, refund], model


def _langchain_policies(shop: Shop) -> dict[str, tt.ToolPolicy]:
    return {"lookup": tt.ToolPolicy(idempotent=True),
            "refund": tt.ToolPolicy(side_effect=True,
                                    reconcile=shop.find_refund if shop.reconcile else None)}


def build_langchain(h: tt.Harness, shop: Shop, endpoint: Endpoint) -> None:
    """A ``create_agent`` agent; approvals through LangChain's ``HumanInTheLoopMiddleware``."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware, HumanInTheLoopMiddleware

    from tether.integrations.langchain import LangChainAgent

    tools, model = _langchain_shop(shop, endpoint)
    middleware: list[AgentMiddleware[Any, Any]] = [
        HumanInTheLoopMiddleware(interrupt_on={"refund": True})] if shop.needs_approval else []
    agent = create_agent(model, tools=tools, middleware=middleware, name=AGENT)
    h.add_agent(AGENT, LangChainAgent(agent, tools=_langchain_policies(shop)))


LANGCHAIN = AdapterCase(
    "langchain", build_langchain,
    preload=("tether.integrations.langchain", "langchain_openai", "langchain.agents"))


def build_langgraph(h: tt.Harness, shop: Shop, endpoint: Endpoint) -> None:
    """A hand-built LangGraph ReAct graph, as LangGraph's tutorials write it: a node asking
    ``ChatOpenAI.bind_tools``, a ``ToolNode`` and ``tools_condition`` between them."""
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    from tether.integrations.langchain import LangChainAgent

    tools, chat = _langchain_shop(shop, endpoint)
    model = chat.bind_tools(tools)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    h.add_agent(AGENT, LangChainAgent(graph.compile(), tools=_langchain_policies(shop)))


LANGGRAPH = AdapterCase(
    "langgraph", build_langgraph,
    preload=("tether.integrations.langchain", "langchain_openai", "langgraph.prebuilt"),
    not_applicable={"approvals": "a hand-built graph asks a person through LangGraph's"
                                 " interrupt(), which needs a checkpointer; tether maps"
                                 " create_agent's HumanInTheLoopMiddleware (the langchain case)"})


# ---------------------------------------------------------------------------- Google ADK


def build_adk(h: tt.Harness, shop: Shop, endpoint: Endpoint) -> None:
    """An ADK ``LlmAgent`` with two plain function tools (the refund made with ADK's
    ``require_confirmation`` when it needs approval), its model asking the fake through
    the ``openai`` client (:class:`tether.integrations.adk_openai.OpenAIChatLlm`: a server that
    cannot stream is asked plainly, as a model that cannot stream answers)."""
    from google.adk.agents import LlmAgent
    from google.adk.tools.function_tool import FunctionTool

    from tether.integrations.adk import ADKAgent
    from tether.integrations.adk_openai import OpenAIChatLlm

    async def lookup(order: str) -> dict[str, Any]:
        """Look an order up."""
        return await shop.lookup(tt.current_call(), order)

    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return await shop.refund(tt.current_call(), order, amount)

    model = OpenAIChatLlm(model="fake-model", client=endpoint.openai_client(),
                          streams=endpoint.can_stream)
    agent = LlmAgent(name=AGENT, model=model, tools=[
        lookup, FunctionTool(refund, require_confirmation=shop.needs_approval)])
    h.add_agent(AGENT, ADKAgent(agent, tools={
        "lookup": tt.ToolPolicy(idempotent=True),
        "refund": tt.ToolPolicy(side_effect=True,
                                reconcile=shop.find_refund if shop.reconcile else None)}))


ADK = AdapterCase(
    "adk", build_adk, preload=("tether.integrations.adk", "tether.integrations.adk_openai"))

TETHER_CASES = (CHAT, PYDANTIC_AI, OPENAI_AGENTS, LANGCHAIN, LANGGRAPH, ADK)
"""Every model adapter tether ships, for ``pytest.mark.parametrize``."""

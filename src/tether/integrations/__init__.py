"""tether under the agents people already write: PydanticAI (``pydantic_ai``, extra
``pydantic-ai``), the OpenAI Agents SDK (``openai_agents``, extra ``openai-agents``) and MCP
servers' tools (``mcp``, extra ``mcp``). Each module imports its framework only when it is
imported itself, so ``pip install tether`` pulls none of them."""

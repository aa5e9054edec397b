"""tether under the agents people already write: PydanticAI (``pydantic_ai``, extra
``pydantic-ai``), MCP tools (``mcp``, extra ``mcp``). Each module imports its framework
only when imported itself, so ``pip install tether`` pulls none of them."""

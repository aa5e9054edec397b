"""Ready-made agents: :class:`ChatAgent` over any OpenAI-compatible model (the ``openai``
extra), and long-term :mod:`memory` for it."""

from tether.agents.chat import ChatAgent, ModelError
from tether.agents.memory import Memory, Recollection, SQLiteMemory

__all__ = ["ChatAgent", "Memory", "ModelError", "Recollection", "SQLiteMemory"]

"""Ready-made agents: :class:`ChatAgent` over any OpenAI-compatible model (the ``openai``
extra), how it calls models (:mod:`model_calls`: options, retries, finish reasons), and
long-term :mod:`memory` for it."""

from tether.agents.chat import ChatAgent
from tether.agents.memory import Memory, Recollection, SQLiteMemory
from tether.agents.model_calls import (
    AnswerCut,
    ContextOverflow,
    ModelError,
    ModelTimeout,
    ModelUnavailable,
    RequestOptions,
    RetryPolicy,
)

__all__ = ["AnswerCut", "ChatAgent", "ContextOverflow", "Memory", "ModelError", "ModelTimeout",
           "ModelUnavailable", "Recollection", "RequestOptions", "RetryPolicy", "SQLiteMemory"]

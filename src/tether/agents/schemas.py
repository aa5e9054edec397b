"""Tool schemas for a model, derived from the registered tools' type hints (no hand-written JSON).

A tool ``async def refund(ctx, order: str, amount: int = 0) -> ...`` becomes the function
schema the OpenAI API expects, with ``order`` required and ``amount`` optional, and the
docstring's first paragraph as its description. pydantic (which the ``openai`` extra
brings) turns the hints into JSON Schema, so ``list[str]``, ``Literal``, dataclasses and
pydantic models work too.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

from pydantic import create_model

from tether.errors import ConfigurationError
from tether.tools import Tool


def tool_schema(tool: Tool) -> dict[str, Any]:
    """The ``tools=[...]`` entry for one registered tool."""
    fields: dict[str, Any] = {}
    hints = typing.get_type_hints(tool.fn)
    params = list(inspect.signature(tool.fn).parameters.values())[1:]  # skip ctx
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(f"tool {tool.name!r}: *args/**kwargs cannot be described to"
                                     " a model; name every argument")
        if param.name not in hints:
            raise ConfigurationError(f"tool {tool.name!r}: argument {param.name!r} needs a type"
                                     " hint so the model knows what to send")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hints[param.name], default)
    schema = create_model(f"{tool.name}_args", **fields).model_json_schema()
    schema.pop("title", None)
    doc = inspect.getdoc(tool.fn) or ""
    return {"type": "function", "function": {
        "name": tool.name, "description": doc.split("\n\n")[0], "parameters": schema}}

"""An ADK model for any OpenAI-compatible chat server (vLLM, llama.cpp, Ollama, OpenAI), as
ADK's LiteLLM bridge does for such servers, without LiteLLM (extra ``google-adk``). Gemini
models need none of this: give ``LlmAgent`` the model's name. The README's ADK program, the
``--fake`` example and the ADK case of the model-agent conformance suite run on it.

It turns ADK's request (system instruction, contents, function declarations) into a chat
completion request, and the answer (text, tool calls, usage) into ADK's ``LlmResponse``; when
ADK asks for a streamed answer and the server streams, each piece of text is a partial
response, then the whole answer. A function response whose only field is ``result`` is sent
as that value (a string as it is), as a tool message's content.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types
from openai import AsyncOpenAI
from pydantic import ConfigDict


class OpenAIChatLlm(BaseLlm):
    """``model``: the chat model's name; ``client``: an ``openai.AsyncOpenAI``; ``streams``:
    whether the server streams (a server that cannot is asked plainly, whatever ADK asks)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    client: AsyncOpenAI
    streams: bool = True

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False
                                     ) -> AsyncGenerator[LlmResponse, None]:
        body = _request(self.model, llm_request)
        if not (stream and self.streams):
            answer = await self.client.chat.completions.create(**body)
            message = answer.choices[0].message
            made = [(c.id, c.function.name, c.function.arguments)
                    for c in message.tool_calls or [] if c.type == "function"]
            yield _response(message.content or "", made, answer.usage)
            return
        text: list[str] = []
        calls: dict[int, list[str]] = {}
        usage = None
        chunks = await self.client.chat.completions.create(
            **body, stream=True, stream_options={"include_usage": True})
        async for chunk in chunks:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                delta = choice.delta
                if delta.content:
                    text.append(delta.content)
                    yield LlmResponse(content=types.Content(
                        role="model", parts=[types.Part(text=delta.content)]), partial=True)
                for call in delta.tool_calls or []:
                    got = calls.setdefault(call.index, ["", "", ""])
                    got[0] = call.id or got[0]
                    if call.function is not None:
                        got[1] += call.function.name or ""
                        got[2] += call.function.arguments or ""
        yield _response("".join(text), [tuple(c) for c in calls.values()], usage)


def _request(model: str, request: LlmRequest) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    config = request.config
    system = config.system_instruction if config is not None else None
    if system:
        messages.append({"role": "system", "content": _text_of(system)})
    for content in request.contents:
        messages += _messages(content)
    tools = [{"type": "function", "function": {
        "name": d.name, "description": d.description or "",
        "parameters": d.parameters_json_schema or _schema(d.parameters)}}
        for tool in (config.tools or [] if config is not None else [])
        for d in (getattr(tool, "function_declarations", None) or [])]
    return {"model": model, "messages": messages, **({"tools": tools} if tools else {})}


def _messages(content: types.Content) -> list[dict[str, Any]]:
    parts = content.parts or []
    if content.role == "model":
        text = "".join(p.text for p in parts if p.text)
        calls = [{"id": p.function_call.id, "type": "function", "function": {
            "name": p.function_call.name, "arguments": json.dumps(p.function_call.args or {})}}
            for p in parts if p.function_call is not None]
        return [{"role": "assistant", "content": text or None,
                 **({"tool_calls": calls} if calls else {})}]
    said = [{"role": "tool", "tool_call_id": p.function_response.id,
             "content": _tool_content(p.function_response.response)}
            for p in parts if p.function_response is not None]
    return [*said, *({"role": "user", "content": p.text} for p in parts if p.text)]


def _tool_content(response: dict[str, Any] | None) -> str:
    response = response or {}
    if set(response) == {"result"}:
        value = response["result"]
        return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(response)


def _schema(schema: types.Schema | None) -> dict[str, Any]:
    if schema is None:
        return {"type": "object", "properties": {}}
    plain = schema.model_dump(mode="json", exclude_none=True)
    lowered: dict[str, Any] = json.loads(json.dumps(plain).replace('"type": "OBJECT"',
                                                                   '"type": "object"'))
    return lowered


def _text_of(value: Any) -> str:
    if isinstance(value, types.Content):
        return "".join(p.text or "" for p in value.parts or [])
    return str(value)


def _response(text: str, calls: list[Any], usage: Any) -> LlmResponse:
    parts = [types.Part(text=text)] if text else []
    for call_id, name, arguments in calls:
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            args = {"_unparsed_arguments": arguments}
        parts.append(types.Part(function_call=types.FunctionCall(id=call_id, name=name,
                                                                 args=args)))
    meta = None if usage is None else types.GenerateContentResponseUsageMetadata(
        prompt_token_count=usage.prompt_tokens, candidates_token_count=usage.completion_tokens)
    return LlmResponse(content=types.Content(role="model", parts=parts), turn_complete=True,
                       usage_metadata=meta)

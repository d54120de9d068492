"""The reference our chat backend is held to: the same request sent the `openai` client's
typed way (`chat.completions.create(messages=...)`), which checks every message against the
SDK's schema before sending. Shared by tests/test_openai_request.py and bench/request_body.py.
"""

from __future__ import annotations

from typing import Any

import openai

from waystation.activities.chat import to_openai_messages
from waystation.workflows.models import ChatMessage

# A tool offered to the model in requests built by hand.
CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "arithmetic",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


async def typed_stream(
    client: openai.AsyncOpenAI,
    model: str,
    messages: list[ChatMessage],
    tools: list[dict[str, Any]],
    **options: Any,
) -> None:
    """Stream one completion through the typed `create`, to its end."""
    create: Any = client.chat.completions.create
    stream = await create(
        model=model,
        messages=to_openai_messages(messages),
        tools=tools,
        stream=True,
        stream_options={"include_usage": True},
        **options,
    )
    async for _ in stream:
        pass

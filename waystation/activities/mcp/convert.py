"""From the MCP SDK's models to ours: a server's tool listing, a call's result as text.

The SDK's models drift between protocol revisions; nothing of theirs leaves this module.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import mcp_types

from waystation.settings.mcp_servers import McpServerConfig
from waystation.workflows.tool_catalog import (
    McpServerTools,
    McpToolHints,
    McpToolSpec,
    cap_description,
    default_policy,
    exposed_name,
    fingerprint,
)


def server_tools(
    server: str, config: McpServerConfig, tools: list[mcp_types.Tool]
) -> McpServerTools:
    """A server's listing as catalog entries, with the settings' overrides applied."""
    specs: list[McpToolSpec] = []
    notes: list[str] = []
    taken: set[str] = set()
    for tool in tools:
        if not tool.name:
            notes.append("a tool without a name was left out")
            continue
        if tool.execution is not None and tool.execution.task_support == "required":
            notes.append(
                f"tool {tool.name!r} was left out: it runs only as an MCP task "
                "(execution.taskSupport: required), which waystation does not support"
            )
            continue
        name = exposed_name(server, tool.name)
        if name in taken:
            notes.append(f"tool {tool.name!r} was left out: its name {name!r} is taken")
            continue
        taken.add(name)
        if name != f"{server}__{tool.name}":
            notes.append(f"tool {tool.name!r} is offered as {name!r} (OpenAI function names)")
        specs.append(tool_spec(server, config, tool, name))
    return McpServerTools(server=server, tools=specs, notes=notes, fingerprint=fingerprint(specs))


def tool_spec(server: str, config: McpServerConfig, tool: mcp_types.Tool, name: str) -> McpToolSpec:
    annotations = tool.annotations
    hints = McpToolHints(
        title=(annotations.title if annotations else None) or tool.title,
        read_only_hint=annotations.read_only_hint if annotations else None,
        destructive_hint=annotations.destructive_hint if annotations else None,
        idempotent_hint=annotations.idempotent_hint if annotations else None,
        open_world_hint=annotations.open_world_hint if annotations else None,
    )
    approval, retry_safe = default_policy(hints)
    override_approval = config.approval_for(tool.name)
    override_retry = config.retry_safe_for(tool.name)
    return McpToolSpec(
        name=name,
        server=server,
        tool=tool.name,
        description=cap_description(tool.description or tool.title or ""),
        input_schema=parameters_schema(tool.input_schema),
        hints=hints,
        approval=override_approval if override_approval is not None else approval,
        retry_safe=override_retry if override_retry is not None else retry_safe,
        timeout_seconds=config.call_timeout_seconds,
    )


def parameters_schema(schema: dict[str, Any] | None) -> dict[str, Any]:
    """The tool's input schema as OpenAI function parameters (always an object schema)."""
    parameters = dict(schema or {})
    parameters.setdefault("type", "object")
    if parameters["type"] == "object":
        parameters.setdefault("properties", {})
    return parameters


def result_text(result: mcp_types.CallToolResult) -> str:
    """What the model reads: text content joined; other content summarised in one line."""
    parts = [content_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts) if parts else "(no output)"


def content_text(block: Any) -> str:
    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        kind = "image" if isinstance(block, mcp_types.ImageContent) else "audio"
        return f"[{kind}: {block.mime_type}, {_decoded_size(block.data)} bytes, not shown]"
    if isinstance(block, mcp_types.ResourceLink):
        return f"[resource link: {block.name} <{block.uri}>]"
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, mcp_types.TextResourceContents):
            return f"[resource <{resource.uri}>]\n{resource.text}"
        mime = resource.mime_type or "binary"
        size = _decoded_size(resource.blob)
        return f"[resource <{resource.uri}>: {mime}, {size} bytes, not shown]"
    return f"[{getattr(block, 'type', type(block).__name__)} content, not shown]"


def _decoded_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data)

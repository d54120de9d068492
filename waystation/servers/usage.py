"""A task's tokens as the HTTP API and MCP show them: the counts, and the cache-hit ratio."""

from __future__ import annotations

from pydantic import BaseModel, Field

from waystation.workflows.models import Usage


class TaskUsage(BaseModel):
    """Tokens of a task (its sub-agents' included). `input_tokens` counts all input, cached
    included; `reasoning_tokens` are among `output_tokens`."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int = Field(description="Input tokens the prompt cache served.")
    cache_write_tokens: int = Field(description="Input tokens written to the prompt cache.")
    reasoning_tokens: int
    cache_hit_ratio: float | None = Field(
        description="cache_read_tokens / input_tokens (null before any input)."
    )

    @classmethod
    def of(cls, usage: Usage) -> TaskUsage:
        return cls(**usage.model_dump(), cache_hit_ratio=usage.cache_hit_ratio)

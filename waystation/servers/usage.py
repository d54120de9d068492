"""A task's tokens as the HTTP API and MCP show them: the counts, the cache-hit ratio, and
what the priced calls cost."""

from __future__ import annotations

from pydantic import BaseModel, Field, computed_field

from waystation.workflows.models import Usage


class TaskUsage(BaseModel):
    """Tokens of a task (its sub-agents' included). `input_tokens` counts all input, cached
    included; `reasoning_tokens` are among `output_tokens`. `cost_usd` is what its calls of
    priced models cost (null: none was priced, never a made-up 0); `unpriced_tokens` are the
    tokens of the calls of models without a price."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int = Field(description="Input tokens the prompt cache served.")
    cache_write_tokens: int = Field(description="Input tokens written to the prompt cache.")
    reasoning_tokens: int
    cost_usd: float | None = Field(
        default=None, description="US dollars of the calls of priced models (null: none)."
    )
    unpriced_tokens: int = Field(
        default=0, description="Tokens of the calls of models the task has no price for."
    )

    @computed_field(  # type: ignore[prop-decorator]  # pydantic reads the property
        description="cache_read_tokens / input_tokens (null before any input)."
    )
    @property
    def cache_hit_ratio(self) -> float | None:
        return Usage(**self.model_dump(exclude={"cache_hit_ratio"})).cache_hit_ratio

    @classmethod
    def of(cls, usage: Usage) -> TaskUsage:
        return cls(**usage.model_dump())

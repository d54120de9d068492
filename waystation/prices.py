"""What a model's tokens cost: the price table settings declare and tasks carry.

A leaf beside vocabulary.py (it imports nothing of waystation), kept apart from it because it
needs pydantic, which `ws --help` must not load.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

TOKENS_PER_PRICE_UNIT = 1_000_000
"""Prices are in US dollars per million tokens, as providers list them."""


class ModelPrice(BaseModel):
    """What one model's tokens cost, in US dollars per million tokens. Declared on a model
    endpoint (settings) and copied into each task as it is created (workflows), so a price
    changed later never changes what a running task's replay computes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0, le=1_000_000, description="Input tokens not read from a cache.")
    output: float = Field(ge=0, le=1_000_000, description="Output tokens, reasoning included.")
    cached_input: float | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="Input read from the prompt cache (default: input).",
    )
    cache_write: float | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="Input written to the prompt cache (default: input).",
    )

    def cost(
        self, input_tokens: int, output_tokens: int, cache_read: int, cache_write: int
    ) -> float:
        """US dollars for one call's tokens; `input_tokens` counts the cached ones too."""
        uncached = max(0, input_tokens - cache_read - cache_write)
        read_price = self.input if self.cached_input is None else self.cached_input
        write_price = self.input if self.cache_write is None else self.cache_write
        micro = (
            uncached * self.input
            + cache_read * read_price
            + cache_write * write_price
            + output_tokens * self.output
        )
        return micro / TOKENS_PER_PRICE_UNIT

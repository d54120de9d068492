"""The client side: AgentRuntime, streaming, settings, the embedded Temporal server."""

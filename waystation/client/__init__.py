"""The client: AgentRuntime and what it reads from Temporal (tasks, streams, trees, health)."""

"""MCP servers the tests connect to (real servers, written with the mcp SDK)."""

"""The servers in front of the client: the HTTP API with its web console, and the MCP server."""

"""MCP failures of our own, in a module that does not import the `mcp` package."""


class McpServerUnavailable(Exception):
    """The server could not be started, reached or listed; the message says why."""

"""Tools from MCP servers: configuration, the tool catalog, connections and activities.

`config` and `catalog` are plain pydantic (no MCP SDK import), so settings and workflow
code may import them; `manager` owns the connections and `activities` the Temporal side.
"""

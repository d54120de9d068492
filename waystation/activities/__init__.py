"""All I/O: the LLM call, tools, and publishing tokens."""

"""A program configured as an MCP server that does not speak MCP: it writes lines that are
not JSON-RPC to stdout, as a misconfigured command or a server that logs to stdout does.

    python tests/mcp_servers/not_mcp.py          # a line every 50 ms, forever
    python tests/mcp_servers/not_mcp.py --exit   # a few lines, then exit 1

It imports nothing heavy, so its first line comes at once.
"""

from __future__ import annotations

import itertools
import sys
import time

LINE = "demo server: listening on stdio (this line is not MCP)"
LINES_BEFORE_EXIT = 20


def main() -> None:
    exits = "--exit" in sys.argv
    for written in itertools.count(1):
        print(LINE, flush=True)
        if exits and written == LINES_BEFORE_EXIT:
            sys.exit(1)
        if not exits:
            time.sleep(0.05)


if __name__ == "__main__":
    main()

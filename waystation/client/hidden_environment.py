"""Blank this process's starting environment where other processes of its user read it.

A shell command a task runs gets a minimal environment, but it runs as the worker's user,
and Linux shows that user every process's starting environment at /proc/<pid>/environ: the
model API key, the database URL, the tokens (`cat /proc/$PPID/...`). So once its settings
are read, a worker (and every `ws` command, which may host one) moves its environment to
memory of its own and overwrites the starting block, which is all that file shows. Nothing
else changes: os.environ and getenv read the same values, and children inherit them.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

logger = logging.getLogger("waystation")

# Fields of /proc/<pid>/stat after the command's closing parenthesis: the state is field 3,
# env_start and env_end are fields 50 and 51 (proc(5)).
_ENV_START_FIELD, _ENV_END_FIELD = 50 - 3, 51 - 3


def hide_starting_environment() -> bool:
    """Overwrite the block /proc/self/environ reads with zeros; False where it cannot be."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        stat = Path("/proc/self/stat").read_bytes()
        fields = stat[stat.rindex(b")") + 2 :].split()
        start, end = int(fields[_ENV_START_FIELD]), int(fields[_ENV_END_FIELD])
    except (OSError, ValueError, IndexError):
        return False
    # setenv copies each entry to the heap: the C environment no longer points into the block.
    for name, value in os.environ.items():
        os.putenv(name, value)
    try:
        with open("/proc/self/mem", "r+b", buffering=0) as memory:
            memory.seek(start)
            memory.write(bytes(end - start))
    except OSError as err:  # a kernel or sandbox that refuses writes to its own memory
        logger.warning("could not blank this process's starting environment: %s", err)
        return False
    return True

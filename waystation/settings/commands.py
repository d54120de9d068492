"""The commands hints tell a person to type, spelled so that they work as printed.

`ws` is the installed command (pyproject's `[project.scripts]`). A hint says `ws ...` when
that is the `ws` of this installation on PATH; otherwise (a virtual environment that is
not activated, say) it gives the script's path, which works from any folder.
"""

from __future__ import annotations

import functools
import shlex
import shutil
import sys
from pathlib import Path


@functools.cache
def ws() -> str:
    """How to type this installation's `ws` command here."""
    installed = Path(sys.executable).parent / "ws"
    found = shutil.which("ws")
    if not installed.is_file():
        return "ws"  # not installed beside this Python: the one on PATH, if any
    if found is not None and Path(found).resolve() == installed.resolve():
        return "ws"
    return shlex.quote(str(installed.absolute()))


def command(*words: str) -> str:
    """A `ws` command line, each word quoted for a POSIX shell where it needs it."""
    return " ".join([ws(), *(shlex.quote(word) for word in words)])

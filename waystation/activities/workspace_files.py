"""Files of the workspace, opened so that no link leads a tool out of it.

A path is resolved (links followed) and checked, then opened one component at a time from
the workspace's own directory with `O_NOFOLLOW`: a link swapped in between the check and
the open is refused, not followed. Only regular files are opened, without blocking (a
FIFO planted in the workspace would hang an open for writing forever). Everything here
blocks: the tools call it through `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from waystation.activities.tools import SCRATCH_DIR, ToolError, names_scratch

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class WorkspacePath:
    """A path of the workspace as it resolved: its root and the components below it."""

    root: Path
    parts: tuple[str, ...]
    asked: str
    """The path as the model gave it, for messages."""
    sole_name: bool = False
    """The file must have no other name (hard link) than this one: a write under scratch/
    must not change a file that also lives elsewhere."""

    @property
    def shown(self) -> str:
        return "/".join(self.parts) or "."


def locate(workspace: Path, path: str, *, writing: bool = False) -> WorkspacePath:
    """`path` resolved inside the workspace; anything that leaves it is refused.

    Links are followed before the check, so a link that points out is refused too. For a
    write, a path named under scratch/ (which needs no approval) must also resolve inside
    scratch/: a link there must not carry an unapproved write elsewhere.
    """
    root = workspace.resolve()
    try:
        resolved = (root / path).resolve()
    except (OSError, RuntimeError, ValueError) as err:  # a loop of links, a NUL byte
        raise ToolError(f"path {path!r} cannot be resolved: {err}") from None
    if resolved != root and not resolved.is_relative_to(root):
        raise ToolError(f"path {path!r} is outside the workspace")
    scratch = root / SCRATCH_DIR
    if writing and names_scratch(path) and not resolved.is_relative_to(scratch):
        raise ToolError(
            f"path {path!r} leads out of {SCRATCH_DIR}/ through a link, so it was not written; "
            f"a path under {SCRATCH_DIR}/ must stay in it (write to the real path instead, "
            "which may need approval)"
        )
    sole_name = writing and names_scratch(path)
    return WorkspacePath(root, resolved.relative_to(root).parts, path, sole_name)


def open_directory(place: WorkspacePath, parts: tuple[str, ...], *, create: bool) -> int:
    """A descriptor of the folder `parts` below the root, walked without following links;
    missing folders are made when `create`."""
    fd = os.open(place.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                inner = os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
            except NotADirectoryError:
                if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, "a link") from None  # swapped in since resolved
                raise
            except FileNotFoundError:
                if not create:
                    raise ToolError(f"no {place.asked!r} in the workspace") from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                inner = os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
    except OSError as err:
        os.close(fd)
        raise _refusal(place, err) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular_file(place: WorkspacePath, flags: int, *, create_folders: bool = False) -> int:
    """A descriptor of the regular file at `place` (refused: folders, FIFOs, devices,
    sockets, and a link swapped in since `place` was resolved)."""
    if not place.parts:
        raise ToolError(f"{place.asked!r} is the workspace itself, not a file")
    folder = open_directory(place, place.parts[:-1], create=create_folders)
    try:
        fd = os.open(place.parts[-1], flags | _FILE_FLAGS, 0o644, dir_fd=folder)
    except FileNotFoundError:
        raise ToolError(f"no file {place.asked!r} in the workspace") from None
    except OSError as err:
        raise _refusal(place, err) from None
    finally:
        os.close(folder)
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode):
        os.close(fd)
        raise ToolError(f"{place.asked!r} is {_kind(found.st_mode)}, not a regular file")
    if place.sole_name and found.st_nlink > 1:
        os.close(fd)
        raise ToolError(
            f"{place.asked!r} has another name (a hard link), maybe outside {SCRATCH_DIR}/, "
            "so it was not written"
        )
    return fd


def _refusal(place: WorkspacePath, err: OSError) -> ToolError:
    if err.errno == errno.ELOOP:  # O_NOFOLLOW met a link that resolving did not see
        return ToolError(f"path {place.asked!r} changed into a link while it was opened")
    if err.errno == errno.ENOTDIR:
        return ToolError(f"{place.asked!r} is not a directory, or lies below a file")
    if err.errno == errno.EISDIR:
        return ToolError(f"{place.asked!r} is a directory")
    if err.errno == errno.ENXIO:  # opening a FIFO for writing, without blocking
        return ToolError(f"{place.asked!r} is a FIFO, not a regular file")
    return ToolError(f"cannot open {place.asked!r}: {err.strerror}")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"

"""One stream for a tree of agents: a task's own items and its sub-agents', merged by the
reader.

Each sub-agent is a task with its own stream. The parent's workflow never forwards its
children's items (its history would grow with their length): a reader follows the
parent's stream and, at each `agent_started`, the child's too, and so on down the tree,
marking each item with the task it comes from and that task's path of agent names.

The merged order keeps cause before effect: every item of a child comes before its
caller's observation of the child's answer, and a task's end comes after what its open
sub-agents had published by the time it ended (a cancelled parent's children's own
`cancelled` events come first).

The cursor of an item (its SSE id) says where the reader stands in every stream of the
tree: the parent's last offset delivered, then, for each sub-agent started and not yet
answered (its caller has not observed it), the next offset of its stream, whether that
stream has ended and the sub-agent's path. A sub-agent whose answer its caller has observed
is complete, so it leaves the cursor with everything below it: the cursor holds only the
open part of the tree, and while no sub-agent is open it is the parent's plain offset, the
same id an item has on the stream without the tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import quote, unquote

from pydantic import Field

from waystation.client.streaming import StreamGap, StreamHub, StreamItem
from waystation.workflows.agents import child_id
from waystation.workflows.events import TERMINAL_EVENT_TYPES, AgentStarted, Observation
from waystation.workflows.stream import EVENTS_TOPIC

# A child's stream is read once the child exists; its caller starts it in the workflow task
# that publishes `agent_started`, so this bound matters only for a start that never came.
CHILD_START_WAIT = timedelta(minutes=2)
# A task's end waits for its open sub-agents' heads; a head no worker tells in this time
# is taken as read already.
HEAD_TIMEOUT = timedelta(seconds=10)
# What the SSE header `Last-Event-ID` may hold: a cursor (the header's shape; parse_cursor
# checks the rest).
CURSOR_PATTERN = r"^[0-9]+(;[A-Za-z0-9%/_.~=!@,-]+)*$"
CURSOR_CHARS = 16_000
_ENTRY = re.compile(r"([A-Za-z0-9%/_.~-]+)=([0-9]+)(!?)@([A-Za-z0-9%_.~,-]+)", re.ASCII)


class TreeItem(StreamItem):
    """An item of a tree's stream: from the task followed (`path` empty) or from one of its
    sub-agents. `offset` is the item's offset in its own task's stream."""

    task_id: str = Field(description="The task whose stream the item is from.")
    path: list[str] = Field(
        default_factory=list,
        description="The agents from the task followed down to that task ([] for its own).",
    )
    cursor: str = Field(
        description="Where the tree's stream stands after this item: pass it as `after` (or "
        "send it as Last-Event-ID) to go on right after it."
    )

    @property
    def terminal(self) -> bool:
        """Only the followed task's own end ends the stream; a sub-agent's is one of its items."""
        return not self.path and super().terminal


class InvalidCursorError(ValueError):
    """A cursor that no tree stream gave out."""


@dataclass(frozen=True)
class OpenStream:
    """Where a reader stands in the stream of a sub-agent not yet answered."""

    next: int
    ended: bool
    path: tuple[str, ...]


@dataclass(frozen=True)
class TreeCursor:
    """Where a reader stands in a tree's streams: the followed task's next offset, and the
    open sub-agents' positions by their id relative to that task's (`1/call_1_0`)."""

    root_next: int
    open: dict[str, OpenStream] = field(default_factory=dict)

    def text(self) -> str:
        parts = [str(self.root_next - 1)]
        for relative, stream in self.open.items():
            names = ",".join(quote(name, safe="") for name in stream.path)
            ended = "!" if stream.ended else ""
            parts.append(f"{quote(relative, safe='/')}={stream.next}{ended}@{names}")
        return ";".join(parts)


def parse_cursor(text: str) -> TreeCursor:
    """The cursor an item's `cursor` (its SSE id) holds; a plain offset n is the cursor of
    the followed task's item n while no sub-agent is open."""
    first, *entries = text.split(";")
    if not first.isascii() or not first.isdigit():
        raise InvalidCursorError(f"not a stream cursor: {text[:80]!r}")
    open_streams: dict[str, OpenStream] = {}
    for entry in entries:
        match = _ENTRY.fullmatch(entry)
        if match is None:
            raise InvalidCursorError(f"not a stream cursor: {text[:80]!r}")
        relative, offset, ended, names = match.groups()
        path = tuple(unquote(name) for name in names.split(","))
        open_streams[unquote(relative)] = OpenStream(int(offset), ended == "!", path)
    return TreeCursor(int(first) + 1, open_streams)


_Got = StreamItem | Exception | None  # an item, a reading error, or the stream's end


@dataclass(eq=False)
class _Node:
    """One task of the tree as the reader follows it."""

    task_id: str
    path: tuple[str, ...]
    next: int
    ended: bool = False
    held: deque[_Got] = field(default_factory=deque)
    ready: Callable[[], bool] | None = None
    """While set and false, the node's next item waits (see TreeStream._hold)."""
    pump: asyncio.Task[None] | None = None


class TreeStream:
    """Follows the task `root_id` and its sub-agents from `cursor`, yielding TreeItems."""

    def __init__(
        self,
        hub: StreamHub,
        root_id: str,
        cursor: TreeCursor,
        topics: list[str] | None = None,
        *,
        wait_for_start: timedelta | None = None,
        follow: bool = False,
    ) -> None:
        self._hub = hub
        self._root_id = root_id
        self._wanted = set(topics) if topics else None
        self._wait_for_start = wait_for_start
        self._follow = follow
        self._queue: asyncio.Queue[tuple[_Node, _Got]] = asyncio.Queue()
        self._root = _Node(root_id, (), cursor.root_next)
        self._nodes: dict[str, _Node] = {root_id: self._root}
        self._seen: set[str] = set()
        for relative, stream in cursor.open.items():
            node = _Node(f"{root_id}/{relative}", stream.path, stream.next, stream.ended)
            self._nodes[node.task_id] = node
            self._seen.add(node.task_id)
        self._heads: dict[str, dict[str, int]] = {}
        self._pumps: list[asyncio.Task[None]] = []

    async def items(self) -> AsyncGenerator[TreeItem, None]:
        for node in self._nodes.values():
            if not node.ended:
                self._start(node)
        try:
            while True:
                node, got = await self._queue.get()
                if self._nodes.get(node.task_id) is not node:
                    continue  # its caller has answered: it left the tree's stream
                node.held.append(got)
                for item in await self._deliverable():
                    yield item
                if self._root.ended:
                    return
        finally:
            for pump in self._pumps:
                pump.cancel()
            for pump in self._pumps:
                with contextlib.suppress(asyncio.CancelledError):
                    await pump

    def _start(self, node: _Node) -> None:
        node.pump = asyncio.create_task(self._read(node))
        self._pumps.append(node.pump)

    async def _read(self, node: _Node) -> None:
        """Put the node's items on the queue, then its end. A sub-agent's stream is read on
        past a failure: its run waits a moment for a resumption, which goes on in it."""
        root = node is self._root
        since = node.next
        try:
            while True:
                last: StreamItem | None = None
                async for last in self._hub.subscribe(
                    node.task_id,
                    since=since,
                    wait_for_start=self._wait_for_start if root else CHILD_START_WAIT,
                    follow=self._follow and root,
                ):
                    await self._queue.put((node, last))
                if root or last is None or last.data.type != "failed":
                    break
                since = last.offset + 1
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the root's error is the stream's; a child's ends it
            await self._queue.put((node, err))
            return
        await self._queue.put((node, None))

    async def _deliverable(self) -> list[TreeItem]:
        """Every held item that may go out now, each stream in its order."""
        out: list[TreeItem] = []
        moved = True
        while moved and not self._root.ended:
            moved = False
            for node in list(self._nodes.values()):
                while node.held and self._nodes.get(node.task_id) is node:
                    if node.ready is not None and not node.ready():
                        break
                    node.ready = None
                    got = node.held[0]
                    if isinstance(got, StreamItem) and await self._hold(node, got):
                        break
                    node.held.popleft()
                    moved = True
                    item = self._take(node, got)
                    if item is not None and self._shown(item):
                        out.append(item)
                    if self._root.ended:
                        return out
        return out

    async def _hold(self, node: _Node, item: StreamItem) -> bool:
        """Whether `item` must wait: an observation of a sub-agent's answer waits for the
        sub-agent's last item; a task's end waits for what its open sub-agents had published
        when it ended (their heads, asked once)."""
        data = item.data
        if isinstance(data, Observation) and data.agent_status is not None:
            child = self._nodes.get(child_id(node.task_id, data.step, data.call_id))
            if child is not None and not child.ended:
                node.ready = lambda: child.ended or self._nodes.get(child.task_id) is not child
                return True
            return False
        if item.topic != EVENTS_TOPIC or data.type not in TERMINAL_EVENT_TYPES:
            return False
        below = [n for n in self._children_of(node) if not n.ended]
        if not below:
            return False
        key = f"{node.task_id}@{item.offset}"
        if key not in self._heads:
            self._heads[key] = {n.task_id: await self._head(n) for n in below}
        heads = self._heads[key]

        def caught_up() -> bool:
            return all(
                n.ended or n.next >= heads.get(n.task_id, 0) for n in self._children_of(node)
            )

        if caught_up():
            return False
        node.ready = caught_up
        return True

    async def _head(self, node: _Node) -> int:
        try:
            return await asyncio.wait_for(
                self._hub.head(node.task_id), HEAD_TIMEOUT.total_seconds()
            )
        except Exception:  # unreadable now: what has been read is all it waits for
            return 0

    def _children_of(self, node: _Node) -> list[_Node]:
        depth = len(node.path) + 1
        prefix = node.task_id + "/"
        return [
            n for n in self._nodes.values() if len(n.path) == depth and n.task_id.startswith(prefix)
        ]

    def _take(self, node: _Node, got: _Got) -> TreeItem | None:
        """Apply `got` to the reader's position; the item to deliver, if any."""
        if got is None or isinstance(got, Exception):
            if node is self._root and isinstance(got, Exception):
                raise got
            node.ended = True
            return None
        data = got.data
        node.next = data.end if isinstance(data, StreamGap) else got.offset + 1
        if node is self._root:
            node.ended = got.ends(self._follow)
        elif got.ends(False) and data.type != "failed":
            node.ended = True  # its own end: nothing more is read from it
        if isinstance(data, AgentStarted):
            self._open(node, data)
        elif isinstance(data, Observation) and data.agent_status is not None:
            self._close(child_id(node.task_id, data.step, data.call_id))
        return TreeItem(
            offset=got.offset,
            topic=got.topic,
            data=data,
            task_id=node.task_id,
            path=list(node.path),
            cursor=self._cursor().text(),
        )

    def _open(self, caller: _Node, started: AgentStarted) -> None:
        if started.child_id in self._seen or not started.child_id.startswith(self._root_id + "/"):
            return  # met again (a repaired step rejoins its child), or outside this tree
        self._seen.add(started.child_id)
        node = _Node(started.child_id, (*caller.path, started.agent), 0)
        self._nodes[node.task_id] = node
        self._start(node)

    def _close(self, task_id: str) -> None:
        """A sub-agent its caller observed: it and everything below it leave the stream."""
        for node in list(self._nodes.values()):
            if node.task_id == task_id or node.task_id.startswith(task_id + "/"):
                del self._nodes[node.task_id]
                if node.pump is not None:
                    node.pump.cancel()

    def _cursor(self) -> TreeCursor:
        skip = len(self._root_id) + 1
        return TreeCursor(
            self._root.next,
            {
                n.task_id[skip:]: OpenStream(n.next, n.ended, n.path)
                for n in self._nodes.values()
                if n is not self._root
            },
        )

    def _shown(self, item: TreeItem) -> bool:
        return self._wanted is None or item.topic in self._wanted or item.topic == "gap"

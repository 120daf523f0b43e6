"""One budget for the memory requests hold in a process (Kafka's `queued.max.request.bytes`).

What a peer can make the process hold beyond its sockets' buffers is reserved here before it is
held: an HTTP body while it is buffered and the request runs, a Kafka frame from the moment its
size is read until it is answered, and a compressed batch's inflated records while they are
checked; and, when they fit without waiting, what the process may do without (a Kafka fetch read
ahead, `try_hold`). A reservation that does not fit waits, first come first served, for others
to end; one that waited `COORDINATOR_QUEUED_MAX_REQUEST_WAIT_MS` is refused as `Overloaded`
(retriable), so concurrent hostile requests are served one budget at a time, never all at once,
and the process does not grow with them. A reservation larger than the whole budget is cut to
the budget (it then runs alone). The event loop is the only user: no lock is needed.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from coordinator.core.errors import CoordinatorNotAvailable


class Overloaded(CoordinatorNotAvailable):
    """The process's request memory stayed full for as long as a request may wait."""

    title = "Overloaded"


class RequestMemory:
    def __init__(self, budget: int, wait_s: float) -> None:
        self.budget = budget
        self.wait_s = wait_s
        self.used = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @asynccontextmanager
    async def reserve(self, size: int) -> AsyncIterator[None]:
        """Hold `size` bytes of the budget for the block (waiting for them if need be)."""
        release = await self.hold(size)
        try:
            yield
        finally:
            release()

    async def hold(self, size: int) -> Callable[[], None]:
        """Hold `size` bytes of the budget (waiting for them if need be) until the function
        returned is called; later calls of it do nothing. For a holder that is not a block
        (a request answered by a task of its own)."""
        size = max(0, min(size, self.budget))
        if size == 0:  # a request without a body: nothing to hold, nothing to wait for
            return _nothing
        await self._acquire(size)
        return self._releaser(size)

    def try_hold(self, size: int) -> Callable[[], None] | None:
        """Hold `size` bytes now if they fit and nobody waits for memory, else None: for what
        the process may do without (a fetch read ahead), which never makes a request wait."""
        if self._waiting or self.used + size > self.budget:
            return None
        self.used += size
        return self._releaser(size)

    def _releaser(self, size: int) -> Callable[[], None]:
        """What gives `size` held bytes back, once."""
        held = [size]

        def release() -> None:
            if held:
                self.used -= held.pop()
                self._grant()

        return release

    async def _acquire(self, size: int) -> None:
        if not self._waiting and self.used + size <= self.budget:
            self.used += size
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, granted)
        self._waiting.append(entry)
        try:
            async with asyncio.timeout(self.wait_s):
                await asyncio.shield(granted)
        except BaseException as exc:
            if granted.done() and not granted.cancelled():
                if isinstance(exc, TimeoutError):
                    return  # granted as the wait ran out: it is held
                self.used -= size  # granted, then cancelled: give it back
            else:
                granted.cancel()
                self._waiting.remove(entry)
            self._grant()  # a smaller request behind this one may fit now
            if isinstance(exc, TimeoutError):
                raise Overloaded(
                    f"the request memory of this process ({self.budget} bytes, "
                    "COORDINATOR_QUEUED_MAX_REQUEST_BYTES) stayed full for "
                    f"{self.wait_s:g} s; retry shortly"
                ) from None
            raise

    def _grant(self) -> None:
        """Wake the waiters at the head of the line that fit, in order."""
        while self._waiting:
            size, granted = self._waiting[0]
            if self.used + size > self.budget:
                return
            self._waiting.popleft()
            self.used += size
            granted.set_result(None)


def _nothing() -> None:
    pass


# The process's budget, set by `configure` when the app is built (the doors and the domains of
# one process share it); a generous default until then (in-process tests, tools).
_memory = RequestMemory(1 << 30, 30.0)


def configure(budget: int, wait_s: float) -> None:
    global _memory
    _memory = RequestMemory(budget, wait_s)


def request_memory() -> RequestMemory:
    return _memory

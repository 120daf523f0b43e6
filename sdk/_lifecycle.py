"""The lifecycle every SDK client shares: usable until `close()` (closing again does nothing),
a context manager that closes on exit, and `IllegalStateError` naming the client once closed."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import ClassVar, Self

from sdk._errors import IllegalStateError


class Closeable:
    """A client's open/closed state. Subclasses name themselves in `_what` ("the consumer"),
    call `_close_once` from their `close`, and `_check_open` before each call."""

    _what: ClassVar[str]
    _closed: bool = False

    def _close_once(self, release: Callable[[], None]) -> None:
        """Run `release` (the client's own steps, then its connections) the first time only;
        the client is closed afterwards even if `release` raised."""
        if self._closed:
            return
        try:
            release()
        finally:
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError(f"{self._what} is closed")

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

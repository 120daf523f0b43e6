"""The launcher's free ports: never the same one twice in a process, even when the kernel picks
it again (a service's HTTP and Kafka ports are both asked for before either is bound)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from coordinator import launcher


class _Picks:
    """A socket whose `bind((host, 0))` gets the kernel's next pick from a script."""

    def __init__(self, picks: Iterator[int]) -> None:
        self._picks = picks
        self._port = 0

    def __enter__(self) -> _Picks:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def bind(self, address: tuple[str, int]) -> None:
        self._port = next(self._picks)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self._port)


def test_a_port_the_kernel_picks_again_is_not_handed_out_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    picks = iter([41001, 41001, 41001, 41002])
    monkeypatch.setattr(launcher, "_handed_out", set())
    monkeypatch.setattr(launcher.socket, "socket", lambda *a, **k: _Picks(picks))
    assert [launcher.free_port(), launcher.free_port()] == [41001, 41002]


def test_free_ports_are_bindable_and_distinct() -> None:
    ports = [launcher.free_port() for _ in range(20)]
    assert len(set(ports)) == 20
    for port in ports[:3]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))

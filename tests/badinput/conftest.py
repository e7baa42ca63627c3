"""Endpoints for the bad-input suite: one that accepts connections and never answers, one that refuses.

Every catalogue row points AWS at the black hole, so a row that should fail before any AWS call
and does not would show up as a connection here (and as a hang).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest


class BlackHole:
    """A TCP listener on 127.0.0.1 that accepts every connection and holds it open, silent."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self.accepted = 0
        self.url = "http://127.0.0.1:%d" % self._sock.getsockname()[1]
        threading.Thread(target=self._serve, name="black-hole", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._held.append(conn)
                self.accepted += 1

    def close(self) -> None:
        self._sock.close()
        with self._lock:
            for c in self._held:
                c.close()


@pytest.fixture(scope="session")
def black_hole() -> Iterator[BlackHole]:
    bh = BlackHole()
    yield bh
    bh.close()


@pytest.fixture(scope="session")
def refused_url() -> str:
    """A port nobody listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "http://127.0.0.1:%d" % s.getsockname()[1]

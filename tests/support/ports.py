"""Which ports listen, for the coordination-port tests (tests/fast and tests/integration)."""

from __future__ import annotations

import socket


def listening(family: int, address: str) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind((address, 0))
    sock.listen()
    return sock

"""Who can reach a run's coordination ports (issue 27, item 7): the JAX coordinator listens only
on the address the workers are given, not on every interface (it has no authentication), and
the agent's check that a worker's coordination port is free sees a listener of either address
family, an IPv6-only one included."""

from __future__ import annotations

import socket

import pytest

from payload.jobs.agent import port_in_use
from tests.support.ports import listening


@pytest.mark.parametrize(("family", "address"), [
    (socket.AF_INET, "127.0.0.1"), (socket.AF_INET, "0.0.0.0"),
    (socket.AF_INET6, "::1"), (socket.AF_INET6, "::"),
], ids=["ipv4-loopback", "ipv4-any", "ipv6-only-loopback", "ipv6-only-any"])
def test_the_port_check_sees_a_listener_of_either_family(family, address):
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    with listening(family, address) as sock:
        port = sock.getsockname()[1]
        assert port_in_use(port)
    assert not port_in_use(port)  # closed: free again

"""Who can reach a run's coordination ports (issue 27, item 7): the JAX coordinator listens only
on the address the workers are given, not on every interface (it has no authentication), and
the agent's check that a worker's coordination port is free sees a listener of either address
family, an IPv6-only one included."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.runners import payload_env

LISTEN = "0A"  # /proc/net/tcp's state for a listening socket


def listeners(port: int) -> set[str]:
    """The local addresses listening on `port` in this network namespace, from /proc/net."""
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, port_hex = fields[1].split(":")
            if fields[3] != LISTEN or int(port_hex, 16) != port:
                continue
            raw = bytes.fromhex(address)
            # The kernel prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            text = socket.inet_ntop(family, raw)
            found.add(text.removeprefix("::ffff:"))  # an IPv4 address on an IPv6 socket
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_jax_coordinator_listens_only_on_the_workers_address(tmp_path):
    pytest.importorskip("jax")
    port = free_port()
    # Process 0 of two: it starts the coordination service, then waits for process 1.
    script = ("from payload.engines.jax.distributed import join\n"
              f"join(coordinator='127.0.0.1:{port}', num_processes=2, process_id=0)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], env=payload_env(JAX_PLATFORMS="cpu"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not listeners(port):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the coordinator never listened"
            time.sleep(0.2)
        assert listeners(port) == {"127.0.0.1"}  # not "::" or "0.0.0.0": every interface
    finally:
        proc.kill()
        proc.wait()


def test_the_coordinator_binds_a_resolved_address_the_others_reach():
    """Issue 32, item 6, with this machine's own resolver and interfaces: a name is bound by
    its address; loopback only when every worker is here; NAT only as the config says."""
    pytest.importorskip("jax")
    from payload.core.errors import UserError
    from payload.engines.jax.distributed import bind_address

    assert bind_address("127.0.0.1:8476") == "127.0.0.1:8476"
    assert bind_address("localhost:8476", peers=("localhost",)) == "127.0.0.1:8476"
    assert bind_address("[::1]:8476", peers=("::1",)) == "[::1]:8476"
    # A name that is loopback here while a worker is elsewhere (TEST-NET-3, RFC 5737): Debian's
    # 127.0.1.1 for a machine's own name.
    with pytest.raises(UserError, match="a loopback address the other workers cannot reach"):
        bind_address("localhost:8476", peers=("localhost", "203.0.113.8"))
    # An address no interface here has: a worker reached through NAT.
    with pytest.raises(UserError, match="is not an address of worker 0"):
        bind_address("203.0.113.7:8476", peers=("203.0.113.8",))
    assert bind_address("203.0.113.7:8476", bind="0.0.0.0") == "0.0.0.0:8476"
    with pytest.raises(UserError, match="cannot resolve"):
        bind_address("no-such-host.invalid:8476")

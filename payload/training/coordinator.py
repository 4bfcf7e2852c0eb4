"""Where process 0 of a multi-host JAX run listens: an address the other processes reach.

    listen_address("w0:8476", resolved=["10.0.0.2"], peers=[["10.0.0.3"]], own={"10.0.0.2"})
    # -> "10.0.0.2:8476": the name resolved, bound by its address
    listen_address("w0:8476", resolved=["127.0.1.1"], peers=[["10.0.0.3"]], own={"127.0.1.1"})
    # -> UserError: w0 is loopback on worker 0 (Debian maps its own name there)

The coordination service has no authentication, so it never listens on every interface unless
the run's config says so (`cluster.coordinator_bind: 0.0.0.0`). A pure function of what worker 0
found (payload.engines.jax.distributed resolves the names and probes which addresses it holds),
so every case is a fast test.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Sequence

from payload.core.errors import UserError

BIND_KEY = "cluster.coordinator_bind"
# The values of BIND_KEY that listen on every interface, written out on purpose.
EVERY_INTERFACE = ("0.0.0.0", "::")


def split_address(address: str) -> tuple[str, str]:
    """("HOST", "PORT") of "HOST:PORT" or "[V6]:PORT"."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), port


def join_address(host: str, port: str) -> str:
    """"HOST:PORT", an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def listen_address(coordinator: str, *, resolved: Sequence[str], peers: Sequence[Sequence[str]],
                   own: Collection[str], bind: str | None = None) -> str:
    """The "ADDRESS:PORT" worker 0's coordinator listens on.

    `coordinator`: the "HOST:PORT" every process is given; `resolved`: HOST's addresses as
    worker 0 resolves it; `peers`: each other worker's addresses, resolved there too; `own`:
    which of those addresses (and `bind`) worker 0 can listen on; `bind`: the config's
    `cluster.coordinator_bind`, if set. Always an address, never a name (which the service
    would resolve again, maybe otherwise); loopback only when every worker is on this host."""
    host, port = split_address(coordinator)
    if bind is not None:
        if bind not in EVERY_INTERFACE and bind not in own:
            raise UserError(f"{BIND_KEY} {bind} is not an address of worker 0 (it cannot listen "
                            "there)", hint="set it to an address worker 0's own interfaces "
                            "hold (`ip -brief address` on it)")
        return join_address(bind, port)
    if not resolved:
        raise UserError(f"worker 0 cannot resolve its own coordinator address {host}",
                        hint="list the workers by addresses or by names worker 0 resolves")
    reachable = [a for a in resolved if a in own and not _is_loopback(a)]
    if reachable:
        return join_address(reachable[0], port)
    # IPv4 first where the name resolves to both (`localhost`): 127.0.0.1 is there wherever
    # IPv4 is, and the local workers have always reached worker 0 there.
    loopback = sorted((a for a in resolved if _is_loopback(a)), key=lambda a: ":" in a)
    all_local = all(found and all(_is_loopback(a) or a in own for a in found)
                    for found in peers)
    if loopback and all_local:
        return join_address(loopback[0], port)
    if loopback:
        raise UserError(
            f"the JAX coordinator's address {host} is {loopback[0]} on worker 0, a loopback "
            "address the other workers cannot reach (Debian and Ubuntu map a machine's own "
            "name there)", hint="list worker 0 by an address the others reach, or set "
            f"{BIND_KEY} to worker 0's address on their network")
    raise UserError(
        f"the JAX coordinator's address {host} ({', '.join(resolved)}) is not an address of "
        "worker 0, so it cannot listen there (is it reached through NAT?)",
        hint=f"set {BIND_KEY} to worker 0's own address that the NAT forwards to, or to "
             "0.0.0.0 to listen on every interface (the service has no authentication: only "
             "where a firewall keeps others out)")

"""Joining the processes of a multi-host JAX run: every host runs the same program.

    join(coordinator="10.0.0.2:8476", num_processes=4, process_id=I)   # before any jax work

On a TPU slice each host is one process over its own chips; in the local CPU mode each worker
process is one host over its CPU, and the processes reduce over gloo (JAX's CPU collectives),
so the multi-host path is the one that runs in tests. Process 0's coordination service has no
authentication, so it listens only on the address the other processes are given
(`bind_address`), not on every interface as JAX would by default.
"""

from __future__ import annotations

import logging
import socket

import jax

log = logging.getLogger(__name__)


def join(*, coordinator: str, num_processes: int, process_id: int) -> None:
    """Connect this process to the others (process 0 serves `coordinator`, "HOST:PORT").
    One process needs nothing. Call before anything touches a device."""
    if num_processes <= 1:
        return
    # CPU arrays that span processes need a collectives library to reduce; the setting only
    # concerns the CPU backend, so it is harmless where TPUs compute.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # JAX's preemption service catches SIGTERM (its notifier only logs it) so that a loop that
    # asks it at every step can save at an agreed one; tpuctl's loop does not ask, so the stage
    # trained on after `tpuctl stop` until SIGKILL, writing checkpoints the stop's last line did
    # not name. Without it SIGTERM ends the stage at once, as it ends a TensorFlow one, and the
    # newest complete checkpoint is the one --resume takes (payload.jobs.agent.stop_words).
    jax.config.update("jax_enable_preemption_service", False)
    bind = bind_address(coordinator) if process_id == 0 else None
    if process_id == 0 and bind is None:
        log.warning("the JAX coordinator listens on every interface: %s is not an address of "
                    "this host (a NAT address?), so it cannot listen there alone", coordinator)
    jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id,
                               coordinator_bind_address=bind)


def bind_address(coordinator: str) -> str | None:
    """`coordinator` ("HOST:PORT", "[V6]:PORT") when this host can listen on that address,
    else None (JAX's default then: every interface). A worker addressed through NAT (an
    external address that no interface of the host holds) keeps working that way; every
    address a provider gives as a worker's own internal one is bound alone."""
    host = coordinator.rsplit(":", 1)[0].strip("[]")
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None
    for family, _, _, _, address in found:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((address[0], 0))  # a free port of that address: is it ours?
        except OSError:
            continue
        return coordinator
    return None

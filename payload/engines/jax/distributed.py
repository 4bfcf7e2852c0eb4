"""Joining the processes of a multi-host JAX run: every host runs the same program.

    join(coordinator="10.0.0.2:8476", num_processes=4, process_id=I)   # before any jax work
    meet("tpuctl-step-compiled")          # every process here before the first collective

On a TPU slice each host is one process over its own chips; in the local CPU mode each worker
process is one host over its CPU, and the processes reduce over gloo (JAX's CPU collectives),
so the multi-host path is the one that runs in tests. Process 0's coordination service has no
authentication, so it listens only on the address the other processes reach it at, resolved
here (`bind_address`; payload.training.coordinator decides), not on every interface as JAX
would by default, unless the config says so (cluster.coordinator_bind).
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass

import jax

from payload.training.coordinator import (
    BIND_KEY,
    EVERY_INTERFACE,
    listen_address,
    split_address,
)

log = logging.getLogger(__name__)


def join(*, coordinator: str, num_processes: int, process_id: int,
         peers: tuple[str, ...] = (), bind: str | None = None) -> None:
    """Connect this process to the others (process 0 serves `coordinator`, "HOST:PORT"; `peers`:
    the other workers' hosts; `bind`: cluster.coordinator_bind). One process needs nothing.
    Call before anything touches a device."""
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
    listen = bind_address(coordinator, peers=peers, bind=bind) if process_id == 0 else None
    if listen is not None and split_address(listen)[0] in EVERY_INTERFACE:
        log.info("the JAX coordinator listens on every interface (%s: %s)", BIND_KEY, bind)
    jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id,
                               coordinator_bind_address=listen)


# How long a process waits for the others at a meeting point: a compile of a large model on a
# busy CPU takes minutes; a peer that died ends the job through the agents, not this timeout.
MEET_TIMEOUT_S = 30 * 60


def meet(name: str, *, timeout_s: float = MEET_TIMEOUT_S) -> None:
    """Wait until every process reached `name` (each calls it in the same order), through the
    coordination service, not a device collective: on CPU the first collective sets up gloo's
    context, which gives up when one process arrives 30 s before another (measured: two
    processes of one run, one compiling slower on a busy machine). Nothing to wait for alone."""
    if jax.process_count() <= 1:
        return
    from orbax.checkpoint import multihost

    multihost.get_barrier_sync_fn()(key=name, timeout_ms=int(timeout_s * 1000))


@dataclass(frozen=True)
class ProcessCoordination:
    """The coordination service of one program's processes, hosted by process 0
    (payload.training.leaving.Coordination)."""

    index: int
    count: int

    def meet(self, name: str) -> None:
        meet(name)

    def post(self, key: str) -> None:
        from orbax.checkpoint import multihost

        multihost.get_jax_distributed_client().key_value_set(key, "1")

    def wait_for(self, key: str, timeout_s: float) -> bool:
        from orbax.checkpoint import multihost

        try:
            multihost.get_jax_distributed_client().blocking_key_value_get(
                key, max(1, int(timeout_s * 1000)))
        except jax.errors.JaxRuntimeError:  # its time passed, or the service lost that process
            return False
        return True


def bind_address(coordinator: str, *, peers: tuple[str, ...] = (), bind: str | None = None
                 ) -> str:
    """The "ADDRESS:PORT" worker 0's coordinator listens on (payload.training.coordinator
    decides; a UserError when none the others reach): `coordinator`'s host and each peer
    resolved here, and which of those addresses this host holds."""
    host, _ = split_address(coordinator)
    resolved = _resolve(host)
    found = [_resolve(peer) for peer in peers]
    candidates = {*resolved, *(a for each in found for a in each), *([bind] if bind else [])}
    own = {address for address in candidates if _holds(address)}
    return listen_address(coordinator, resolved=resolved, peers=found, own=own, bind=bind)


def _resolve(host: str) -> list[str]:
    """The addresses `host` resolves to here, in the resolver's order; none when it does not."""
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    return list(dict.fromkeys(str(address[0]) for *_, address in found))


def _holds(address: str) -> bool:
    """Whether this host can listen on `address` (an interface of its own holds it)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))  # a free port of that address: is it ours?
    except OSError:
        return False
    return True

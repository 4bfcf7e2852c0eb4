"""Joining the processes of a multi-host JAX run: every host runs the same program.

    join(coordinator="10.0.0.2:8476", num_processes=4, process_id=I)   # before any jax work

On a TPU slice each host is one process over its own chips; in the local CPU mode each worker
process is one host over its CPU, and the processes reduce over gloo (JAX's CPU collectives),
so the multi-host path is the one that runs in tests.
"""

from __future__ import annotations

import jax


def join(*, coordinator: str, num_processes: int, process_id: int) -> None:
    """Connect this process to the others (process 0 serves `coordinator`, "HOST:PORT").
    One process needs nothing. Call before anything touches a device."""
    if num_processes <= 1:
        return
    # CPU arrays that span processes need a collectives library to reduce; the setting only
    # concerns the CPU backend, so it is harmless where TPUs compute.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)

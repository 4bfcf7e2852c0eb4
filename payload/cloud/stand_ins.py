"""Whether the Google APIs a run talks to are local stand-ins: one rule, launcher and workers alike.

    stand_ins.TPU_API_ENV, stand_ins.COMPUTE_API_ENV   # the endpoints tests point at fakes
    stand_ins.active()              # True when either is set: no TPU here, JAX/TF use the CPU
    stand_ins.forwarded_env()       # what the launcher passes on to every stage

A fleet whose cloud API (the Cloud TPU API for provider gcp, Compute Engine for provider gce) is a
stand-in has no TPU chips by design: its stages compute on the CPU (payload.training.strategy asks
`active` and nothing else) and worker 0's `train --down` reaches the same stand-in.
"""

from __future__ import annotations

import os

TPU_API_ENV = "TPUCTL_TPU_API_ENDPOINT"
COMPUTE_API_ENV = "TPUCTL_COMPUTE_API_ENDPOINT"
ENDPOINT_ENVS = (TPU_API_ENV, COMPUTE_API_ENV)


def endpoint(name: str, environ=None) -> str | None:
    """The stand-in endpoint in the variable `name` (one of ENDPOINT_ENVS), or None: Google."""
    environ = os.environ if environ is None else environ
    return environ.get(name) or None


def active(environ=None) -> bool:
    """Whether any cloud API of the run is a stand-in (tests): there is no TPU to find."""
    return any(endpoint(name, environ) for name in ENDPOINT_ENVS)


def forwarded_env() -> tuple[tuple[str, str], ...]:
    """The stand-in endpoints the launcher uses, for every stage on the workers."""
    return tuple((name, endpoint(name)) for name in ENDPOINT_ENVS if endpoint(name))

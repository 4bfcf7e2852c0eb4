"""How the JAX engine lays the training state over a slice's chips, worked out without JAX.

    plan = plan_sharding(1_557_611_200, num_devices=16, hbm_bytes_per_chip=16 << 30)
    plan.kind            # "FSDP over 4 chips": the smallest group whose share fits a chip
    plan_sharding(1_557_611_200, num_devices=1, hbm_bytes_per_chip=16 << 30)
    # UserError: "... need 23.2 GiB of training state ... but a chip has 16 GiB ..."

Pure arithmetic on the parameter count and the accelerator table's memory per chip, so the run
plan, the launcher's dry run and the pre-flight say what the step (payload.engines.jax.step,
which builds the mesh from the same plan) will do, and refuse what cannot fit, before any JAX
import or TPU hour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from payload.core.errors import UserError

# Bytes of training state per parameter: float32 weight and gradient, plus the optimizer's
# moments (Adam: two float32; Adafactor: factored, a few per row and column: counted as none).
STATE_BYTES_PER_PARAM = {"adamw": 16, "adafactor": 8}
# The share of a chip's memory the weights, gradients and optimizer state may use; the rest is
# for activations, the bfloat16 copies and XLA's buffers.
STATE_SHARE_OF_HBM = 0.6
GIB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class ShardingPlan:
    """How the devices are arranged: `data` replicas, each holding 1/`fsdp` of the state."""

    data: int
    fsdp: int
    state_bytes_per_chip: int  # weights, gradients and optimizer state on one chip
    hbm_bytes_per_chip: int

    @property
    def num_devices(self) -> int:
        return self.data * self.fsdp

    @property
    def kind(self) -> str:
        return "data parallel" if self.fsdp == 1 else f"FSDP over {self.fsdp} chips"

    def describe(self) -> str:
        """The plan in words, with the memory figures it was chosen by."""
        share = self.hbm_bytes_per_chip * STATE_SHARE_OF_HBM
        layout = (f"every chip holds the whole state, the batch split over {self.data}"
                  if self.fsdp == 1 else
                  f"{self.data} replica group{'s' if self.data > 1 else ''} of {self.fsdp} "
                  "chips, each chip holding 1/" f"{self.fsdp} of the state")
        return (f"{self.kind} ({layout}): {self.state_bytes_per_chip / GIB:.1f} GiB of "
                f"weights, gradients and optimizer state per chip, of the "
                f"{share / GIB:.1f} GiB ({STATE_SHARE_OF_HBM:.0%} of "
                f"{self.hbm_bytes_per_chip / GIB:.0f} GiB) a chip gives them")


def state_bytes(num_params: int, optimizer: str = "adamw") -> int:
    """The whole training state of a model, before any sharding."""
    return num_params * STATE_BYTES_PER_PARAM[optimizer]


def plan_sharding(num_params: int, *, num_devices: int, hbm_bytes_per_chip: int,
                  optimizer: str = "adamw", where: str = "") -> ShardingPlan:
    """Replicated if the whole training state fits one chip's share, else the smallest FSDP
    group (a divisor of the device count) that makes it fit. A state too large even spread
    over every chip is a user error that says what it needs and what there is (`where` names
    the slice in it, e.g. "v5litepod-1")."""
    state = state_bytes(num_params, optimizer)
    budget = int(hbm_bytes_per_chip * STATE_SHARE_OF_HBM)
    for fsdp in (d for d in range(1, num_devices + 1) if num_devices % d == 0):
        per_chip = math.ceil(state / fsdp)
        if per_chip <= budget:
            return ShardingPlan(data=num_devices // fsdp, fsdp=fsdp, state_bytes_per_chip=per_chip,
                                hbm_bytes_per_chip=hbm_bytes_per_chip)
    chips = (f"the {num_devices} chips" if num_devices > 1 else "the one chip") + (
        f" of {where}" if where else "")
    fits = math.ceil(state / budget)
    smaller = ", or train.optimizer: adafactor (half the state)" if optimizer == "adamw" else ""
    raise UserError(
        f"the model's {num_params / 1e6:,.0f}M parameters need {state / GIB:.1f} GiB of "
        f"training state ({optimizer}): {state / num_devices / GIB:.1f} GiB per chip even split "
        f"(FSDP) over {chips}, but a chip has {hbm_bytes_per_chip / GIB:.0f} GiB "
        f"({budget / GIB:.1f} GiB of it for the state)",
        hint=f"use a slice of at least {fits} such chips, chips with more memory or a smaller "
             f"model{smaller}",
    )

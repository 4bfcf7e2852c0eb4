"""How the JAX engine lays the training state over a slice's devices, and whether a step's
activations fit beside it, worked out without JAX.

    plan = plan_sharding(1_557_611_200, num_devices=16, hbm_bytes_per_chip=16 << 30)
    plan.kind            # "FSDP over 4 devices": the smallest group whose share fits a device
    plan_sharding(1_557_611_200, num_devices=1, hbm_bytes_per_chip=16 << 30, where="v5litepod-1",
                  larger=accelerators.larger_slices("v5litepod-1"))
    # UserError: "... need 20.3 GiB of training state ..." hint: "use v5litepod-4 or larger ..."
    plan_sharding(..., workload=Workload.of(...))   # also activations and train.remat: auto
    plan_sharding(..., num_devices=32, num_slices=2)  # FSDP inside a slice, data over slices

Pure arithmetic on the parameter count, the step's shapes (payload.core.fit.memory) and the
accelerator table's memory per device (a chip's, shared by the devices it shows: two on
TPU7x, one elsewhere), so the run plan, the launcher's dry run and the config
check say what the step (payload.engines.jax.step, which builds the mesh from the same plan)
will do, and refuse what cannot fit, naming what would (the caller names the larger slices of
the same chips, from the accelerator table), before any JAX import or TPU hour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from payload.core.errors import UserError

# Bytes of training state per parameter: the float32 weight and the optimizer's moments (Adam:
# two float32; Adafactor: factored, a few per row and column: counted as none), held from step
# to step, and the gradient, held within one. The gradient is as wide as the products that
# make it: bfloat16 where the step computes in bfloat16 (its cast to float32 fuses into the
# update; the TPU compiler's memory analysis holds 2 bytes a parameter of it, not 4), float32
# otherwise.
WEIGHTS_AND_MOMENTS = {"adamw": 12, "adafactor": 4}
STATE_BYTES_PER_PARAM = {name: held + 4 for name, held in WEIGHTS_AND_MOMENTS.items()}
# Gradients' worth of buffers the TPU compiler holds per chip beyond the gradient itself, by
# generation: TPU7x's compiled steps overlap the gradients' all-reduce with the backward pass
# (its all-reduces are asynchronous, v5e's and v6e's in these steps are not) and held about
# 1.5 bfloat16 gradients more than v6e's at the same shapes (GPT-2 small at 256 x 8: 0.30 GiB
# more temporaries, the same all-reduce volume; GPT-2 small at 1024 x 32 and medium at 256 x 8:
# docs/jax-speed.md, "The estimate against the compiler"). Split over an FSDP group.
IN_FLIGHT_GRADIENTS = {"tpu7x": 1.5}
# The share of a chip's memory the weights, gradients and optimizer state may use; the rest is
# for activations, the bfloat16 copies and XLA's buffers.
STATE_SHARE_OF_HBM = 0.6
# The share of a chip's memory a step may fill in all (state, activations, bfloat16 weight
# copies); the runtime and XLA's own scratch keep the rest.
USABLE_SHARE_OF_HBM = 0.9
# A train.remat policy the user names (after `tpuctl train --dry-run --compile` found that the
# compiler fits it, say) may fill the whole chip by the estimate: the margin above is for the
# estimate's own error, which the compiler's figure has replaced.
NAMED_POLICY_SHARE_OF_HBM = 1.0
GIB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class ShardingPlan:
    """How the devices are arranged: `data` replicas, each holding 1/`fsdp` of the state."""

    data: int
    fsdp: int
    state_bytes_per_chip: int  # weights, gradients and optimizer state on one chip
    hbm_bytes_per_chip: int
    # With a workload: the layers' rematerialisation (train.remat, or the least that fits)
    # and what the step's activations and bfloat16 weight copies take per chip.
    remat: str = "none"
    activation_bytes_per_chip: int | None = None
    named_policy: bool = False  # train.remat named the policy (not auto)
    # Slices joined over the data-center network: the outermost `slices` of the `data`
    # replicas; an FSDP group never spans two (its gathers would cross DCN every layer).
    slices: int = 1

    @property
    def num_devices(self) -> int:
        return self.data * self.fsdp

    @property
    def kind(self) -> str:
        inside = "data parallel" if self.fsdp == 1 else f"FSDP over {self.fsdp} devices"
        if self.slices == 1:
            return inside
        return f"data parallel over {self.slices} slices, {inside} within each"

    def describe(self) -> str:
        """The plan in words, with the memory figures it was chosen by."""
        share = self.hbm_bytes_per_chip * STATE_SHARE_OF_HBM
        layout = (f"every device holds the whole state, the batch split over {self.data}"
                  if self.fsdp == 1 else
                  f"{self.data} replica group{'s' if self.data > 1 else ''} of {self.fsdp} "
                  "devices, each holding 1/" f"{self.fsdp} of the state")
        said = (f"{self.kind} ({layout}): {self.state_bytes_per_chip / GIB:.1f} GiB of "
                f"weights, gradients and optimizer state per device, of the "
                f"{share / GIB:.1f} GiB ({STATE_SHARE_OF_HBM:.0%} of "
                f"{self.hbm_bytes_per_chip / GIB:.0f} GiB) a device gives them")
        if self.activation_bytes_per_chip is None:
            return said
        return (f"{said}; activations about {self.activation_bytes_per_chip / GIB:.1f} GiB per "
                f"device with train.remat {self.remat} ({_REMAT_WORDS[self.remat]}), "
                f"{self.total_bytes_per_chip / GIB:.1f} GiB in all of the "
                f"{self.usable_bytes / GIB:.1f} GiB usable")

    @property
    def usable_bytes(self) -> float:
        return self.hbm_bytes_per_chip * usable_share(self.named_policy)

    @property
    def total_bytes_per_chip(self) -> int:
        return self.state_bytes_per_chip + (self.activation_bytes_per_chip or 0)


_REMAT_WORDS = {"none": "every activation kept", "dots": "products kept, the rest recomputed",
                "full": "each layer recomputed in the backward pass"}


def state_bytes(num_params: int, optimizer: str = "adamw", workload=None) -> int:
    """The whole training state of a model, before any sharding: float32 gradients, or, with a
    `workload` computing in bfloat16, bfloat16 ones."""
    gradient = 2 if workload is not None and _bf16_products(workload) else 4
    return num_params * (WEIGHTS_AND_MOMENTS[optimizer] + gradient)


def _bf16_products(workload) -> bool:
    return bool(workload.bf16) and workload.platform != "cpu"


def plan_sharding(num_params: int, *, num_devices: int, hbm_bytes_per_chip: int,
                  optimizer: str = "adamw", where: str = "", workload=None,
                  larger: tuple[tuple[str, int], ...] = (), num_slices: int = 1
                  ) -> ShardingPlan:
    """Replicated if the whole training state fits one chip's share, else the smallest FSDP
    group (a divisor of the device count) that makes it fit. With a `workload`
    (payload.core.fit.workload) the step's activations must fit too: the least
    rematerialisation that does (train.remat auto; none before dots before full, each tried
    over the FSDP groups first) or the one train.remat names. What fits no arrangement is a
    user error that says what it needs and has, and what would fit (`where` names the slice,
    e.g. "v5litepod-1"; `larger` the slices of the same chips with more of them, (name, chips)
    smallest first, as payload.cloud.accelerators.larger_slices lists them). With
    `num_slices` > 1 the `num_devices` are that many equal slices: each slice is planned as
    above for its share of the batch, and the slices are data-parallel replicas of it."""
    if num_slices > 1:
        return _over_slices(plan_sharding, num_params, num_devices=num_devices,
                            num_slices=num_slices, hbm_bytes_per_chip=hbm_bytes_per_chip,
                            optimizer=optimizer,
                            where=f"one slice of {where}" if where else "one slice",
                            workload=workload, larger=larger)
    state, groups = _state_groups(num_params, optimizer, workload, num_devices=num_devices,
                                  hbm_bytes_per_chip=hbm_bytes_per_chip)
    if not groups:
        raise _no_room_for_state(num_params, state, num_devices=num_devices,
                                 hbm_bytes_per_chip=hbm_bytes_per_chip, optimizer=optimizer,
                                 where=where, workload=workload, larger=larger)
    if workload is None:
        fsdp = groups[0]
        return ShardingPlan(data=num_devices // fsdp, fsdp=fsdp,
                            state_bytes_per_chip=math.ceil(state / fsdp),
                            hbm_bytes_per_chip=hbm_bytes_per_chip)
    found = _fitting(num_params, state, groups, num_devices=num_devices,
                     hbm_bytes_per_chip=hbm_bytes_per_chip, workload=workload)
    if found is None:
        raise _no_room_for_activations(num_params, state, groups, num_devices=num_devices,
                                       hbm_bytes_per_chip=hbm_bytes_per_chip,
                                       optimizer=optimizer, where=where, workload=workload,
                                       larger=larger)
    return found


def arrangement(num_params: int, *, num_devices: int, hbm_bytes_per_chip: int, workload,
                optimizer: str = "adamw", num_slices: int = 1) -> ShardingPlan:
    """How the step would be laid out with `workload.remat` (a policy, not auto) whether or not
    the estimate says it fits: the smallest FSDP group it fits with, else the largest group the
    state allows (the least memory that policy can take). For a figure that is not the
    estimate's, the TPU compiler's, to judge; a state no group holds is refused as
    plan_sharding refuses it. Several slices: one slice's arrangement on each."""
    if num_slices > 1:
        return _over_slices(arrangement, num_params, num_devices=num_devices,
                            num_slices=num_slices, hbm_bytes_per_chip=hbm_bytes_per_chip,
                            optimizer=optimizer, workload=workload)
    state, groups = _state_groups(num_params, optimizer, workload, num_devices=num_devices,
                                  hbm_bytes_per_chip=hbm_bytes_per_chip)
    if not groups:
        return plan_sharding(num_params, num_devices=num_devices,
                             hbm_bytes_per_chip=hbm_bytes_per_chip, optimizer=optimizer,
                             workload=workload)
    found = _fitting(num_params, state, groups, num_devices=num_devices,
                     hbm_bytes_per_chip=hbm_bytes_per_chip, workload=workload)
    if found is not None:
        return found
    from payload.core.fit.memory import activation_bytes

    fsdp = groups[-1]
    rows = max(1, workload.batch_size // num_devices)
    return ShardingPlan(data=num_devices // fsdp, fsdp=fsdp,
                        state_bytes_per_chip=math.ceil(state / fsdp),
                        hbm_bytes_per_chip=hbm_bytes_per_chip, remat=workload.remat,
                        named_policy=True,
                        activation_bytes_per_chip=activation_bytes(workload, workload.remat,
                                                                   rows=rows)
                        + _working_bytes(num_params, fsdp, workload))


def compiler_trials(estimated: ShardingPlan, laid_out, *, estimated_fits: bool
                    ) -> list[ShardingPlan]:
    """With train.remat auto and a compiler to ask (tpuctl train --dry-run --compile), the
    arrangements to compile after the estimate's choice `estimated`, in order, the first the
    compiler fits being the choice: where `estimated` fits, the lighter policies the estimate
    ruled out for its margin alone (estimated within the whole chip), lightest first; where it
    does not, the heavier ones. `laid_out(policy)` is that policy's arrangement."""
    from payload.core.fit.memory import REMAT_ORDER

    at = REMAT_ORDER.index(estimated.remat)
    if not estimated_fits:
        return [laid_out(policy) for policy in REMAT_ORDER[at + 1:]]
    return [arranged for arranged in map(laid_out, REMAT_ORDER[:at])
            if arranged.total_bytes_per_chip <= arranged.usable_bytes]


def usable_share(named_policy: bool) -> float:
    """The share of a chip's HBM a step may fill by the estimate."""
    return NAMED_POLICY_SHARE_OF_HBM if named_policy else USABLE_SHARE_OF_HBM


def _over_slices(plan, num_params: int, *, num_devices: int, num_slices: int, workload,
                 **rest) -> ShardingPlan:
    """One slice's `plan` (plan_sharding or arrangement: the state sharded over that slice's
    devices only, for its share of the batch), repeated on every slice."""
    from dataclasses import replace

    if num_devices % num_slices:
        raise ValueError(f"{num_devices} devices do not make {num_slices} equal slices")
    if workload is not None:
        workload = replace(workload, batch_size=max(1, workload.batch_size // num_slices))
    one = plan(num_params, num_devices=num_devices // num_slices, workload=workload, **rest)
    return replace(one, data=one.data * num_slices, slices=num_slices)


def _state_groups(num_params: int, optimizer: str, workload, *, num_devices: int,
                  hbm_bytes_per_chip: int) -> tuple[int, list[int]]:
    """The whole training state, and the FSDP groups (divisors of the device count, smallest
    first) whose share of it fits a device's share for the state."""
    state = state_bytes(num_params, optimizer, workload)
    budget = int(hbm_bytes_per_chip * STATE_SHARE_OF_HBM)
    return state, [d for d in range(1, num_devices + 1)
                   if num_devices % d == 0 and math.ceil(state / d) <= budget]


def _policies(workload) -> tuple[str, ...]:
    from payload.core.fit.memory import REMAT_ORDER

    return REMAT_ORDER if workload.remat == "auto" else (workload.remat,)


def _working_bytes(num_params: int, fsdp: int, workload) -> int:
    """What the weights and gradients take beyond the state while a step runs: nothing
    replicated (the cast of a weight to bfloat16 fuses into the product that reads it); split
    over an FSDP group, each layer's weights gathered whole in the compute dtype, about two
    layers at a time (the one computing and the next one's gather); where the compiler
    overlaps the gradients' exchange with the backward pass (IN_FLIGHT_GRADIENTS), the buffers
    of that exchange."""
    width = 2 if _bf16_products(workload) else 4
    in_flight = int(IN_FLIGHT_GRADIENTS.get(workload.generation or "", 0) * num_params * width
                    / fsdp)
    if fsdp == 1:
        return in_flight
    from payload.core.families import family_of

    architecture = workload.architecture
    layers = max(1, family_of(architecture).dims(architecture).all_layers)
    return 2 * num_params * width // layers + in_flight


def _fitting(num_params, state, groups, *, num_devices, hbm_bytes_per_chip, workload,
             policies=None) -> ShardingPlan | None:
    from payload.core.fit.memory import activation_bytes

    named = workload.remat != "auto"
    usable = hbm_bytes_per_chip * usable_share(named)
    rows = max(1, workload.batch_size // num_devices)
    for policy in policies or _policies(workload):
        activations = activation_bytes(workload, policy, rows=rows)
        for fsdp in groups:
            held = activations + _working_bytes(num_params, fsdp, workload)
            if math.ceil(state / fsdp) + held <= usable:
                return ShardingPlan(data=num_devices // fsdp, fsdp=fsdp,
                                    state_bytes_per_chip=math.ceil(state / fsdp),
                                    hbm_bytes_per_chip=hbm_bytes_per_chip, remat=policy,
                                    activation_bytes_per_chip=held, named_policy=named)
    return None


def _larger_slice(num_params: int, *, optimizer: str, hbm_bytes_per_chip: int, workload,
                  larger: tuple[tuple[str, int], ...]) -> str | None:
    """The smallest of the `larger` slices (the same chips, more of them) on which this model
    (and step, with a workload) fits; None if there is none."""
    for name, chips in larger:
        if workload is not None and workload.batch_size % chips:
            continue
        try:
            plan_sharding(num_params, num_devices=chips, hbm_bytes_per_chip=hbm_bytes_per_chip,
                          optimizer=optimizer, workload=workload)
        except UserError:
            continue
        return name
    return None


def _no_room_for_state(num_params, state, *, num_devices, hbm_bytes_per_chip, optimizer,
                       where, workload, larger) -> UserError:
    budget = int(hbm_bytes_per_chip * STATE_SHARE_OF_HBM)
    chips = (f"the {num_devices} devices" if num_devices > 1 else "the one device") + (
        f" of {where}" if where else "")
    fits = math.ceil(state / budget)
    smaller = ", or train.optimizer: adafactor (less than half the state)" if optimizer == "adamw" else ""
    bigger = _larger_slice(num_params, optimizer=optimizer, hbm_bytes_per_chip=hbm_bytes_per_chip,
                           workload=workload, larger=larger)
    slices = (f"use {bigger} or larger" if bigger else
              f"use a slice of at least {fits} such devices")
    return UserError(
        f"the model's {num_params / 1e6:,.0f}M parameters need {state / GIB:.1f} GiB of "
        f"training state ({optimizer}): {state / num_devices / GIB:.1f} GiB per device even "
        f"split (FSDP) over {chips}, but a device has {hbm_bytes_per_chip / GIB:.0f} GiB "
        f"({budget / GIB:.1f} GiB of it for the state)",
        hint=f"{slices}, chips with more memory or a smaller model{smaller}",
    )


def _no_room_for_activations(num_params, state, groups, *, num_devices, hbm_bytes_per_chip,
                             optimizer, where, workload, larger) -> UserError:
    from dataclasses import replace

    from payload.core.fit.memory import activation_bytes

    policy = _policies(workload)[-1]  # the least memory this run allows itself
    rows = max(1, workload.batch_size // num_devices)
    fsdp = groups[-1]
    held = activation_bytes(workload, policy, rows=rows) + _working_bytes(num_params, fsdp,
                                                                          workload)
    usable = hbm_bytes_per_chip * usable_share(workload.remat != "auto")
    ways = []
    fitting_rows = next((r for r in range(rows - 1, 0, -1) if _fitting(
        num_params, state, groups, num_devices=num_devices,
        hbm_bytes_per_chip=hbm_bytes_per_chip, policies=(policy,),
        workload=replace(workload, batch_size=r * num_devices)) is not None), 0)
    if fitting_rows:
        ways.append(f"train.batch_size {fitting_rows * num_devices} or less")
    if policy != "full":
        ways.append("train.remat: full (each layer recomputed: about a third more compute)")
    bigger = _larger_slice(num_params, optimizer=optimizer, hbm_bytes_per_chip=hbm_bytes_per_chip,
                           workload=workload, larger=larger)
    if bigger:
        ways.append(f"{bigger} (the same batch over more devices)")
    ways.append("a shorter data.seq_len or a smaller model")
    what = f"{where}'s devices" if where else "a device"
    return UserError(
        f"a training step of {rows} rows per device (train.batch_size {workload.batch_size} "
        f"over {num_devices} device{'s' if num_devices > 1 else ''}) at seq_len "
        f"{workload.seq_len} needs about {held / GIB:.1f} GiB of activations per device with "
        f"train.remat {policy}, "
        f"beside {math.ceil(state / fsdp) / GIB:.1f} GiB of training state, but {what} have "
        f"{hbm_bytes_per_chip / GIB:.0f} GiB ({usable / GIB:.1f} GiB usable)",
        hint="use " + "; or ".join(ways),
    )

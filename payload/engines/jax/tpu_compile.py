"""The run's training and evaluation steps compiled for a TPU slice by the real TPU compiler, on
a machine without a TPU: what `tpuctl train --dry-run --compile` reports.

    report = compile_for_tpu(config, acc, target)   # payload.cloud.accelerators' slice, layout
    report["train"]["hbm_bytes"]     # per chip: arguments + temporaries + outputs - aliased
    report["train"]["kernels"]       # {"splash": 3}: kernels_in(hlo), the Pallas TPU calls

libtpu (the wheel jax[tpu] pins) must be loadable: TPU_LIBRARY_PATH names its libtpu.so, and
the process says it has no TPU before JAX starts (payload.stages.tpu_compile sets that up). JAX
lays out the slice's devices (`jax.experimental.topologies`), the engine builds its step over a
mesh of them exactly as a TPU host would (payload.engines.jax.step), and `lower().compile()`
runs the compiler for that generation: the memory XLA allocates per chip, the FLOPs it counts,
and the custom calls the attention kernels became. What is compiled is what the run's trainer
would run: the run plan's arrangement (payload.core.fit.sharding: the FSDP group and train.remat
from the estimate). Where the compiler finds it does not fit a chip, the run is refused, and the
later train.remat policies are compiled to name one that fits.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace

import jax
import jax.numpy as jnp

from payload.cloud.accelerators import Accelerator, CompileTopology, larger_slices
from payload.core.errors import UserError
from payload.core.families import FAMILIES
from payload.core.fit.sharding import GIB, ShardingPlan, arrangement, compiler_trials, plan_sharding
from payload.core.fit.workload import Workload
from payload.core.sizes import count_parameters
from payload.engines.jax.kernels import Runtime
from payload.engines.jax.step import TrainProgram, compute_dtype, make_mesh
from payload.training.runplan import row_flops, run_architecture

# What the compiler reports running out of memory with.
_OUT_OF_MEMORY = re.compile(r"RESOURCE_EXHAUSTED|[Oo]ut of memory|exceeds? .*memory")


def compile_for_tpu(config, acc: Accelerator, target: CompileTopology) -> dict:
    """Compile the run's steps for `acc`'s slice as `target` lays it out. Returns the report
    (plain data: the stage prints it as JSON); a program that fits no arrangement the compiler
    was asked about is a UserError naming what would fit."""
    from jax.experimental import topologies

    began = time.monotonic()
    topology = topologies.get_topology_desc(
        platform="tpu", topology_name=target.name, chip_config_name=target.chip_config,
        chips_per_host_bounds=target.chips_per_host_bounds, num_slices=target.num_slices)
    devices = list(topology.devices)
    architecture = run_architecture(config)
    num_params = count_parameters(architecture).total
    hbm = acc.hbm_bytes_per_device
    workload = Workload.of(architecture, model=config.model, data=config.data,
                           train=config.train, platform="tpu", generation=acc.generation)

    def plan(remat: str) -> ShardingPlan:
        """What the run's trainer would choose with train.remat `remat` (the estimate)."""
        return plan_sharding(num_params, num_devices=len(devices), hbm_bytes_per_chip=hbm,
                             optimizer=config.train.optimizer, where=acc.name,
                             workload=replace(workload, remat=remat),
                             larger=larger_slices(acc.name), num_slices=target.num_slices)

    def laid_out(remat: str) -> ShardingPlan:
        """How the trainer lays the step out with train.remat `remat`, fitting or not."""
        return arrangement(num_params, num_devices=len(devices), hbm_bytes_per_chip=hbm,
                           optimizer=config.train.optimizer,
                           workload=replace(workload, remat=remat),
                           num_slices=target.num_slices)

    def compiled(arranged: ShardingPlan) -> dict:
        return _compile_train(config, architecture, arranged, devices, acc, workload) | {
            "plan": arranged}

    estimated = plan(workload.remat)  # an estimate that fits nothing is refused here, uncompiled
    train = compiled(estimated)
    chosen = estimated
    if workload.remat == "auto":  # the compiler's figure chooses
        found = _first_that_fits(compiled, compiler_trials(estimated, laid_out,
                                                           estimated_fits=train["fits"]))
        if found is not None:
            train, chosen = found, found["plan"]
    if not train["fits"]:
        # A named policy that does not fit: the heavier ones the compiler fits, to name one.
        later = [] if workload.remat == "auto" else compiler_trials(estimated, laid_out,
                                                                    estimated_fits=False)
        raise _does_not_fit(estimated, train, _first_that_fits(compiled, later), acc=acc,
                            workload=workload, devices=len(devices))
    train.pop("plan")
    evaluation = _compile_eval(config, architecture, chosen, devices, acc, workload)
    flops_formula = row_flops(config, architecture).total * config.train.batch_size
    return {
        "accelerator": acc.name, "generation": acc.generation, "topology": target.name,
        "slices": target.num_slices, "chips": acc.chips * target.num_slices,
        "devices": len(devices), "device_kind": devices[0].device_kind,
        "hbm_bytes_per_device": hbm,
        "mesh": {"data": chosen.data, "fsdp": chosen.fsdp}, "remat": chosen.remat,
        "estimate_bytes": chosen.total_bytes_per_chip,
        "chosen_by": "estimate" if chosen == estimated else "compiler",
        "estimate_choice": {"remat": estimated.remat, "fsdp": estimated.fsdp},
        "train": train, "eval": evaluation,
        "flops_per_step_formula": flops_formula,
        "seconds": round(time.monotonic() - began, 1),
    }


# --- one program -----------------------------------------------------------------------------


def _program(config, architecture: dict, plan: ShardingPlan, devices, acc) -> TrainProgram:
    mesh = make_mesh(plan, devices=devices)
    runtime = Runtime(platform="tpu", generation=acc.generation, mesh=mesh, remat=plan.remat)
    return TrainProgram(architecture, family=config.model.family, train_cfg=config.train,
                        mesh=mesh, dtype=compute_dtype(config.train.bf16, "tpu"),
                        runtime=runtime)


def abstract_batch(family: str, workload: Workload, sharding) -> dict:
    """The global batch the input pipeline gives the step (payload.data.objectives), as shapes
    placed where the step takes them."""
    rows, length = workload.batch_size, workload.seq_len

    def of(width: int, dtype=jnp.int32):
        return jax.ShapeDtypeStruct((rows, width), dtype, sharding=sharding)

    objective = FAMILIES[family].objective
    batch = {"input_ids": of(length), "attention_mask": of(length)}
    if objective == "mlm":
        predicted = workload.predicted_len
        return batch | {"masked_positions": of(predicted), "masked_ids": of(predicted),
                        "masked_weights": of(predicted, jnp.float32)}
    if objective == "clm":
        return batch | {"labels": of(length)}
    target = workload.target_len
    return batch | {"decoder_input_ids": of(target), "labels": of(target)}


def _compile_train(config, architecture, plan, devices, acc, workload) -> dict:
    program = _program(config, architecture, plan, devices, acc)
    batch = abstract_batch(config.model.family, workload, program.batch_sharding)
    return _compiled(lambda: program.train_step.lower(program.abstract_state(), batch),
                     devices=len(devices), hbm=plan.hbm_bytes_per_chip)


def _compile_eval(config, architecture, plan, devices, acc, workload) -> dict:
    program = _program(config, architecture, plan, devices, acc)
    batch = abstract_batch(config.model.family, workload, program.batch_sharding)
    params = program.abstract_state().params
    return _compiled(lambda: program.eval_step.lower(params, batch), devices=len(devices),
                     hbm=plan.hbm_bytes_per_chip)


def _compiled(lower, *, devices: int, hbm: int) -> dict:
    """One program through the TPU compiler: its memory per device, FLOPs, kernels, time; a
    compile that runs out of memory is reported as not fitting, any other failure is one line
    with the compiler's reason."""
    began = time.monotonic()
    try:
        compiled = lower().compile()
    except Exception as exc:  # the compiler's errors have no common type
        reason = _first_line(str(exc))
        if _OUT_OF_MEMORY.search(str(exc)):
            return {"fits": False, "hbm_bytes": None, "compiler": reason,
                    "compile_s": round(time.monotonic() - began, 1)}
        raise UserError(f"the TPU compiler refused the training program: {reason}",
                        hint="set TPUCTL_DEBUG=1 for the whole message") from exc
    seconds = time.monotonic() - began
    memory = compiled.memory_analysis()
    parts = {"arguments": memory.argument_size_in_bytes,
             "temporaries": memory.temp_size_in_bytes,
             "outputs": memory.output_size_in_bytes,
             "aliased": memory.alias_size_in_bytes}
    total = parts["arguments"] + parts["temporaries"] + parts["outputs"] - parts["aliased"]
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return {"fits": total <= hbm, "hbm_bytes": total, "memory": parts,
            "flops_per_device": float((cost or {}).get("flops", 0.0)),
            "flops": float((cost or {}).get("flops", 0.0)) * devices,
            "kernels": kernels_in(compiled.as_text()), "compile_s": round(seconds, 1)}


def kernels_in(hlo: str) -> dict[str, int]:
    """The Pallas TPU kernels a compiled program calls, by kind ("splash": its forward and
    backward kernels; "other"), from the custom calls' op names."""
    found: dict[str, int] = {}
    for match in re.finditer(r'custom_call_target="tpu_custom_call"', hlo):
        tail = hlo[match.end():match.end() + 4000]
        name = re.search(r'op_name="([^"]*)"', tail)
        kind = "splash" if name and "splash" in name.group(1) else "other"
        found[kind] = found.get(kind, 0) + 1
    return found


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[0] if lines else "no reason given")[:400]


def _first_that_fits(compiled, arrangements) -> dict | None:
    """The compiled train step (with its "plan") of the first of `arrangements` the compiler
    says fits; None if none does."""
    for arranged in arrangements:
        found = compiled(arranged)
        if found["fits"]:
            return found
    return None


def _does_not_fit(chosen: ShardingPlan, train: dict, fitting: dict | None, *,
                  acc: Accelerator, workload: Workload, devices: int) -> UserError:
    needs = (f"{train['hbm_bytes'] / GIB:.2f} GiB per chip" if train["hbm_bytes"] else
             f"more than it has ({train['compiler']})")
    ways = []
    if fitting is not None:
        ways.append(f"train.remat: {fitting['plan'].remat} (compiled: "
                    f"{fitting['hbm_bytes'] / GIB:.2f} GiB per chip)")
    if workload.batch_size // devices > 1:
        ways.append(f"a smaller train.batch_size (below {workload.batch_size})")
    bigger = [name for name, _ in larger_slices(acc.name)][:1]
    if bigger:
        ways.append(f"{bigger[0]} or larger")
    ways.append("a shorter data.seq_len or a smaller model")
    layout = "no FSDP" if chosen.fsdp == 1 else f"FSDP over {chosen.fsdp} devices"
    return UserError(
        f"the TPU compiler says the training step does not fit {acc.name}: with train.remat "
        f"{chosen.remat} and {layout} (the plan's choice; its estimate was "
        f"{chosen.total_bytes_per_chip / GIB:.2f} GiB) it needs {needs}, and a chip has "
        f"{chosen.hbm_bytes_per_chip / GIB:.3g} GiB",
        hint="use " + "; or ".join(ways))

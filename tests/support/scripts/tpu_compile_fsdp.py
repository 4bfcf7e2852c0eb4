"""For tests/integration/test_tpu_compile.py: a tiny GPT-2 through the real TPU compiler
(TPU_LIBRARY_PATH names libtpu) on v5e:2x2, once replicated and once split FSDP over 2 devices,
then the run's own compile (train.remat none) against chips of 1 MiB. Prints one JSON line: the arguments' bytes per
device of both, the all-gathers in the FSDP program, and the refusal's one line."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from payload.stages.tpu_compile import compile_environment

os.environ.update(compile_environment("v5litepod-4"))

from payload.cloud.accelerators import accelerator, compile_topology
from payload.config import parse_config
from payload.core.errors import UserError, one_line
from payload.core.fit.sharding import ShardingPlan
from tests.support.jax_plans import config


def main() -> None:
    import jax
    from jax.experimental import topologies

    from payload.core.fit.workload import Workload
    from payload.engines.jax import tpu_compile
    from payload.engines.jax.kernels import Runtime
    from payload.engines.jax.step import TrainProgram, compute_dtype, make_mesh
    from payload.training.runplan import run_architecture

    acc = accelerator("v5litepod-4")
    target = compile_topology(acc)
    run = parse_config(config(Path(tempfile.mkdtemp()), cluster={
        "provider": "gcp", "project": "my-project", "zone": "us-west4-a",
        "accelerator_type": "v5litepod-4"}, data={"seq_len": 256},
        tokenizer={"kind": "bpe", "vocab_size": 1000},
        model={"family": "gpt2", "size": None, "hidden_size": 64, "num_layers": 2, "num_heads": 2,
               "intermediate_size": 128}, train={"batch_size": 8, "bf16": True, "remat": "none"}))
    devices = list(topologies.get_topology_desc(
        platform="tpu", topology_name=target.name, chip_config_name=target.chip_config,
        chips_per_host_bounds=target.chips_per_host_bounds).devices)
    arch = run_architecture(run)
    workload = Workload.of(arch, model=run.model, data=run.data, train=run.train,
                           platform="tpu", generation="v5e")

    def arguments(data: int, fsdp: int) -> tuple[int, str]:
        plan = ShardingPlan(data=data, fsdp=fsdp, state_bytes_per_chip=0,
                            hbm_bytes_per_chip=16 << 30)
        mesh = make_mesh(plan, devices=devices)
        program = TrainProgram(arch, family="gpt2", train_cfg=run.train, mesh=mesh,
                               dtype=compute_dtype(True, "tpu"), min_sharded_elements=1,
                               runtime=Runtime(platform="tpu", generation="v5e", mesh=mesh,
                                               remat="full"))
        batch = tpu_compile.abstract_batch("gpt2", workload, program.batch_sharding)
        compiled = program.train_step.lower(program.abstract_state(), batch).compile()
        return compiled.memory_analysis().argument_size_in_bytes, compiled.as_text()

    replicated, _ = arguments(4, 1)
    sharded, hlo = arguments(2, 2)
    real_plan = tpu_compile.plan_sharding
    tpu_compile.plan_sharding = lambda *a, **k: replace(real_plan(*a, **k),
                                                        hbm_bytes_per_chip=1 << 20)
    try:
        tpu_compile.compile_for_tpu(run, acc, target)
        refusal = "it fitted"
    except UserError as exc:
        refusal = one_line(str(exc))
    print(json.dumps({"replicated_arguments": replicated, "fsdp_sharded_arguments": sharded,
                      "all_gathers": hlo.count("all-gather"), "refusal": refusal}))
    jax.clear_caches()


if __name__ == "__main__":
    main()

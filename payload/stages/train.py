"""The train stage: shards in, checkpoints, TensorBoard events and metrics.json out.

    python -m payload train --config run.yaml [--worker-index I --num-workers N] [--resume]
    run_train(config, worker_index=0, num_workers=1, resume=False, hardware=CPU)

Plan how training is distributed (payload.training.strategy), check everything first (manifest,
shards, tokenizer, sizes, checkpoints: a mistake is one line and nothing is written), build the
engine's trainer (`train.engine`, payload.engines), run the loop every engine shares
(payload.training.loop), then leave together (payload.training.leaving).
"""

from __future__ import annotations

import os

from payload.core import ownership
from payload.core.engines import engine_spec
from payload.engines import build_trainer
from payload.training import checkpoints, loop
from payload.training.inputs import check_inputs, with_data_order
from payload.training.leaving import leave_together
from payload.training.strategy import CPU, Hardware, cluster_facts, plan_strategy
from payload.training.voice import log, speak_for_training


def run_train(
    config,
    *,
    worker_index: int = 0,
    num_workers: int = 1,
    resume: bool = False,
    overwrite: bool = False,
    hardware: Hardware = CPU,
    new_data_order: bool = False,
) -> None:
    checkpoints.check_flags(resume=resume, overwrite=overwrite)
    engine = engine_spec(config.train.engine)
    plan = plan_strategy(cluster_facts(hardware, worker_index=worker_index,
                                       num_workers=num_workers, engine=engine.name))
    # Before anything imports a framework: TPU_LOAD_LIBRARY is read when TensorFlow loads.
    os.environ.update(plan.env)
    speak_for_training(is_chief=plan.is_chief)
    if not plan.runs_training:
        log(f"worker {worker_index}: this host serves the TPU runtime; worker 0 drives training",
            own=True)
        return
    ownership.check_output_dir(config.output_dir)
    inputs = check_inputs(config)
    checkpoints.check_start(config.output_dir, resume=resume, overwrite=overwrite,
                            engine=engine.name)
    if resume:
        checkpoints.check_resume(config.output_dir, inputs.identity)
    # The input order from the step the run starts at (the newest checkpoint's on a resume).
    inputs = with_data_order(config, inputs, resume=resume,
                             start=checkpoints.newest_step(config.output_dir) or 0,
                             allow_change=new_data_order)
    if plan.is_chief:
        ownership.claim_output_dir(config.output_dir)
    trainer = build_trainer(config, inputs, plan)
    from payload.training.utilisation import meter_for

    meter = meter_for(config, inputs.hf_config, hardware, devices=trainer.devices,
                      drives_tpu=trainer.drives_tpu, cpu_peak=trainer.cpu_peak_flops)
    log(f"model FLOPs per step {meter.flops_per_step:.3g}; peak: {meter.peak_source}")
    loop.train(config, inputs, trainer, plan, meter=meter, resume=resume)
    # With the trainer (and its input iterator) still alive.
    leave_together(trainer.coordination(), is_chief=plan.is_chief)

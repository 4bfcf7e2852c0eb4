"""What a job's stages would refuse in the checkpoints an earlier run left, found before the job
starts: the launcher runs this on worker 0 (launcher.job_control.preflight), which sees
output_dir as the stages will.

    python -m payload check --config run.yaml --stages train,export --resume
    run_preflight(config, stages=[Stage.EXPORT], resume=False)

The newest checkpoint is restored once, as `--resume` (the whole train state) or the export (its
weights) would restore it, and dropped: a truncated step or another model's is the stages' own
one line (payload.training.checkpoints.restore_newest), exit status 2, before the tokenizer or
prepare run and before anything is written (no run lock, no log, no TensorBoard file).
"""

from __future__ import annotations

from collections.abc import Collection

from payload.core import ownership
from payload.core.stages import Stage
from payload.training import checkpoints
from payload.training.preflight import check_stage_inputs


def run_preflight(config, *, stages: Collection[Stage], resume: bool) -> None:
    stages = set(stages)
    out = config.output_dir
    ownership.check_output_dir(out)
    check_stage_inputs(config, stages)
    if Stage.TRAIN in stages and resume:
        from payload.engines import check_resumable
        from payload.training.inputs import run_model

        checkpoints.check_start(out, resume=True, overwrite=False, engine=config.train.engine)
        hf_config, identity = run_model(config)
        checkpoints.check_resume(out, identity)
        check_resumable(config.train.engine, config, hf_config)
    elif Stage.EXPORT in stages and Stage.TRAIN not in stages:
        from payload.stages.export import trained_weights

        trained_weights(config)

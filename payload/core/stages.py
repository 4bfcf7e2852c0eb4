"""The pipeline's stages by name, and which share of the work a worker takes: spelled once here.

    for stage in Stage: print(stage.value)   # tokenizer, prepare, train, export, publish
    check_share(worker_index=1, num_workers=3)         # a UserError when out of range

`python -m payload STAGE`, the launcher's plan and the pre-flight checks all name stages
through `Stage`, so a new stage is added in one place.
"""

from __future__ import annotations

from enum import Enum

from payload.core.errors import UserError


class Stage(str, Enum):
    TOKENIZER = "tokenizer"
    PREPARE = "prepare"
    TRAIN = "train"
    EXPORT = "export"
    PUBLISH = "publish"  # model/ to a Hub repository; planned only when hub.repo is set


STAGE_NAMES = tuple(s.value for s in Stage)
# `python -m payload check --stages LIST [--resume]`: not a stage; what the launcher runs on
# worker 0 before a job whose stages read a checkpoint (payload.stages.preflight).
PREFLIGHT = "check"


def check_share(worker_index: int, num_workers: int) -> None:
    """Worker `worker_index` of `num_workers`: at least one worker, index in 0..N-1."""
    if num_workers < 1:
        raise UserError(f"--num-workers must be at least 1 (got {num_workers})")
    if not 0 <= worker_index < num_workers:
        raise UserError(
            f"--worker-index {worker_index} is out of range for --num-workers {num_workers}",
            hint=f"use 0..{num_workers - 1}",
        )

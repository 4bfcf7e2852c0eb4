"""TF_CONFIG and TPU facts the strategy tests share (tests/fast and tests/integration)."""

from __future__ import annotations

from payload.training import strategy
from payload.training.strategy import (
    Hardware,
)


def tf_config(index: int, workers: int = 2) -> str:
    return strategy.tf_config([f"localhost:{2000 + i}" for i in range(workers)], index)


def tpu(accelerator: str = "v4-8", name: str = "pod-run") -> Hardware:
    """What the launcher's gcp provider reports for a TPU node of this type and name."""
    return Hardware.tpu(accelerator, name)

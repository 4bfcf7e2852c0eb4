"""What the training core asks of an engine: a trainer for the loop, trained weights for export.

    trainer.start(resume=False); trainer.open_train(0)      # a Trainer, from payload.engines
    loss_sum, first_bad = trainer.train_chunk(10)
    weights_digest(trainer.weights())                       # the same on every process

The loop (payload.training.loop), leaving together (payload.training.leaving), the weights
digest and the export's one writer of model/ (payload.stages.export) are written once against
these; each engine (payload.engines.NAME) implements them with its framework. Weights cross
this seam under PyTorch transformers' names and layouts (payload.core.pytorch_weights), as
numpy arrays: the common currency of both engines.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from payload.training.leaving import Coordination


@dataclass(frozen=True)
class TrainedWeights:
    """A checkpoint's weights, restored on the exporting host: every parameter under its
    PyTorch name (no tied copies), float32 numpy."""

    state: dict
    hf_config: object  # the transformers config of the model
    checkpoint: str  # the path they came from


def weights_digest(state: dict) -> str:
    """A short hash of every weight, by name: the same on every process of a run in sync."""
    digest = hashlib.sha256()
    for _, value in sorted(state.items()):
        digest.update(np.ascontiguousarray(value, np.float32).tobytes())
    return digest.hexdigest()[:16]


class Trainer(Protocol):
    """One engine's side of the train stage: the model, its optimizer, the compiled steps over
    the shared input pipeline (RunInputs.pipeline), and its checkpoints. The shared loop
    decides when to train, evaluate, report, save and stop; a trainer only does it."""

    replicas: int  # data-parallel replicas (metrics.json's "replicas")
    devices: int  # what the meter divides throughput by: TPU chips, or CPU training processes
    drives_tpu: bool  # computes on TPU chips (the meter's peak is then the accelerator table's)
    latest: str | None  # the newest checkpoint (a path, for messages), None before the first
    init_source: str | None  # the file model.init_from's weights came from, once started
    # Seconds this process's training steps waited for their batches so far (the goodput's
    # data_loading); None for an engine that cannot see it (TensorFlow's steps take their
    # batches inside the compiled function).
    input_wait_s: float | None

    def start(self, *, resume: bool) -> int:
        """Restore the newest checkpoint (resume) or set model.init_from's weights (else the
        seeded initial ones stay); returns the step: the optimizer's update count."""

    def open_train(self, start_batch: int) -> None:
        """Start the training input at global batch `start_batch` (exact resume)."""

    def compile_step(self) -> dict | None:
        """Compile the training step before the first one runs, so the loop can say when
        compiling ends: {"compile_s": seconds, "cache": "hit" | "miss" | "off"} (from a
        persistent compilation cache or not); None for an engine that compiles in its first
        step."""

    def train_chunk(self, num_steps: int) -> tuple[float, int]:
        """Train `num_steps` steps: (the sum of their finite losses, the index in the chunk of
        the first step whose loss was not finite, or -1)."""

    def evaluate(self, num_batches: int) -> tuple[float, float, float]:
        """(summed cross-entropy, predicted tokens, correct predictions) over the first
        `num_batches` global batches of the validation split, the same ones every time."""

    def save(self, step: int) -> None:
        """Write a checkpoint of step `step` (every training process takes part)."""

    def anyone(self, flag: bool) -> bool:
        """Whether any training process says `flag` (all of them call it at the same step)."""

    def weights(self) -> dict:
        """Every parameter under its PyTorch name (no tied copies), whole, as numpy: on every
        process (a collective where the state is split over processes)."""

    def cpu_peak_flops(self) -> float:
        """FLOP/s of float32 matrix products on this process's CPU, in the engine's framework
        (payload.training.utilisation: the meter's peak when the engine drives no TPU)."""

    def close(self) -> None:
        """Release the checkpoint writer and scratch files."""

    def coordination(self) -> Coordination | None:
        """The coordination service the training processes leave through together
        (payload.training.leaving); None when this process trains alone."""

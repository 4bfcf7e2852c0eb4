"""What the training core asks of an engine: a trainer for the loop, trained weights for export.

    trainer.start(resume=False); trainer.open_train(0)      # a Trainer, from payload.engines
    loss_sum, first_bad = trainer.train_chunk(10)

The loop (payload.training.loop), the leaving together and the export's writer are written once
against these; each engine (payload.engines.NAME) implements them with its framework.
"""

from __future__ import annotations

from typing import Protocol


class TrainedWeights(Protocol):
    """A checkpoint's weights, restored on the exporting host."""

    checkpoint: str  # the path they came from
    hf_config: object  # the transformers config of the model

    def write(self, folder: str) -> None:
        """`model.safetensors` in PyTorch names and layouts (tied copies, metadata format "pt")
        and, where transformers' TF classes import, `tf_model.h5`."""


class Trainer(Protocol):
    """One engine's side of the train stage: the model, its optimizer, the compiled steps over
    the shared input pipeline, and its checkpoints. The shared loop decides when to train,
    evaluate, report, save and stop; a trainer only does it."""

    replicas: int  # data-parallel replicas (metrics.json's "replicas")
    devices: int  # what the meter divides throughput by: TPU chips, or CPU training processes
    drives_tpu: bool  # computes on TPU chips (the meter's peak is then the accelerator table's)
    latest: str | None  # the newest checkpoint (a path, for messages), None before the first
    init_source: str | None  # the file model.init_from's weights came from, once started

    def start(self, *, resume: bool) -> int:
        """Restore the newest checkpoint (resume) or set model.init_from's weights (else the
        seeded initial ones stay); returns the step: the optimizer's update count."""

    def open_train(self, start_batch: int) -> None:
        """Start the training input at global batch `start_batch` (exact resume)."""

    def train_chunk(self, num_steps: int) -> tuple[float, int]:
        """Train `num_steps` steps: (the sum of their finite losses, the index in the chunk of
        the first step whose loss was not finite, or -1)."""

    def evaluate(self, num_batches: int) -> tuple[float, float, float]:
        """(summed cross-entropy, predicted tokens, correct predictions) over the first
        `num_batches` global batches of the validation split, the same ones every time."""

    def save(self, step: int) -> None:
        """Write a checkpoint of step `step` (every training process takes part)."""

    def learning_rate(self, step: int) -> float:
        """The rate the optimizer applied at step `step` (1-based)."""

    def anyone(self, flag: bool) -> bool:
        """Whether any training process says `flag` (all of them call it at the same step)."""

    def weights_digest(self) -> str:
        """A short hash of every weight: the same on every process of a run in sync."""

    def close(self) -> None:
        """Release the checkpoint writer and scratch files."""

    def leave(self) -> None:
        """End a multi-process run together (a barrier, then exit); returns at once otherwise."""

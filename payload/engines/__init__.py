"""The training engines and the one seam the stages reach them through (`train.engine`).

    engine = engine_for(config.train.engine)        # "tensorflow" or "jax"; imports no framework
    trainer = engine.trainer(config, inputs, plan)  # the train stage's model, steps, checkpoints
    engine.newest_step(output_dir)                  # the launcher's and agent's question, no framework
    weights = engine.trained_weights(config, hf_config)   # export stage: restored, nothing written
    weights.write(staging_folder)                         # model.safetensors (+ tf_model.h5)

Everything that is not the model, the step and the checkpoint format is shared and lives in the
stage modules (payload.training.*): the config, shards and input order, the run plan, progress
records, metrics.json, TensorBoard, budget stops, the complete markers, the export folder. An
engine is a module `payload.engines.NAME` whose `ENGINE` attribute satisfies `Engine`; importing
`payload.engines` never imports TensorFlow or JAX, and one engine never imports the other's
framework.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol

from payload.core.errors import UserError

# train.engine -> the module that holds its ENGINE. The config's Literal lists the same names.
ENGINES = {
    "tensorflow": "payload.engines.tensorflow.engine",
    "jax": "payload.engines.jax.engine",
}
DEFAULT = "tensorflow"
# Engines that can split the training state over a slice's chips (FSDP), by the module of their
# framework-free plan; any other engine keeps a whole copy on every replica.
SHARDING_PLANS = {"jax": "payload.engines.jax.sharding"}


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What one training step computes, for an engine's memory plan: the model (a transformers
    config dict), the global batch, the lengths (T5's target, the positions the head predicts
    per row), bf16, train.remat, and the platform and TPU generation it runs on."""

    architecture: dict
    batch_size: int
    seq_len: int
    target_len: int | None
    predicted_len: int
    bf16: bool
    remat: str
    platform: str
    generation: str | None = None

    @classmethod
    def of(cls, architecture: dict, *, model, data, train, platform: str,
           generation: str | None = None) -> Workload:
        """From a run config's model, data and train sections."""
        from payload.core.families import span_corruption_lengths, t5_expanded_length
        from payload.data.objectives import max_predictions

        seq_len, family = data.seq_len, model.family
        target = None
        if family == "t5":
            expanded = t5_expanded_length(seq_len, model.noise_density,
                                          model.mean_noise_span_length)
            target = span_corruption_lengths(expanded, model.noise_density,
                                             model.mean_noise_span_length)[1]
        predicted = {"t5": target, "gpt2": seq_len - 1}.get(
            family, max_predictions(seq_len, model.mlm_probability))
        return cls(architecture=architecture, batch_size=train.batch_size, seq_len=seq_len,
                   target_len=target, predicted_len=predicted, bf16=train.bf16,
                   remat=train.remat, platform=platform,
                   generation=generation)


class TrainedWeights(Protocol):
    """A checkpoint's weights, restored on the exporting host."""

    checkpoint: str  # the path they came from
    hf_config: object  # the transformers config of the model

    def write(self, folder: str) -> None:
        """`model.safetensors` in PyTorch names and layouts (tied copies, metadata format "pt")
        and, where transformers' TF classes import, `tf_model.h5`."""


class Trainer(Protocol):
    """One engine's side of the train stage: the model, its optimizer, the compiled steps over
    the shared input pipeline, and its checkpoints. The shared loop (payload.training.train)
    decides when to train, evaluate, report, save and stop; a trainer only does it."""

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


class Engine(Protocol):
    """What a stage asks of an engine."""

    name: str  # train.engine's value; recorded in checkpoints/run.json as "engine"
    # What `model.init_from` may bring in a model folder for this engine to read.
    init_from_files: tuple[str, ...]

    def trained_weights(self, config, hf_config) -> TrainedWeights:
        """The newest complete checkpoint in output_dir/checkpoints/, restored (a UserError
        when there is none); writes nothing."""

    def checkpoint_files(self, names: list[str]) -> list[str]:
        """Which of these paths under checkpoints/ are this engine's checkpoint files (what a
        fresh start may remove there, beside tpuctl's own), in the order to remove them: the
        files that make a checkpoint count (an index, a commit marker) first."""

    def newest_step(self, output_dir: str) -> int | None:
        """The step of the newest complete checkpoint in output_dir/checkpoints/ (None without
        one), read without importing the framework: the launcher's pre-flight asks."""

    def plan_lines(self, workload: Workload) -> list[str]:
        """What the run plan says of how this engine runs the step (the JAX engine: which
        attention kernel each attention call takes, and why); imports no framework."""

    def trainer(self, config, inputs, plan) -> Trainer:
        """This engine's trainer for a checked run (payload.training.train.RunInputs) under a
        strategy plan (payload.training.strategy.StrategyPlan). Imports the framework."""


def engine_for(name: str | None) -> Engine:
    """The engine called `name` (None: the default), its framework not yet imported."""
    name = name or DEFAULT
    if name not in ENGINES:
        raise UserError(f"train.engine '{name}' is not an engine",
                        hint=f"use one of {', '.join(ENGINES)}")
    return importlib.import_module(ENGINES[name]).ENGINE


def sharding_plan(name: str | None, num_params: int, *, num_devices: int,
                  hbm_bytes_per_chip: int, optimizer: str, where: str = "",
                  workload: Workload | None = None):
    """How engine `name` lays a model's training state over `num_devices` chips (a
    ShardingPlan: data parallel or FSDP over N, and with a `workload`, its activations and
    rematerialisation), None for an engine that only replicates; a state or step no
    arrangement fits is a UserError saying what it needs and has, and what would fit. Imports
    no framework: the run plan and the config check call it before anything runs."""
    module = SHARDING_PLANS.get(name or DEFAULT)
    if module is None:
        return None
    return importlib.import_module(module).plan_sharding(
        num_params, num_devices=num_devices, hbm_bytes_per_chip=hbm_bytes_per_chip,
        optimizer=optimizer, where=where, workload=workload)


def all_engines() -> list[Engine]:
    return [engine_for(name) for name in ENGINES]

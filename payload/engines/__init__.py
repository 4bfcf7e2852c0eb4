"""The training engines and the one seam the stages reach them through (`train.engine`).

    engine = engine_for(config.train.engine)        # "tensorflow" or "jax"; imports no framework
    trainer = engine.trainer(config, inputs, plan=..., hardware=..., meter=...)   # train stage
    checkpoint = engine.write_weights(config, staging_folder)                     # export stage

Everything that is not the model, the step and the checkpoint format is shared and lives in the
stage modules (payload.training.*): the config, shards and input order, the run plan, progress
records, metrics.json, TensorBoard, budget stops, the complete markers, the export folder. An
engine is a module `payload.engines.NAME` whose `ENGINE` attribute satisfies `Engine`; importing
`payload.engines` never imports TensorFlow or JAX, and one engine never imports the other's
framework.
"""

from __future__ import annotations

import importlib
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


class Engine(Protocol):
    """What a stage asks of an engine."""

    name: str  # train.engine's value; recorded in checkpoints/run.json as "engine"

    def checkpoint_written(self, relative: str) -> bool:
        """Whether a path under checkpoints/ is one of this engine's checkpoint files (what a
        fresh start may remove there, with tpuctl's own run.json/schedule.json/marker)."""

    def has_checkpoint(self, output_dir: str) -> bool:
        """Whether checkpoints/ holds at least one complete checkpoint of this engine (without
        importing the framework: the launcher's pre-flight asks)."""


def engine_for(name: str | None) -> Engine:
    """The engine called `name` (None: the default), its framework not yet imported."""
    name = name or DEFAULT
    if name not in ENGINES:
        raise UserError(f"train.engine '{name}' is not an engine",
                        hint=f"use one of {', '.join(ENGINES)}")
    return importlib.import_module(ENGINES[name]).ENGINE


def sharding_plan(name: str | None, num_params: int, *, num_devices: int,
                  hbm_bytes_per_chip: int, optimizer: str, where: str = ""):
    """How engine `name` lays a model's training state over `num_devices` chips (a
    ShardingPlan: data parallel or FSDP over N), None for an engine that only replicates; a
    state no arrangement fits is a UserError saying what it needs and has. Imports no
    framework: the run plan and the config check call it before anything runs."""
    module = SHARDING_PLANS.get(name or DEFAULT)
    if module is None:
        return None
    return importlib.import_module(module).plan_sharding(
        num_params, num_devices=num_devices, hbm_bytes_per_chip=hbm_bytes_per_chip,
        optimizer=optimizer, where=where)

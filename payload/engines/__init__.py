"""The training engines, each a folder behind one interface, loaded by its spec.

    trainer = build_trainer(config, inputs, plan)    # config.train.engine's; imports its framework
    weights = trained_weights("jax", config, hf_config)   # the export's: restored, nothing written
    weights.write(staging_folder)                    # model.safetensors (+ tf_model.h5)
    check_resumable("jax", config, hf_config)        # the launcher's pre-flight of --resume
    report = compile_for_tpu(config, acc, topology)  # the steps through the TPU compiler

An engine is a folder payload.engines.NAME whose `engine` module has three functions, `trainer`,
`trained_weights` and `check_resumable` (and `compile_for_tpu` where it can compile for a TPU
here), giving what payload.training.trainer describes (a Trainer, a
TrainedWeights). Everything that is not the model, the step and the checkpoint format is shared
and lives below the engines, in the neutral core (payload.training: the loop, inputs, schedule,
checkpoint rules, metrics) and payload.core.engines (every fact about an engine that needs no
framework). Importing this package imports no framework, and no engine imports another.
"""

from __future__ import annotations

import importlib

from payload.core.engines import engine_spec
from payload.core.errors import UserError


def implementation(name: str | None):
    """The module of engine `name`'s entry points (its framework not yet imported); one line
    when its packages are not in this Python."""
    spec = engine_spec(name)
    spec.check_installed()
    return importlib.import_module(spec.implementation)


def build_trainer(config, inputs, plan):
    """config.train.engine's trainer for a checked run (payload.training.inputs.RunInputs)
    under a strategy plan (payload.training.strategy.StrategyPlan). Imports the framework."""
    return implementation(config.train.engine).trainer(config, inputs, plan)


def trained_weights(name: str | None, config, hf_config):
    """The newest complete checkpoint in output_dir/checkpoints/ as engine `name` wrote it,
    restored (a UserError when there is none); writes nothing."""
    return implementation(name).trained_weights(config, hf_config)


def compile_for_tpu(config, acc, topology) -> dict:
    """config.train.engine's steps compiled for the TPU slice `acc` laid out as `topology`
    (payload.cloud.accelerators.compile_topology), with the TPU compiler on this machine."""
    engine = implementation(config.train.engine)
    if not hasattr(engine, "compile_for_tpu"):
        raise UserError(f"the {config.train.engine} engine has no TPU compile check",
                        hint="the JAX engine has one: train.engine: jax")
    return engine.compile_for_tpu(config, acc, topology)


def check_resumable(name: str | None, config, hf_config) -> None:
    """The newest checkpoint engine `name` wrote restores as `--resume` would restore it, or
    the one line naming it and the newest intact one; writes nothing."""
    implementation(name).check_resumable(config, hf_config)

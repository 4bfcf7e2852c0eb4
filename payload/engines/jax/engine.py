"""The JAX engine's entry points, as payload.engines loads them (no JAX yet).

    trainer = trainer(config, inputs, plan)           # payload.training.trainer.Trainer
    weights = trained_weights(config, hf_config)      # the newest Orbax step, restored
    check_resumable(config, hf_config)                # what --resume restores, restored once
    report = compile_for_tpu(config, acc, topology)   # the steps through the TPU compiler

What needs no JAX (names, the Orbax step folders, the TPU route) is payload.core.engines'.
"""

from __future__ import annotations


def trainer(config, inputs, plan):
    from payload.engines.jax.trainer import JaxTrainer

    return JaxTrainer(config, inputs, plan)


def trained_weights(config, hf_config):
    from payload.engines.jax.export import trained_weights

    return trained_weights(config, hf_config)


def check_resumable(config, hf_config) -> None:
    from payload.engines.jax.export import check_resumable

    check_resumable(config, hf_config)


def compile_for_tpu(config, acc, topology) -> dict:
    from payload.engines.jax.tpu_compile import compile_for_tpu

    return compile_for_tpu(config, acc, topology)

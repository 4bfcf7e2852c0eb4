"""The TensorFlow engine's entry points, as payload.engines loads them (no TensorFlow yet).

    trainer = trainer(config, inputs, plan)           # payload.training.trainer.Trainer
    weights = trained_weights(config, hf_config)      # the newest checkpoint, restored
    check_resumable(config, hf_config)                # what --resume restores, read once

What needs no TensorFlow (names, checkpoint files, the TPU route) is payload.core.engines'.
"""

from __future__ import annotations


def trainer(config, inputs, plan):
    from payload.engines.tensorflow.trainer import TensorFlowTrainer

    return TensorFlowTrainer(config, inputs, plan)


def trained_weights(config, hf_config):
    from payload.engines.tensorflow.export import trained_weights

    return trained_weights(config, hf_config)


def check_resumable(config, hf_config) -> None:
    from payload.engines.tensorflow.export import check_resumable

    check_resumable(config, hf_config)

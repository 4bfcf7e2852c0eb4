"""What the TensorFlow engine's tests share: the model a run's newest checkpoint holds.

    model = checkpoint_model(config)     # TF, float32, restored as the export restores it
"""

from __future__ import annotations


def checkpoint_model(config):
    """The TF model of the run's newest checkpoint, restored straight from it (not through the
    export's PyTorch-named state), to hold what the export wrote against."""
    from payload.engines.tensorflow.export import restored_model
    from payload.stages.export import trained_weights

    model, _ = restored_model(config.output_dir, trained_weights(config).hf_config)
    return model

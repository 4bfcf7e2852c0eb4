"""The TensorFlow engine behind the seam (payload.engines.Engine): what the stages ask of it.

    from payload.engines import engine_for
    engine = engine_for("tensorflow")
"""

from __future__ import annotations


class TensorFlowEngine:
    name = "tensorflow"

    # --- export and init_from (payload/engines/tensorflow/export.py) -------------------------
    # transformers' own TF loader reads tf_model.h5; model.safetensors goes through the
    # PyTorch-name rule.
    init_from_files = ("model.safetensors", "tf_model.h5")

    def trained_weights(self, config, hf_config):
        from payload.engines.tensorflow.export import trained_weights

        return trained_weights(config, hf_config)


ENGINE = TensorFlowEngine()

"""The TensorFlow engine behind the seam (payload.engines.Engine): what the stages ask of it.

    from payload.engines import engine_for
    engine = engine_for("tensorflow")
    engine.newest_step(output_dir)            # from the checkpoint index, no TensorFlow
"""

from __future__ import annotations

from payload.engines.tensorflow import checkpoints


class TensorFlowEngine:
    name = "tensorflow"

    def checkpoint_files(self, names: list[str]) -> list[str]:
        return checkpoints.checkpoint_files(names)

    def newest_step(self, output_dir: str) -> int | None:
        return checkpoints.newest_step(output_dir)

    def plan_lines(self, workload) -> list[str]:
        return []  # tf.keras' attention and memory: nothing the plan chooses

    def trainer(self, config, inputs, plan):
        from payload.engines.tensorflow.trainer import TensorFlowTrainer

        return TensorFlowTrainer(config, inputs, plan)

    # --- export and init_from (payload/engines/tensorflow/export.py) -------------------------
    # transformers' own TF loader reads tf_model.h5; model.safetensors goes through the
    # PyTorch-name rule.
    init_from_files = ("model.safetensors", "tf_model.h5")

    def trained_weights(self, config, hf_config):
        from payload.engines.tensorflow.export import trained_weights

        return trained_weights(config, hf_config)


ENGINE = TensorFlowEngine()

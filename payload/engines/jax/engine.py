"""The JAX engine behind the seam (payload.engines.Engine): what the stages ask of it.

    from payload.engines import engine_for
    engine = engine_for("jax")
"""

from __future__ import annotations


class JaxEngine:
    name = "jax"

    # --- export and init_from (payload/engines/jax/{export,pretrained}.py) --------------------
    # PyTorch names only: see payload/engines/jax/pretrained.py for why not tf_model.h5.
    init_from_files = ("model.safetensors",)

    def trained_weights(self, config, hf_config):
        from payload.engines.jax.export import trained_weights

        return trained_weights(config, hf_config)


ENGINE = JaxEngine()

"""The JAX engine: the four families as the project's own Flax modules (`models`).

    from payload.engines.jax.models import build_model
    model = build_model({"model_type": "gpt2", "vocab_size": 8000, "n_embd": 256}, seed=0)

Nothing here imports TensorFlow: a JAX worker only needs TensorFlow as an input library.
"""

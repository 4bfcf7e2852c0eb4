"""Fresh weights in seconds: drawn eagerly on the host's CPU, then placed straight into their
shardings, instead of one jitted program that builds the whole model (BERT-base: 287k
characters of HLO, 55 s of compile on a 2-core CPU, XLA's "very slow compile" alarm on a GPU).

    params = draw_params(hf_config, seed=0, dtype=jnp.bfloat16)     # numpy, on the host
    params = place(params, program.param_sharding)                  # jax arrays on the mesh

Every host draws the whole model from the same seed with the same threefry bits on its own
CPU, so every host holds the same values and takes its own shards of them; a restart draws
them again, identically. Each leaf is placed as its own buffer: eagerly built trees may share
one (Adam's two zero moments), and donating the state would then give one buffer twice.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from payload.engines.jax.models import build_model


def draw_params(hf_config, *, seed: int, dtype) -> nnx.State:
    """The model's initial float32 parameters as numpy arrays (an nnx.State under the PyTorch
    names), drawn on the host's CPU as the original implementations draw them."""
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        model = build_model(hf_config, seed=seed, dtype=dtype)
        params = nnx.state(model)
        return jax.tree.map(np.asarray, params)


def place(host_tree, shardings):
    """Each host array of `host_tree` as a global jax array with its sharding in `shardings`
    (a tree of the same structure): every device takes its block from this host's copy."""

    def put(value: np.ndarray, sharding) -> jax.Array:
        return jax.make_array_from_callback(value.shape, sharding,
                                            lambda index: np.array(value[index], copy=True))

    return jax.tree.map(put, host_tree, shardings)

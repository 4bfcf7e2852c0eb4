"""The JAX engine's optimizer is the TF engine's: the same learning rate at every step, weight
decay on exactly the intended parameters, and the same weights as tf_keras after a few updates."""

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("optax")

import jax
import jax.numpy as jnp
import optax

from payload.engines.jax import optimizer as jax_opt
from payload.engines.jax.models import build_model, state_dict
from payload.training.schedule import learning_rate_at
from tests.support.jax import SMALL, architecture


def train_cfg(**overrides):
    settings = {"learning_rate": 3e-3, "warmup_steps": 4, "steps": 12, "weight_decay": 0.01,
                "max_grad_norm": 1.0, "optimizer": "adamw"}
    return SimpleNamespace(**(settings | overrides))


@pytest.mark.parametrize("peak, warmup, total", [
    (3e-3, 4, 12), (1e-4, 0, 7), (5e-4, 10, 10), (2e-2, 1, 2), (1e-3, 100, 1000)])
def test_schedule_is_learning_rate_at_every_step(peak, warmup, total):
    counts = np.arange(total + 3)  # past the end too: the rate stays at zero
    rates = np.asarray(jax.jit(jax.vmap(jax_opt.schedule(peak, warmup, total)))(counts))
    expected = [learning_rate_at(peak, warmup, total, int(c)) for c in counts]
    np.testing.assert_allclose(rates, expected, rtol=1e-6, atol=0)


def test_applied_rate_follows_the_schedule_through_the_optimizer():
    # The rate the optimizer itself applies: SGD-like probe with Adam's direction removed.
    cfg = train_cfg(weight_decay=0.0)
    tx = optax.chain(optax.scale_by_learning_rate(jax_opt.learning_rate(cfg)))
    params = {"w": jnp.zeros([])}
    state = tx.init(params)
    for count in range(cfg.steps):
        updates, state = tx.update({"w": jnp.ones([])}, state, params)
        assert float(-updates["w"]) == pytest.approx(
            learning_rate_at(cfg.learning_rate, cfg.warmup_steps, cfg.steps, count), rel=1e-6)


def no_decay_expected(names_and_shapes) -> set[str]:
    """What the TF engine leaves undecayed, said independently of NO_DECAY's substrings: every
    vector (biases, layer-norm scales and shifts) and T5's relative position bias table."""
    return {name for name, shape in names_and_shapes
            if len(shape) == 1 or name.endswith("relative_attention_bias.weight")}


@pytest.mark.parametrize("family", ["bert", "roberta", "gpt2", "t5"])
def test_decay_mask_is_exactly_the_intended_parameters(family):
    from flax import nnx

    model = build_model(architecture(family, vocab_size=64, **SMALL))
    params = nnx.state(model, nnx.Param)
    mask = jax_opt.decay_mask(params)
    flags = {jax_opt.parameter_name(path): flag
             for path, flag in jax.tree_util.tree_leaves_with_path(mask)}
    shapes = {name: array.shape for name, array in state_dict(params).items()}
    assert set(flags) == set(shapes)  # one flag per parameter, under its PyTorch name
    undecayed = {name for name, flag in flags.items() if not flag}
    assert undecayed == no_decay_expected(shapes.items())
    # The embeddings and every matrix decay.
    assert flags[{"bert": "bert.embeddings.word_embeddings.weight",
                  "roberta": "roberta.embeddings.word_embeddings.weight",
                  "gpt2": "transformer.wte.weight", "t5": "shared.weight"}[family]]


def tf_keras_weights(cfg, initial: dict, grads: list[dict]) -> dict:
    """The weights tf_keras ends with: the TF engine's own optimizer (payload.engines.tensorflow.optimization)
    and its global-norm clipping (as the TF engine's step clips before apply_gradients)."""
    import os

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    from payload.engines.tensorflow.optimization import build_optimizer

    # TF scopes name variables with "/"; the exclusions match substrings, as in the model.
    variables = {k: tf.Variable(v, name=k.replace(".", "/")) for k, v in initial.items()}
    optimizer, _ = build_optimizer(cfg)
    names = sorted(variables)
    optimizer.build([variables[k] for k in names])
    for grad in grads:
        clipped, _ = tf.clip_by_global_norm([tf.constant(grad[k]) for k in names],
                                            cfg.max_grad_norm)
        optimizer.apply_gradients(zip(clipped, [variables[k] for k in names], strict=True))
    return {k: v.numpy() for k, v in variables.items()}


@pytest.mark.parametrize("kind", ["adamw", "adafactor"])
def test_updates_match_the_tf_engine(kind):
    rng = np.random.default_rng(0)
    initial = {
        "layer.dense.weight": rng.normal(size=(6, 5)).astype(np.float32),
        "layer.dense.bias": rng.normal(size=(6,)).astype(np.float32),
        "layer.LayerNorm.weight": rng.normal(size=(5,)).astype(np.float32),
        "wte.weight": 1e-4 * rng.normal(size=(7, 4)).astype(np.float32),  # tiny: eps_2 matters
    }
    # Large first gradients (clipped), then small ones (not).
    grads = [{k: (3.0 if i < 2 else 0.05) * rng.normal(size=v.shape).astype(np.float32)
              for k, v in initial.items()} for i in range(6)]
    cfg = train_cfg(optimizer=kind, weight_decay=0.1, learning_rate=0.05, warmup_steps=2, steps=6)
    tx = jax_opt.build_optimizer(cfg)
    params = {k: jnp.asarray(v) for k, v in initial.items()}
    state = tx.init(params)
    for grad in grads:
        updates, state = tx.update({k: jnp.asarray(v) for k, v in grad.items()}, state, params)
        params = optax.apply_updates(params, updates)
    assert int(jax_opt.update_count(state)) == len(grads)
    expected = tf_keras_weights(cfg, initial, grads)
    for name in initial:
        np.testing.assert_allclose(np.asarray(params[name]), expected[name], rtol=2e-5,
                                   atol=1e-6, err_msg=name)

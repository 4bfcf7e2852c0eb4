"""The JAX engine's loss over the vocabulary, a chunk of positions at a time: the same sums and
gradients as the plain loss over whole float32 logits, for any chunk length and every family's
step, and a compiled step that never holds the whole [B, T, V] of logits."""

import numpy as np
import pytest

pytest.importorskip("optax")

import jax
import jax.numpy as jnp

from payload.core.fit.sharding import plan_sharding
from payload.engines.jax import loss
from payload.engines.jax import step as jax_step
from payload.engines.jax.models.layers import Projection

B, T, D, V = 3, 37, 16, 101


def problem(seed=0, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    weight = jnp.asarray(rng.normal(size=(V, D)) * 0.3, jnp.float32)
    bias = jnp.asarray(rng.normal(size=(V,)), jnp.float32)
    labels = rng.integers(0, V, (B, T))
    labels[rng.random((B, T)) < 0.3] = loss.IGNORE_INDEX  # nothing to predict there
    return x, jnp.asarray(labels, jnp.int32), weight, bias


def plain(x, labels, weight, bias, dtype=jnp.float32):
    return jax_step.loss_sums(Projection(weight, bias, dtype)(x), labels)


def chunked(x, labels, weight, bias, chunk, dtype=jnp.float32):
    return loss.loss_sums(x, labels, Projection(weight, bias, dtype), chunk=chunk)


def mean_loss(sums):
    xent, count, _ = sums
    return xent / count


@pytest.mark.parametrize("chunk", [1, 5, 36, 37, 64])
def test_chunked_sums_and_gradients_are_the_plain_losss(chunk):
    x, labels, weight, bias = problem()
    want = plain(x, labels, weight, bias)
    got = chunked(x, labels, weight, bias, chunk)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    assert float(got[1]) == float(want[1]) and float(got[2]) == float(want[2])
    grads = jax.grad(lambda x, w, b: mean_loss(chunked(x, labels, w, b, chunk)),
                     argnums=(0, 1, 2))
    want_grads = jax.grad(lambda x, w, b: mean_loss(plain(x, labels, w, b)), argnums=(0, 1, 2))
    for name, a, b in zip(("x", "weight", "bias"), grads(x, weight, bias),
                          want_grads(x, weight, bias), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=name)


def test_bfloat16_products_stay_within_bfloat16_of_the_plain_loss():
    x, labels, weight, bias = problem(seed=1)
    want = mean_loss(plain(x, labels, weight, bias))
    got = mean_loss(chunked(x, labels, weight, bias, 8, dtype=jnp.bfloat16))
    assert float(got) == pytest.approx(float(want), rel=2e-2)
    grad = jax.grad(lambda w: mean_loss(chunked(x, labels, w, bias, 8, dtype=jnp.bfloat16)))
    want_grad = jax.grad(lambda w: mean_loss(plain(x, labels, w, bias)))(weight)
    # The weight's gradient sums over the chunks in float32 (the weight enters as float32).
    assert grad(weight).dtype == jnp.float32
    scale = float(jnp.abs(want_grad).max())
    assert float(jnp.abs(grad(weight) - want_grad).max()) <= 3e-2 * scale


def test_chunk_length_keeps_a_chunks_logits_within_the_budget():
    # GPT-2 small at seq 1024 and batch 32: 6.6 GB of logits whole, 256 MiB chunks.
    chunk = loss.chunk_length(32, 1023, 50257)
    assert chunk * 32 * 50257 * 4 <= loss.LOGITS_CHUNK_BYTES < (chunk + 1) * 32 * 50257 * 4
    assert loss.chunk_length(2, 10, 100) == 10  # small: one chunk
    assert loss.chunk_length(10**6, 10, 10**6) == 1  # never less than one position


def test_the_compiled_gradient_never_holds_the_whole_logits():
    batch, length, width, vocab = 4, 512, 32, 8192
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(batch, length, width)), jnp.float32)
    weight = jnp.asarray(rng.normal(size=(vocab, width)) * 0.1, jnp.float32)
    labels = jnp.asarray(rng.integers(0, vocab, (batch, length)), jnp.int32)
    whole_logits = batch * length * vocab * 4  # 64 MiB

    def temp_bytes(sums):
        fn = jax.jit(jax.grad(lambda x, w: mean_loss(sums(x, w)), argnums=(0, 1)))
        return fn.lower(x, weight).compile().memory_analysis().temp_size_in_bytes

    plain_bytes = temp_bytes(lambda x, w: plain(x, labels, w, None))
    chunked_bytes = temp_bytes(lambda x, w: chunked(x, labels, w, None, 32))
    assert plain_bytes >= whole_logits  # the plain loss holds them (and their gradient)
    assert chunked_bytes < whole_logits / 4, (chunked_bytes, plain_bytes)


@pytest.mark.parametrize("family", ["bert", "gpt2", "t5"])
def test_each_familys_step_loss_is_the_plain_loss_of_its_logits(family, tmp_path):
    """The train step's loss (chunked) against `predictions` + the plain `loss_sums`."""
    from flax import nnx

    from tests.support.configs import training_run_config
    from tests.support.jax import architecture

    raw = architecture(family, vocab_size=64, seq_len=16, hidden_size=32, num_layers=1,
                       num_heads=2, intermediate_size=64)
    train_cfg = training_run_config(tmp_path / "unused", family, steps=4).train
    plan = plan_sharding(1, num_devices=len(jax.devices()), hbm_bytes_per_chip=1 << 30)
    program = jax_step.TrainProgram(raw, family=family, train_cfg=train_cfg,
                                    mesh=jax_step.make_mesh(plan))
    params = program.init_state(seed=0).params
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 64, (4, 16)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 11:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    if family == "bert":
        batch |= {"masked_positions": rng.integers(0, 11, (4, 3)).astype(np.int32),
                  "masked_ids": rng.integers(5, 64, (4, 3)).astype(np.int32),
                  "masked_weights": np.array([[1, 1, 0]] * 4, np.float32)}
    elif family == "gpt2":
        batch["labels"] = np.where(mask > 0, ids, -100)
    else:
        labels = ids[:, :6]
        batch |= {"decoder_input_ids": np.pad(labels[:, :-1], ((0, 0), (1, 0))),
                  "labels": labels}

    def plain_loss(params):
        logits, labels = jax_step.predictions(nnx.merge(program.graphdef, params), batch,
                                              family=family)
        return mean_loss(jax_step.loss_sums(logits, labels))

    (value, _), grads = jax.value_and_grad(program._loss, has_aux=True)(params, batch, None)
    want, want_grads = jax.value_and_grad(plain_loss)(params)
    assert float(value) == pytest.approx(float(want), rel=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)

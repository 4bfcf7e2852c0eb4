"""The cross-entropy over the vocabulary a chunk of positions at a time, never the whole [B, T, V]
of float32 logits: GPT-2's 50,257 tokens at 1,024 positions are 6.6 GB of them for a batch of 32.

    x, labels, projection = ...            # model.features(...): what the projection takes
    xent, count, correct = loss_sums(x, labels, projection)   # float32 sums, as the plain loss

Each chunk's logits are the product in the model's compute dtype accumulated in float32, and
their log-sum-exp is float32 (when one chunk holds them all, that is the whole computation and
XLA differentiates it). Over several chunks the gradient is worked out in the same pass, chunk by chunk (the
loss is a sum, so its gradient is the softmax minus the one-hot, times the incoming scalar):
the pass keeps the gradients of the projection's input, weight (summed over the chunks in
float32) and bias, and the backward pass only scales them, so no chunk's logits are kept or
computed twice. At most one chunk's logits and their gradient live at a time. Chunks run along
the positions of every row, so a batch split over devices stays split. The plain loss
(payload.engines.jax.step.loss_sums over the full logits) is the reference the tests hold this
to, value and gradient.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp

from payload.core.fit.memory import LOGITS_CHUNK_BYTES, chunk_length  # noqa: F401

IGNORE_INDEX = -100


def loss_sums(x: jax.Array, labels: jax.Array, projection, *, chunk: int | None = None):
    """(summed cross-entropy, predicted tokens, correctly predicted tokens), float32, of the
    logits `projection(x)` ([B, T, d] -> [B, T, V]) against `labels` [B, T] (-100: nothing to
    predict), computed `chunk` positions at a time (default: `chunk_length`). Differentiable in
    `x` and the projection's weight and bias (through the summed cross-entropy)."""
    batch, length, _ = x.shape
    vocab = projection.weight.shape[0]
    chunk = min(chunk or chunk_length(batch, length, vocab), length)
    bias = (projection.bias if projection.bias is not None
            else jnp.zeros((vocab,), jnp.float32))
    dtype = jnp.dtype(projection.dtype)
    if chunk == length:
        # One chunk holds it all: the logits are within the budget, and XLA's own gradient
        # of the plain form is the cheaper one (measured here: ~10% less work per step).
        sums = _piece_sums(x, labels, projection.weight.astype(dtype), bias, dtype)[0]
    else:
        sums = _sums(x, labels, projection.weight, bias, chunk, dtype)
    return sums[0], sums[1], sums[2]


def _piece_sums(x, labels, w, bias, dtype):
    """The three sums over one piece, and its float32 logits and log-sum-exp."""
    logits = jnp.einsum("bcd,vd->bcv", x.astype(dtype), w,
                        preferred_element_type=jnp.float32) + bias
    valid = labels != IGNORE_INDEX
    safe = jnp.where(valid, labels, 0)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, safe[..., None], axis=-1)[..., 0]
    xent = (lse - picked) * valid
    correct = (jnp.argmax(logits, axis=-1) == safe) & valid
    sums = jnp.stack([jnp.sum(xent), jnp.sum(valid, dtype=jnp.float32),
                      jnp.sum(correct, dtype=jnp.float32)])
    return sums, (logits, lse, safe, valid)


def _chunks(x, labels, chunk: int):
    """[pieces, B, chunk, ...] of x and labels, the last piece padded with nothing to predict."""
    batch, length, width = x.shape
    pieces = math.ceil(length / chunk)
    extra = pieces * chunk - length
    if extra:
        x = jnp.pad(x, ((0, 0), (0, extra), (0, 0)))
        labels = jnp.pad(labels, ((0, 0), (0, extra)), constant_values=IGNORE_INDEX)
    return (jnp.swapaxes(x.reshape(batch, pieces, chunk, width), 0, 1),
            jnp.swapaxes(labels.reshape(batch, pieces, chunk), 0, 1))


def _pass(x, labels, weight, bias, chunk: int, dtype, *, gradients: bool):
    """The sums, and with `gradients` those of the summed cross-entropy with respect to x,
    weight and bias, over every chunk."""
    xs, ys = _chunks(x, labels, chunk)
    w = weight.astype(dtype)

    def piece(carry, inputs):
        totals, grad_w, grad_b = carry
        x_chunk, y_chunk = inputs
        sums, (logits, lse, safe, valid) = _piece_sums(x_chunk, y_chunk, w, bias, dtype)
        totals = totals + sums
        if not gradients:
            return (totals, grad_w, grad_b), None
        # d(sum of xent) / d logits: softmax minus the one-hot, where there is a label.
        d_logits = jnp.exp(logits - lse[..., None])
        d_logits = (d_logits - jax.nn.one_hot(safe, logits.shape[-1], dtype=jnp.float32))
        d_logits = d_logits * valid[..., None]
        grad_x = jnp.einsum("bcv,vd->bcd", d_logits.astype(dtype), w,
                            preferred_element_type=jnp.float32).astype(x.dtype)
        grad_w = grad_w + jnp.einsum("bcv,bcd->vd", d_logits.astype(dtype),
                                     x_chunk.astype(dtype), preferred_element_type=jnp.float32)
        grad_b = grad_b + jnp.sum(d_logits, axis=(0, 1))
        return (totals, grad_w, grad_b), grad_x

    start = (jnp.zeros(3, jnp.float32),
             jnp.zeros(weight.shape, jnp.float32) if gradients else None,
             jnp.zeros(bias.shape, jnp.float32) if gradients else None)
    (totals, grad_w, grad_b), grad_xs = jax.lax.scan(piece, start, (xs, ys))
    if not gradients:
        return totals, None
    batch, length, width = x.shape
    grad_x = jnp.swapaxes(grad_xs, 0, 1).reshape(batch, -1, width)[:, :length]
    return totals, (grad_x, grad_w.astype(weight.dtype), grad_b.astype(bias.dtype))


@partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _sums(x, labels, weight, bias, chunk, dtype):
    return _pass(x, labels, weight, bias, chunk, dtype, gradients=False)[0]


def _sums_forward(x, labels, weight, bias, chunk, dtype):
    return _pass(x, labels, weight, bias, chunk, dtype, gradients=True)


def _sums_backward(chunk, dtype, grads, cotangent):
    del chunk, dtype
    grad_x, grad_w, grad_b = grads
    scale = cotangent[0]  # only the summed cross-entropy has a gradient
    return (grad_x * scale.astype(grad_x.dtype), None, grad_w * scale, grad_b * scale)


_sums.defvjp(_sums_forward, _sums_backward)

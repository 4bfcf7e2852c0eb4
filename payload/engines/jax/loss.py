"""The cross-entropy over the vocabulary a chunk of positions at a time, never the whole [B, T, V]
of float32 logits: GPT-2's 50,257 tokens at 1,024 positions are 6.6 GB of them for a batch of 32.

    x, labels, projection = ...            # model.features(...): what the projection takes
    xent, count, correct = loss_sums(x, labels, projection)   # float32 sums, as the plain loss

Each chunk's logits are the product in the model's compute dtype accumulated in float32, and
their log-sum-exp is float32; the chunk is rematerialised in the backward pass (it keeps only
its inputs), so at most one chunk's logits and their gradient live at a time. The gradient of
the projection's weight sums over the chunks in float32 (the weight enters as the float32
parameter and is cast inside each chunk). Chunks run along the positions of every row, so a
batch split over devices stays split. The plain loss (payload.engines.jax.step.loss_sums over
the full logits) is the reference the tests hold this to.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from payload.engines.jax.memory import LOGITS_CHUNK_BYTES, chunk_length  # noqa: F401

IGNORE_INDEX = -100


def loss_sums(x: jax.Array, labels: jax.Array, projection, *, chunk: int | None = None):
    """(summed cross-entropy, predicted tokens, correctly predicted tokens), float32, of the
    logits `projection(x)` ([B, T, d] -> [B, T, V]) against `labels` [B, T] (-100: nothing to
    predict), computed `chunk` positions at a time (default: `chunk_length`)."""
    batch, length, width = x.shape
    vocab = projection.weight.shape[0]
    chunk = min(chunk or chunk_length(batch, length, vocab), length)
    pieces = math.ceil(length / chunk)
    extra = pieces * chunk - length
    if extra:
        x = jnp.pad(x, ((0, 0), (0, extra), (0, 0)))
        labels = jnp.pad(labels, ((0, 0), (0, extra)), constant_values=IGNORE_INDEX)
    xs = jnp.swapaxes(x.reshape(batch, pieces, chunk, width), 0, 1)
    ys = jnp.swapaxes(labels.reshape(batch, pieces, chunk), 0, 1)
    weight, bias, dtype = projection.weight, projection.bias, projection.dtype

    @jax.checkpoint
    def piece(x_chunk, y_chunk, weight, bias):
        logits = jnp.einsum("bcd,vd->bcv", x_chunk.astype(dtype), weight.astype(dtype),
                            preferred_element_type=jnp.float32)
        if bias is not None:
            logits = logits + bias
        valid = y_chunk != IGNORE_INDEX
        safe = jnp.where(valid, y_chunk, 0)
        picked = jnp.take_along_axis(logits, safe[..., None], axis=-1)[..., 0]
        xent = (jax.nn.logsumexp(logits, axis=-1) - picked) * valid
        correct = (jnp.argmax(logits, axis=-1) == safe) & valid
        return jnp.stack([jnp.sum(xent), jnp.sum(valid, dtype=jnp.float32),
                          jnp.sum(correct, dtype=jnp.float32)])

    def add(total, inputs):
        return total + piece(*inputs, weight, bias), None

    total, _ = jax.lax.scan(add, jnp.zeros(3, jnp.float32), (xs, ys))
    return total[0], total[1], total[2]

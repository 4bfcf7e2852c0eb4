"""Building blocks that keep PyTorch's parameter names and layouts, so a model's parameter paths
are the transformers state-dict keys and export is a rename table with nothing to transpose.

    dense = Linear(768, 3072, std=0.02, rngs=rngs)   # weight [3072, 768], bias [3072]
    y = dense(x)                                      # x @ weight.T + bias

Parameters are float32; `dtype` is what the matmuls run in (bfloat16 on TPU). Normalisation and
softmax run in float32 whatever `dtype` is.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx

from payload.core.errors import UserError

# transformers' activation names (ACT2FN) for the ones these families use.
ACTIVATIONS = {
    "gelu": partial(jax.nn.gelu, approximate=False),
    "gelu_new": partial(jax.nn.gelu, approximate=True),
    "gelu_pytorch_tanh": partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}


def activation(name: str):
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise UserError(
            f"the JAX engine has no activation {name!r}",
            hint=f"use one of {', '.join(sorted(ACTIVATIONS))}",
        ) from None


def normal(rngs: nnx.Rngs, shape: tuple[int, ...], std: float) -> jax.Array:
    return std * jax.random.normal(rngs.params(), shape, jnp.float32)


class Linear(nnx.Module):
    """torch.nn.Linear: weight [out, in]."""

    def __init__(self, in_features: int, out_features: int, *, std: float, rngs: nnx.Rngs,
                 bias: bool = True, dtype=jnp.float32):
        self.weight = nnx.Param(normal(rngs, (out_features, in_features), std))
        self.bias = nnx.Param(jnp.zeros((out_features,), jnp.float32)) if bias else None
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jnp.einsum("...i,oi->...o", x.astype(self.dtype), self.weight[...].astype(self.dtype))
        return y if self.bias is None else y + self.bias[...].astype(self.dtype)


class Conv1D(nnx.Module):
    """GPT-2's transformers Conv1D: a dense layer stored the other way round, weight [in, out]."""

    def __init__(self, in_features: int, out_features: int, *, std: float, rngs: nnx.Rngs,
                 dtype=jnp.float32):
        self.weight = nnx.Param(normal(rngs, (in_features, out_features), std))
        self.bias = nnx.Param(jnp.zeros((out_features,), jnp.float32))
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        y = x.astype(self.dtype) @ self.weight[...].astype(self.dtype)
        return y + self.bias[...].astype(self.dtype)


class Embedding(nnx.Module):
    """torch.nn.Embedding; `attend` is the tied output projection onto the same matrix."""

    def __init__(self, num: int, features: int, *, std: float, rngs: nnx.Rngs,
                 padding_idx: int | None = None, dtype=jnp.float32):
        table = normal(rngs, (num, features), std)
        if padding_idx is not None and 0 <= padding_idx < num:
            # As torch's padding_idx does at init: the padding row starts at zero.
            table = table.at[padding_idx].set(0.0)
        self.weight = nnx.Param(table)
        self.dtype = dtype

    def __call__(self, ids: jax.Array) -> jax.Array:
        return jnp.take(self.weight[...], ids, axis=0).astype(self.dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        table = self.weight[...].astype(self.dtype)
        return jnp.einsum("...d,vd->...v", x.astype(self.dtype), table)


class LayerNorm(nnx.Module):
    """torch.nn.LayerNorm (biased variance), computed in float32."""

    def __init__(self, features: int, *, eps: float, dtype=jnp.float32):
        self.weight = nnx.Param(jnp.ones((features,), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((features,), jnp.float32))
        self.eps, self.dtype = eps, dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + self.eps) * self.weight[...] + self.bias[...]
        return y.astype(self.dtype)


class RMSNorm(nnx.Module):
    """T5's layer norm: scale only, no mean, no bias, computed in float32."""

    def __init__(self, features: int, *, eps: float, dtype=jnp.float32):
        self.weight = nnx.Param(jnp.ones((features,), jnp.float32))
        self.eps, self.dtype = eps, dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        y = x * jax.lax.rsqrt(jnp.square(x).mean(-1, keepdims=True) + self.eps)
        return (self.weight[...] * y).astype(self.dtype)


@dataclass(frozen=True)
class Projection:
    """A model's output projection onto the vocabulary: float32 `weight` [V, d] (the tied
    embeddings or its own head), float32 `bias` [V] or None, `dtype` the product's. Calling it
    gives the float32 logits; payload.engines.jax.loss applies it a chunk at a time instead."""

    weight: jax.Array
    bias: jax.Array | None
    dtype: object

    def __call__(self, x: jax.Array) -> jax.Array:
        logits = jnp.einsum("...d,vd->...v", x.astype(self.dtype), self.weight.astype(self.dtype))
        logits = logits.astype(jnp.float32)
        return logits if self.bias is None else logits + self.bias


class Noise:
    """Dropout for one forward pass: a fresh key per call site, in call order, drawn from one
    key; no key means no dropout (evaluation). Keeps the modules free of RNG state, so a train
    step passes the key in like any other input."""

    def __init__(self, key: jax.Array | None):
        self.key, self.count = key, 0

    @property
    def active(self) -> bool:
        return self.key is not None

    def __call__(self, x: jax.Array, rate: float) -> jax.Array:
        if self.key is None or rate == 0.0:
            return x
        self.count += 1
        keep = jax.random.bernoulli(jax.random.fold_in(self.key, self.count), 1.0 - rate, x.shape)
        return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


def split_heads(x: jax.Array, num_heads: int) -> jax.Array:
    return x.reshape(*x.shape[:-1], num_heads, x.shape[-1] // num_heads)


def merge_heads(x: jax.Array) -> jax.Array:
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])

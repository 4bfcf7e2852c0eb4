"""Llama (causal LM) in Flax NNX, with transformers' PyTorch parameter names and layouts:
rotary positions, RMSNorm, a SwiGLU feed-forward, grouped-query attention, no biases.

    model = LlamaForCausalLM(LlamaConfig.from_transformers(raw), rngs=nnx.Rngs(params=0))
    logits = model(input_ids, attention_mask)        # [B, T, V]; logits[:, t] predicts t + 1

Weights start as transformers' Llama does: every matrix normal(initializer_range), norms at 1.
The rotary embedding is transformers' default ("rotate half": the first and second halves of a
head are the pairs rotated), base rope_theta; other rope types (scaled, llama3) are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from payload.core.errors import UserError
from payload.engines.jax.kernels import CPU_REFERENCE, Mask, Runtime, attend, run_layer
from payload.engines.jax.models.layers import (
    Embedding,
    Linear,
    Noise,
    Projection,
    RMSNorm,
    activation,
)


@dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    hidden_act: str
    rms_norm_eps: float
    rope_theta: float
    attention_dropout: float
    initializer_range: float
    tie_word_embeddings: bool
    runtime: Runtime = CPU_REFERENCE  # platform, kernels, remat: how it runs, not what it is

    @classmethod
    def from_transformers(cls, raw: dict) -> LlamaConfig:
        """From a transformers LlamaConfig dict (4.x's rope_theta or 5.x's rope_parameters);
        missing keys take its defaults. What this model does not implement is refused."""

        def get(key, default):
            value = raw.get(key)
            return default if value is None else value

        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        rope_type = rope.get("rope_type") or rope.get("type") or "default"
        if rope_type != "default":
            raise UserError(f"the JAX engine's Llama has no rope type {rope_type!r}",
                            hint="use a config with the default rotary embedding")
        if raw.get("attention_bias") or raw.get("mlp_bias"):
            raise UserError("the JAX engine's Llama has no biases (attention_bias, mlp_bias)",
                            hint="use a config with attention_bias and mlp_bias false")
        hidden, heads = get("hidden_size", 4096), get("num_attention_heads", 32)
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=hidden,
            num_hidden_layers=get("num_hidden_layers", 32),
            num_attention_heads=heads,
            num_key_value_heads=get("num_key_value_heads", heads),
            head_dim=get("head_dim", hidden // heads),
            intermediate_size=get("intermediate_size", 11008),
            hidden_act=get("hidden_act", "silu"),
            rms_norm_eps=get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta") or get("rope_theta", 10000.0)),
            attention_dropout=get("attention_dropout", 0.0),
            initializer_range=get("initializer_range", 0.02),
            tie_word_embeddings=get("tie_word_embeddings", False),
        )


def rotary(length: int, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos and sin [T, head_dim] of positions 0..T-1, float32: frequency i of theta^(-2i/d),
    repeated for the two halves of a head."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = jnp.arange(length, dtype=jnp.float32)[:, None] * inv_freq[None]
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, T, H, D] rotated by position: x cos + rotate_half(x) sin, in x's dtype."""
    half = x.shape[-1] // 2
    turned = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos, sin = cos[None, :, None].astype(x.dtype), sin[None, :, None].astype(x.dtype)
    return x * cos + turned * sin


class _Attention(nnx.Module):
    def __init__(self, c: LlamaConfig, *, rngs: nnx.Rngs, dtype):
        std, h, d = c.initializer_range, c.hidden_size, c.head_dim
        heads, kv = c.num_attention_heads, c.num_key_value_heads
        self.q_proj = Linear(h, heads * d, std=std, rngs=rngs, bias=False, dtype=dtype)
        self.k_proj = Linear(h, kv * d, std=std, rngs=rngs, bias=False, dtype=dtype)
        self.v_proj = Linear(h, kv * d, std=std, rngs=rngs, bias=False, dtype=dtype)
        self.o_proj = Linear(heads * d, h, std=std, rngs=rngs, bias=False, dtype=dtype)
        self.config = c

    def __call__(self, x, rope, mask: Mask, noise: Noise) -> jax.Array:
        c = self.config
        shape = x.shape[:-1]
        q = self.q_proj(x).reshape(*shape, c.num_attention_heads, c.head_dim)
        k = self.k_proj(x).reshape(*shape, c.num_key_value_heads, c.head_dim)
        v = self.v_proj(x).reshape(*shape, c.num_key_value_heads, c.head_dim)
        q, k = rotate(q, *rope), rotate(k, *rope)
        out = attend(q, k, v, mask, scale=c.head_dim ** -0.5, noise=noise,
                     dropout=c.attention_dropout, runtime=c.runtime)
        return self.o_proj(out.reshape(*shape, c.num_attention_heads * c.head_dim))


class _MLP(nnx.Module):
    def __init__(self, c: LlamaConfig, *, rngs: nnx.Rngs, dtype):
        std, h, i = c.initializer_range, c.hidden_size, c.intermediate_size
        self.gate_proj = Linear(h, i, std=std, rngs=rngs, bias=False, dtype=dtype)
        self.up_proj = Linear(h, i, std=std, rngs=rngs, bias=False, dtype=dtype)
        self.down_proj = Linear(i, h, std=std, rngs=rngs, bias=False, dtype=dtype)
        self.act = activation(c.hidden_act)

    def __call__(self, x) -> jax.Array:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class _DecoderLayer(nnx.Module):
    def __init__(self, c: LlamaConfig, *, rngs: nnx.Rngs, dtype):
        self.input_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps, dtype=dtype)
        self.self_attn = _Attention(c, rngs=rngs, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps, dtype=dtype)
        self.mlp = _MLP(c, rngs=rngs, dtype=dtype)

    def __call__(self, x, rope, mask: Mask, noise: Noise) -> jax.Array:
        x = x + self.self_attn(self.input_layernorm(x), rope, mask, noise)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nnx.Module):
    def __init__(self, c: LlamaConfig, *, rngs: nnx.Rngs, dtype):
        self.embed_tokens = Embedding(c.vocab_size, c.hidden_size, std=c.initializer_range,
                                      rngs=rngs, dtype=dtype)
        self.layers = nnx.List([_DecoderLayer(c, rngs=rngs, dtype=dtype)
                                for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps, dtype=dtype)
        self.config = c

    def __call__(self, input_ids, attention_mask, noise: Noise) -> jax.Array:
        c = self.config
        # Positions count from the first column, as transformers does when no position_ids
        # are given: batches are right-padded.
        rope = rotary(input_ids.shape[1], c.head_dim, c.rope_theta)
        x = self.embed_tokens(input_ids)
        mask = Mask(padding=attention_mask, causal=True)
        for layer in self.layers:
            x = run_layer(layer, x, rope, mask, noise, remat=c.runtime.remat)
        return self.norm(x)


class LlamaForCausalLM(nnx.Module):
    Config = LlamaConfig
    # The tied head (unless untied) and old checkpoints' rotary buffers.
    IGNORED_KEYS = (r"lm_head\.weight", r"model\.(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq")

    def __init__(self, c: LlamaConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.model = LlamaModel(c, rngs=rngs, dtype=dtype)
        self.lm_head = (
            None if c.tie_word_embeddings
            else Linear(c.hidden_size, c.vocab_size, std=c.initializer_range, rngs=rngs,
                        bias=False, dtype=dtype))
        self.config = c

    def features(self, input_ids, attention_mask=None, *, dropout_rng=None
                 ) -> tuple[jax.Array, Projection]:
        """The last hidden states [B, T, d] and the vocabulary projection."""
        hidden = self.model(input_ids, attention_mask, Noise(dropout_rng))
        head = self.lm_head if self.lm_head is not None else self.model.embed_tokens
        return hidden, Projection(head.weight[...], None, head.dtype)

    def __call__(self, input_ids, attention_mask=None, *, dropout_rng=None) -> jax.Array:
        """Float32 logits [B, T, V]."""
        hidden, projection = self.features(input_ids, attention_mask, dropout_rng=dropout_rng)
        return projection(hidden)

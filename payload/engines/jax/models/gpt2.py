"""GPT-2 (causal LM) in Flax NNX, with transformers' PyTorch parameter names and layouts.

    model = GPT2LMHeadModel(GPT2Config.from_transformers(raw), rngs=nnx.Rngs(params=0))
    logits = model(input_ids, attention_mask)        # [B, T, V]; logits[:, t] predicts t + 1

Weights start as GPT-2's do: normal(0.02), with the two projections that write into the
residual stream (attn.c_proj, mlp.c_proj) scaled by 1/sqrt(2 * n_layer) (GPT-2 paper, 2.3).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from payload.engines.jax.kernels import CPU_REFERENCE, Mask, Runtime, attend, run_layer
from payload.engines.jax.models.layers import (
    Conv1D,
    Embedding,
    LayerNorm,
    Linear,
    Noise,
    Projection,
    activation,
    merge_heads,
    split_heads,
)


@dataclass(frozen=True, kw_only=True)
class GPT2Config:
    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int
    activation_function: str
    resid_pdrop: float
    embd_pdrop: float
    attn_pdrop: float
    layer_norm_epsilon: float
    initializer_range: float
    scale_attn_weights: bool
    scale_attn_by_inverse_layer_idx: bool
    tie_word_embeddings: bool
    runtime: Runtime = CPU_REFERENCE  # platform, kernels, remat: how it runs, not what it is

    @classmethod
    def from_transformers(cls, raw: dict) -> GPT2Config:
        """From a transformers GPT2Config dict; missing keys take its defaults."""

        def get(key, default):
            value = raw.get(key)
            return default if value is None else value

        n_embd = get("n_embd", 768)
        return cls(
            vocab_size=raw["vocab_size"],
            n_positions=get("n_positions", 1024),
            n_embd=n_embd,
            n_layer=get("n_layer", 12),
            n_head=get("n_head", 12),
            n_inner=get("n_inner", 4 * n_embd),
            activation_function=get("activation_function", "gelu_new"),
            resid_pdrop=get("resid_pdrop", 0.1),
            embd_pdrop=get("embd_pdrop", 0.1),
            attn_pdrop=get("attn_pdrop", 0.1),
            layer_norm_epsilon=get("layer_norm_epsilon", 1e-5),
            initializer_range=get("initializer_range", 0.02),
            scale_attn_weights=get("scale_attn_weights", True),
            scale_attn_by_inverse_layer_idx=get("scale_attn_by_inverse_layer_idx", False),
            tie_word_embeddings=get("tie_word_embeddings", True),
        )


class _Attention(nnx.Module):
    def __init__(self, c: GPT2Config, layer_idx: int, *, rngs: nnx.Rngs, dtype):
        std = c.initializer_range
        self.c_attn = Conv1D(c.n_embd, 3 * c.n_embd, std=std, rngs=rngs, dtype=dtype)
        self.c_proj = Conv1D(c.n_embd, c.n_embd, std=std / (2 * c.n_layer) ** 0.5, rngs=rngs,
                             dtype=dtype)
        scale = (c.n_embd // c.n_head) ** -0.5 if c.scale_attn_weights else 1.0
        if c.scale_attn_by_inverse_layer_idx:
            scale /= layer_idx + 1
        self.scale, self.config = scale, c

    def __call__(self, x, mask: Mask, noise: Noise) -> jax.Array:
        c = self.config
        q, k, v = (split_heads(t, c.n_head) for t in jnp.split(self.c_attn(x), 3, axis=-1))
        out = attend(q, k, v, mask, scale=self.scale, noise=noise, dropout=c.attn_pdrop,
                     runtime=c.runtime)
        return noise(self.c_proj(merge_heads(out)), c.resid_pdrop)


class _MLP(nnx.Module):
    def __init__(self, c: GPT2Config, *, rngs: nnx.Rngs, dtype):
        std = c.initializer_range
        self.c_fc = Conv1D(c.n_embd, c.n_inner, std=std, rngs=rngs, dtype=dtype)
        self.c_proj = Conv1D(c.n_inner, c.n_embd, std=std / (2 * c.n_layer) ** 0.5, rngs=rngs,
                             dtype=dtype)
        self.act, self.dropout = activation(c.activation_function), c.resid_pdrop

    def __call__(self, x, noise: Noise) -> jax.Array:
        return noise(self.c_proj(self.act(self.c_fc(x))), self.dropout)


class _Block(nnx.Module):
    def __init__(self, c: GPT2Config, layer_idx: int, *, rngs: nnx.Rngs, dtype):
        self.ln_1 = LayerNorm(c.n_embd, eps=c.layer_norm_epsilon, dtype=dtype)
        self.attn = _Attention(c, layer_idx, rngs=rngs, dtype=dtype)
        self.ln_2 = LayerNorm(c.n_embd, eps=c.layer_norm_epsilon, dtype=dtype)
        self.mlp = _MLP(c, rngs=rngs, dtype=dtype)

    def __call__(self, x, mask: Mask, noise: Noise) -> jax.Array:
        x = x + self.attn(self.ln_1(x), mask, noise)
        return x + self.mlp(self.ln_2(x), noise)


class GPT2Model(nnx.Module):
    def __init__(self, c: GPT2Config, *, rngs: nnx.Rngs, dtype):
        std = c.initializer_range
        self.wte = Embedding(c.vocab_size, c.n_embd, std=std, rngs=rngs, dtype=dtype)
        self.wpe = Embedding(c.n_positions, c.n_embd, std=std, rngs=rngs, dtype=dtype)
        self.h = nnx.List([_Block(c, i, rngs=rngs, dtype=dtype) for i in range(c.n_layer)])
        self.ln_f = LayerNorm(c.n_embd, eps=c.layer_norm_epsilon, dtype=dtype)
        self.config = c

    def __call__(self, input_ids, attention_mask, noise: Noise) -> jax.Array:
        # Positions count from the first column, padding or not, as transformers does when no
        # position_ids are given: batches are right-padded.
        positions = jnp.arange(input_ids.shape[1])
        x = noise(self.wte(input_ids) + self.wpe(positions)[None], self.config.embd_pdrop)
        mask = Mask(padding=attention_mask, causal=True)
        for block in self.h:
            x = run_layer(block, x, mask, noise, remat=self.config.runtime.remat)
        return self.ln_f(x)


class GPT2LMHeadModel(nnx.Module):
    Config = GPT2Config
    # The tied head (the token embeddings, unless untied) and old checkpoints' causal-mask
    # buffers.
    IGNORED_KEYS = (r"lm_head\.weight", r"transformer\.h\.\d+\.attn\.(masked_)?bias")

    def __init__(self, c: GPT2Config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.transformer = GPT2Model(c, rngs=rngs, dtype=dtype)
        self.lm_head = (
            None if c.tie_word_embeddings
            else Linear(c.n_embd, c.vocab_size, std=c.initializer_range, rngs=rngs, bias=False,
                        dtype=dtype))
        self.config = c

    def features(self, input_ids, attention_mask=None, *, dropout_rng=None
                 ) -> tuple[jax.Array, Projection]:
        """The last hidden states [B, T, d] and the vocabulary projection."""
        hidden = self.transformer(input_ids, attention_mask, Noise(dropout_rng))
        head = self.lm_head if self.lm_head is not None else self.transformer.wte
        return hidden, Projection(head.weight[...], None, head.dtype)

    def __call__(self, input_ids, attention_mask=None, *, dropout_rng=None) -> jax.Array:
        """Float32 logits [B, T, V]."""
        hidden, projection = self.features(input_ids, attention_mask, dropout_rng=dropout_rng)
        return projection(hidden)

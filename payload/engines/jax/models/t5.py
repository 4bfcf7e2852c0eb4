"""T5 (v1.1 and the original) encoder-decoder in Flax NNX, with transformers' PyTorch names.

    model = T5ForConditionalGeneration(T5Config.from_transformers(raw), rngs=nnx.Rngs(params=0))
    logits = model(input_ids, attention_mask, decoder_input_ids)    # [B, T_dec, V]

v1.1 (`feed_forward_proj: gated-gelu`, `tie_word_embeddings: false`) has a gated GELU
feed-forward and its own output matrix; the original ties the output to the embeddings and
scales the decoder output by d_model^-0.5 first. Weights start as T5's own code starts them
(transformers' `_init_weights` with factor 1): each matrix normal with std 1/sqrt(its fan-in)
(the query's also divided by sqrt(d_kv), T5 does not scale attention scores), embeddings
normal(1). The untied head takes fan-in scaling too, std d_model^-0.5 (as T5's own training
code does, not transformers' std 1.0, which starts a v1.1 model at a loss of ~100 instead of
~ln(vocab)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from payload.engines.jax.kernels import CPU_REFERENCE, Mask, Runtime, attend, run_layer
from payload.engines.jax.models.layers import (
    Embedding,
    Linear,
    Noise,
    Projection,
    RMSNorm,
    activation,
    merge_heads,
    split_heads,
)


@dataclass(frozen=True, kw_only=True)
class T5Config:
    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_decoder_layers: int
    num_heads: int
    relative_attention_num_buckets: int
    relative_attention_max_distance: int
    dropout_rate: float
    layer_norm_epsilon: float
    initializer_factor: float
    dense_act_fn: str
    is_gated_act: bool
    tie_word_embeddings: bool
    scale_decoder_outputs: bool
    runtime: Runtime = CPU_REFERENCE  # platform, kernels, remat: how it runs, not what it is

    @classmethod
    def from_transformers(cls, raw: dict) -> T5Config:
        """From a transformers T5Config dict; missing keys take its defaults."""

        def get(key, default):
            value = raw.get(key)
            return default if value is None else value

        proj = get("feed_forward_proj", "relu")
        act = "gelu_new" if proj == "gated-gelu" else proj.split("-")[-1]
        # transformers 5 always says tie_word_embeddings: true and keeps "v1.1" apart as
        # scale_decoder_outputs: false; 4.x says tie_word_embeddings: false.
        tied = get("tie_word_embeddings", True) and raw.get("scale_decoder_outputs") is not False
        layers = get("num_layers", 6)
        return cls(
            vocab_size=raw["vocab_size"],
            d_model=get("d_model", 512),
            d_kv=get("d_kv", 64),
            d_ff=get("d_ff", 2048),
            num_layers=layers,
            num_decoder_layers=get("num_decoder_layers", layers),
            num_heads=get("num_heads", 8),
            relative_attention_num_buckets=get("relative_attention_num_buckets", 32),
            relative_attention_max_distance=get("relative_attention_max_distance", 128),
            dropout_rate=get("dropout_rate", 0.1),
            layer_norm_epsilon=get("layer_norm_epsilon", 1e-6),
            initializer_factor=get("initializer_factor", 1.0),
            dense_act_fn=act,
            is_gated_act=proj.startswith("gated-"),
            tie_word_embeddings=tied,
            scale_decoder_outputs=tied,
        )


def relative_position_bucket(relative: np.ndarray, *, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> np.ndarray:
    """T5's bucket of each key-minus-query distance: exact for short distances, logarithmic
    up to max_distance. In numpy on the host, from static shapes: a float32 log rounded on an
    accelerator must not move a distance into another bucket than PyTorch puts it in."""
    buckets = np.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0).astype(relative.dtype) * num_buckets
        relative = np.abs(relative)
    else:
        relative = -np.minimum(relative, 0)
    max_exact = num_buckets // 2
    # Distances below max_exact take their own bucket; clamping them first keeps log() finite.
    far = np.maximum(relative, max_exact).astype(np.float32)
    large = max_exact + (
        np.log(far / np.float32(max_exact))
        / np.float32(math.log(max_distance / max_exact))
        * np.float32(num_buckets - max_exact)
    ).astype(relative.dtype)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(relative < max_exact, relative, large)


class _Attention(nnx.Module):
    def __init__(self, c: T5Config, *, has_relative_bias: bool, bidirectional: bool,
                 rngs: nnx.Rngs, dtype):
        f, d, inner = c.initializer_factor, c.d_model, c.num_heads * c.d_kv
        self.q = Linear(d, inner, std=f * (d * c.d_kv) ** -0.5, rngs=rngs, bias=False,
                        dtype=dtype)
        self.k = Linear(d, inner, std=f * d**-0.5, rngs=rngs, bias=False, dtype=dtype)
        self.v = Linear(d, inner, std=f * d**-0.5, rngs=rngs, bias=False, dtype=dtype)
        self.o = Linear(inner, d, std=f * inner**-0.5, rngs=rngs, bias=False, dtype=dtype)
        # Only each stack's first layer learns the relative position bias; the rest reuse it.
        self.relative_attention_bias = (
            Embedding(c.relative_attention_num_buckets, c.num_heads, std=f * d**-0.5, rngs=rngs)
            if has_relative_bias else None)
        self.bidirectional, self.config = bidirectional, c

    def position_bias(self, query_len: int, key_len: int) -> jax.Array:
        """[1, H, T_q, T_k] learned bias of each relative distance (this stack's first layer)."""
        c = self.config
        relative = np.arange(key_len)[None, :] - np.arange(query_len)[:, None]
        bucket = relative_position_bucket(
            relative, bidirectional=self.bidirectional,
            num_buckets=c.relative_attention_num_buckets,
            max_distance=c.relative_attention_max_distance)
        values = jnp.take(self.relative_attention_bias.weight[...], jnp.asarray(bucket), axis=0)
        return jnp.transpose(values, (2, 0, 1))[None].astype(jnp.float32)

    def __call__(self, x, memory, mask: Mask, noise: Noise) -> jax.Array:
        c = self.config
        q = split_heads(self.q(x), c.num_heads)
        k, v = split_heads(self.k(memory), c.num_heads), split_heads(self.v(memory), c.num_heads)
        # No 1/sqrt(d) on the scores: T5 folds it into the query's initialisation.
        out = attend(q, k, v, mask, scale=1.0, noise=noise, dropout=c.dropout_rate,
                     runtime=c.runtime)
        return self.o(merge_heads(out))


class _SelfAttentionLayer(nnx.Module):
    def __init__(self, c: T5Config, *, has_relative_bias: bool, bidirectional: bool,
                 rngs: nnx.Rngs, dtype):
        self.SelfAttention = _Attention(c, has_relative_bias=has_relative_bias,
                                        bidirectional=bidirectional, rngs=rngs, dtype=dtype)
        self.layer_norm = RMSNorm(c.d_model, eps=c.layer_norm_epsilon, dtype=dtype)
        self.dropout = c.dropout_rate

    def __call__(self, x, mask: Mask, noise: Noise) -> jax.Array:
        normed = self.layer_norm(x)
        return x + noise(self.SelfAttention(normed, normed, mask, noise), self.dropout)


class _CrossAttentionLayer(nnx.Module):
    def __init__(self, c: T5Config, *, rngs: nnx.Rngs, dtype):
        self.EncDecAttention = _Attention(c, has_relative_bias=False, bidirectional=True,
                                          rngs=rngs, dtype=dtype)
        self.layer_norm = RMSNorm(c.d_model, eps=c.layer_norm_epsilon, dtype=dtype)
        self.dropout = c.dropout_rate

    def __call__(self, x, memory, mask: Mask, noise: Noise) -> jax.Array:
        out = self.EncDecAttention(self.layer_norm(x), memory, mask, noise)
        return x + noise(out, self.dropout)


class _DenseReluDense(nnx.Module):
    """T5DenseActDense (wi, wo) or, gated, T5DenseGatedActDense (wi_0, wi_1, wo)."""

    def __init__(self, c: T5Config, *, rngs: nnx.Rngs, dtype):
        f, d = c.initializer_factor, c.d_model
        if c.is_gated_act:
            self.wi_0 = Linear(d, c.d_ff, std=f * d**-0.5, rngs=rngs, bias=False, dtype=dtype)
            self.wi_1 = Linear(d, c.d_ff, std=f * d**-0.5, rngs=rngs, bias=False, dtype=dtype)
        else:
            self.wi = Linear(d, c.d_ff, std=f * d**-0.5, rngs=rngs, bias=False, dtype=dtype)
        self.wo = Linear(c.d_ff, d, std=f * c.d_ff**-0.5, rngs=rngs, bias=False, dtype=dtype)
        self.act, self.gated = activation(c.dense_act_fn), c.is_gated_act
        self.dropout = c.dropout_rate

    def __call__(self, x, noise: Noise) -> jax.Array:
        h = self.act(self.wi_0(x)) * self.wi_1(x) if self.gated else self.act(self.wi(x))
        return self.wo(noise(h, self.dropout))


class _FeedForwardLayer(nnx.Module):
    def __init__(self, c: T5Config, *, rngs: nnx.Rngs, dtype):
        self.DenseReluDense = _DenseReluDense(c, rngs=rngs, dtype=dtype)
        self.layer_norm = RMSNorm(c.d_model, eps=c.layer_norm_epsilon, dtype=dtype)
        self.dropout = c.dropout_rate

    def __call__(self, x, noise: Noise) -> jax.Array:
        return x + noise(self.DenseReluDense(self.layer_norm(x), noise), self.dropout)


class _Block(nnx.Module):
    def __init__(self, c: T5Config, *, first: bool, decoder: bool, rngs: nnx.Rngs, dtype):
        layers = [_SelfAttentionLayer(c, has_relative_bias=first, bidirectional=not decoder,
                                      rngs=rngs, dtype=dtype)]
        if decoder:
            layers.append(_CrossAttentionLayer(c, rngs=rngs, dtype=dtype))
        layers.append(_FeedForwardLayer(c, rngs=rngs, dtype=dtype))
        self.layer = nnx.List(layers)

    def __call__(self, x, self_mask: Mask, memory, memory_mask: Mask, noise: Noise
                 ) -> jax.Array:
        x = self.layer[0](x, self_mask, noise)
        if memory is not None:
            x = self.layer[1](x, memory, memory_mask, noise)
        return self.layer[-1](x, noise)


class T5Stack(nnx.Module):
    """The encoder or the decoder: blocks, a final norm. The token embeddings are the model's
    one `shared` matrix, passed in (its tied copies are not parameters here)."""

    def __init__(self, c: T5Config, *, decoder: bool, rngs: nnx.Rngs, dtype):
        count = c.num_decoder_layers if decoder else c.num_layers
        self.block = nnx.List([_Block(c, first=i == 0, decoder=decoder, rngs=rngs, dtype=dtype)
                               for i in range(count)])
        self.final_layer_norm = RMSNorm(c.d_model, eps=c.layer_norm_epsilon, dtype=dtype)
        self.decoder, self.dropout, self.remat = decoder, c.dropout_rate, c.runtime.remat

    def __call__(self, embeddings: Embedding, ids, mask, noise: Noise, memory=None,
                 memory_mask=None) -> jax.Array:
        x = noise(embeddings(ids), self.dropout)
        length = ids.shape[1]
        relative = self.block[0].layer[0].SelfAttention.position_bias(length, length)
        self_mask = Mask(padding=mask, causal=self.decoder, bias=relative)
        cross_mask = Mask(padding=memory_mask)
        for block in self.block:
            x = run_layer(block, x, self_mask, memory, cross_mask, noise, remat=self.remat)
        return noise(self.final_layer_norm(x), self.dropout)


class T5ForConditionalGeneration(nnx.Module):
    Config = T5Config
    # The stacks' copies of the shared embeddings and, when tied, the head.
    IGNORED_KEYS = (r"(encoder|decoder)\.embed_tokens\.weight", r"lm_head\.weight")

    def __init__(self, c: T5Config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.shared = Embedding(c.vocab_size, c.d_model, std=c.initializer_factor, rngs=rngs,
                                dtype=dtype)
        self.encoder = T5Stack(c, decoder=False, rngs=rngs, dtype=dtype)
        self.decoder = T5Stack(c, decoder=True, rngs=rngs, dtype=dtype)
        self.lm_head = (
            None if c.tie_word_embeddings
            else Linear(c.d_model, c.vocab_size, std=c.d_model**-0.5, rngs=rngs, bias=False,
                        dtype=dtype))
        self.config = c

    def encode(self, input_ids, attention_mask=None, *, dropout_rng=None) -> jax.Array:
        """The encoder's output [B, T, d_model]."""
        return self.encoder(self.shared, input_ids, attention_mask, Noise(dropout_rng))

    def decode_features(self, decoder_input_ids, encoded, attention_mask=None,
                        decoder_attention_mask=None, *, dropout_rng=None
                        ) -> tuple[jax.Array, Projection]:
        """The decoder's output over `encoded` (masked by the encoder's `attention_mask`), as
        the vocabulary projection takes it, and the projection."""
        hidden = self.decoder(self.shared, decoder_input_ids, decoder_attention_mask,
                              Noise(dropout_rng), encoded, attention_mask)
        if self.lm_head is not None:
            return hidden, Projection(self.lm_head.weight[...], None, self.lm_head.dtype)
        if self.config.scale_decoder_outputs:
            hidden = hidden * self.config.d_model**-0.5
        return hidden, Projection(self.shared.weight[...], None, self.shared.dtype)

    def decode(self, decoder_input_ids, encoded, attention_mask=None,
               decoder_attention_mask=None, *, dropout_rng=None) -> jax.Array:
        """Float32 logits [B, T_dec, V] of the decoder over `encoded` (masked by the
        encoder's `attention_mask`)."""
        hidden, projection = self.decode_features(decoder_input_ids, encoded, attention_mask,
                                                  decoder_attention_mask,
                                                  dropout_rng=dropout_rng)
        return projection(hidden)

    def features(self, input_ids, attention_mask=None, decoder_input_ids=None,
                 decoder_attention_mask=None, *, dropout_rng=None
                 ) -> tuple[jax.Array, Projection]:
        """The decoder's output [B, T_dec, d] as the projection takes it, and the projection."""
        if dropout_rng is not None:
            enc_rng, dec_rng = jax.random.split(dropout_rng)
        else:
            enc_rng = dec_rng = None
        encoded = self.encode(input_ids, attention_mask, dropout_rng=enc_rng)
        return self.decode_features(decoder_input_ids, encoded, attention_mask,
                                    decoder_attention_mask, dropout_rng=dec_rng)

    def __call__(self, input_ids, attention_mask=None, decoder_input_ids=None,
                 decoder_attention_mask=None, *, dropout_rng=None) -> jax.Array:
        """Float32 logits [B, T_dec, V]."""
        hidden, projection = self.features(input_ids, attention_mask, decoder_input_ids,
                                           decoder_attention_mask, dropout_rng=dropout_rng)
        return projection(hidden)

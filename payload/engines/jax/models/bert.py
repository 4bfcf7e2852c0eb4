"""BERT and RoBERTa masked LMs in Flax NNX, with transformers' PyTorch parameter names.

    model = BertForMaskedLM(EncoderConfig.from_transformers(raw), rngs=nnx.Rngs(params=0))
    logits = model(input_ids, attention_mask)                  # [B, T, V]
    logits = model(input_ids, attention_mask, positions=pos)   # [B, K, V]: only those positions

The two differ only in names, RoBERTa's position numbering (after its padding id, as fairseq
does) and its head's activation; the encoder is shared. Weights start as the originals start
them: normal(0.02) matrices and embeddings, zero biases, unit layer norms.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from payload.engines.jax.kernels import CPU_REFERENCE, Mask, Runtime, attend, run_layer
from payload.engines.jax.models.layers import (
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
class EncoderConfig:
    family: str  # bert | roberta
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    type_vocab_size: int
    hidden_act: str
    layer_norm_eps: float
    hidden_dropout: float
    attention_dropout: float
    initializer_range: float
    pad_token_id: int
    runtime: Runtime = CPU_REFERENCE  # platform, kernels, remat: how it runs, not what it is

    @classmethod
    def from_transformers(cls, raw: dict) -> EncoderConfig:
        """From a transformers BertConfig / RobertaConfig dict; missing keys take its defaults."""
        family = raw["model_type"]

        def get(key, default):
            value = raw.get(key)
            return default if value is None else value

        return cls(
            family=family,
            vocab_size=raw["vocab_size"],
            hidden_size=get("hidden_size", 768),
            num_layers=get("num_hidden_layers", 12),
            num_heads=get("num_attention_heads", 12),
            intermediate_size=get("intermediate_size", 3072),
            max_positions=get("max_position_embeddings", 512),
            type_vocab_size=get("type_vocab_size", 2),
            hidden_act=get("hidden_act", "gelu"),
            layer_norm_eps=get("layer_norm_eps", 1e-12),
            hidden_dropout=get("hidden_dropout_prob", 0.1),
            attention_dropout=get("attention_probs_dropout_prob", 0.1),
            initializer_range=get("initializer_range", 0.02),
            pad_token_id=get("pad_token_id", 1 if family == "roberta" else 0),
        )


class Embeddings(nnx.Module):
    def __init__(self, c: EncoderConfig, *, rngs: nnx.Rngs, dtype):
        std = c.initializer_range
        self.word_embeddings = Embedding(c.vocab_size, c.hidden_size, std=std, rngs=rngs,
                                         padding_idx=c.pad_token_id, dtype=dtype)
        self.position_embeddings = Embedding(
            c.max_positions, c.hidden_size, std=std, rngs=rngs,
            padding_idx=c.pad_token_id if c.family == "roberta" else None, dtype=dtype)
        self.token_type_embeddings = Embedding(c.type_vocab_size, c.hidden_size, std=std,
                                               rngs=rngs, dtype=dtype)
        self.LayerNorm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps, dtype=dtype)
        self.config = c

    def position_ids(self, input_ids: jax.Array) -> jax.Array:
        if self.config.family != "roberta":
            return jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
        # RoBERTa counts real tokens from padding id + 1; padding sits at the padding id.
        pad = self.config.pad_token_id
        real = (input_ids != pad).astype(jnp.int32)
        return jnp.cumsum(real, axis=1) * real + pad

    def __call__(self, input_ids, token_type_ids, noise: Noise) -> jax.Array:
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        x = (self.word_embeddings(input_ids)
             + self.token_type_embeddings(token_type_ids)
             + self.position_embeddings(self.position_ids(input_ids)))
        return noise(self.LayerNorm(x), self.config.hidden_dropout)


class SelfAttention(nnx.Module):
    def __init__(self, c: EncoderConfig, *, rngs: nnx.Rngs, dtype):
        h, std = c.hidden_size, c.initializer_range
        self.query = Linear(h, h, std=std, rngs=rngs, dtype=dtype)
        self.key = Linear(h, h, std=std, rngs=rngs, dtype=dtype)
        self.value = Linear(h, h, std=std, rngs=rngs, dtype=dtype)
        self.config = c

    def __call__(self, x, mask: Mask, noise: Noise) -> jax.Array:
        c = self.config
        q, k, v = (split_heads(f(x), c.num_heads) for f in (self.query, self.key, self.value))
        out = attend(q, k, v, mask, scale=(c.hidden_size // c.num_heads) ** -0.5,
                     noise=noise, dropout=c.attention_dropout, runtime=c.runtime)
        return merge_heads(out)


class Output(nnx.Module):
    """dense -> dropout -> LayerNorm(x + residual): BertSelfOutput and BertOutput alike."""

    def __init__(self, c: EncoderConfig, in_features: int, *, rngs: nnx.Rngs, dtype):
        self.dense = Linear(in_features, c.hidden_size, std=c.initializer_range, rngs=rngs,
                            dtype=dtype)
        self.LayerNorm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps, dtype=dtype)
        self.dropout = c.hidden_dropout

    def __call__(self, x, residual, noise: Noise) -> jax.Array:
        return self.LayerNorm(noise(self.dense(x), self.dropout) + residual)


class Attention(nnx.Module):
    def __init__(self, c: EncoderConfig, *, rngs: nnx.Rngs, dtype):
        self.self = SelfAttention(c, rngs=rngs, dtype=dtype)
        self.output = Output(c, c.hidden_size, rngs=rngs, dtype=dtype)

    def __call__(self, x, mask: Mask, noise: Noise) -> jax.Array:
        return self.output(self.self(x, mask, noise), x, noise)


class Intermediate(nnx.Module):
    def __init__(self, c: EncoderConfig, *, rngs: nnx.Rngs, dtype):
        self.dense = Linear(c.hidden_size, c.intermediate_size, std=c.initializer_range,
                            rngs=rngs, dtype=dtype)
        self.act = activation(c.hidden_act)

    def __call__(self, x) -> jax.Array:
        return self.act(self.dense(x))


class Layer(nnx.Module):
    def __init__(self, c: EncoderConfig, *, rngs: nnx.Rngs, dtype):
        self.attention = Attention(c, rngs=rngs, dtype=dtype)
        self.intermediate = Intermediate(c, rngs=rngs, dtype=dtype)
        self.output = Output(c, c.intermediate_size, rngs=rngs, dtype=dtype)

    def __call__(self, x, mask: Mask, noise: Noise) -> jax.Array:
        x = self.attention(x, mask, noise)
        return self.output(self.intermediate(x), x, noise)


class LayerStack(nnx.Module):
    def __init__(self, c: EncoderConfig, *, rngs: nnx.Rngs, dtype):
        self.layer = nnx.List([Layer(c, rngs=rngs, dtype=dtype) for _ in range(c.num_layers)])
        self.remat = c.runtime.remat

    def __call__(self, x, mask: Mask, noise: Noise) -> jax.Array:
        for layer in self.layer:
            x = run_layer(layer, x, mask, noise, remat=self.remat)
        return x


class EncoderModel(nnx.Module):
    """BertModel / RobertaModel without the pooler (the masked LMs have none)."""

    def __init__(self, c: EncoderConfig, *, rngs: nnx.Rngs, dtype):
        self.embeddings = Embeddings(c, rngs=rngs, dtype=dtype)
        self.encoder = LayerStack(c, rngs=rngs, dtype=dtype)

    def __call__(self, input_ids, attention_mask, token_type_ids, noise: Noise) -> jax.Array:
        x = self.embeddings(input_ids, token_type_ids, noise)
        return self.encoder(x, Mask(padding=attention_mask), noise)


def _picked(hidden: jax.Array, positions: jax.Array | None) -> jax.Array:
    """The hidden states at `positions` [B, K] (all of them when None): the vocabulary
    projection is most of a small MLM's step, so training projects the masked slots only."""
    if positions is None:
        return hidden
    return jnp.take_along_axis(hidden, positions[..., None].astype(jnp.int32), axis=1)


class _Transform(nnx.Module):
    def __init__(self, c: EncoderConfig, *, rngs: nnx.Rngs, dtype):
        self.dense = Linear(c.hidden_size, c.hidden_size, std=c.initializer_range, rngs=rngs,
                            dtype=dtype)
        self.LayerNorm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps, dtype=dtype)
        self.act = activation(c.hidden_act)

    def __call__(self, x) -> jax.Array:
        return self.LayerNorm(self.act(self.dense(x)))


class _Predictions(nnx.Module):
    """BertLMPredictionHead: transform, then the word embeddings (tied) plus a bias."""

    def __init__(self, c: EncoderConfig, *, rngs: nnx.Rngs, dtype):
        self.transform = _Transform(c, rngs=rngs, dtype=dtype)
        self.bias = nnx.Param(jnp.zeros((c.vocab_size,), jnp.float32))

    def features(self, x, embeddings: Embedding) -> tuple[jax.Array, Projection]:
        return self.transform(x), Projection(embeddings.weight[...], self.bias[...],
                                             embeddings.dtype)


class _OnlyMLMHead(nnx.Module):
    def __init__(self, c: EncoderConfig, *, rngs: nnx.Rngs, dtype):
        self.predictions = _Predictions(c, rngs=rngs, dtype=dtype)

    def features(self, x, embeddings: Embedding) -> tuple[jax.Array, Projection]:
        return self.predictions.features(x, embeddings)


class BertForMaskedLM(nnx.Module):
    Config = EncoderConfig
    # Keys a transformers checkpoint may hold that are not parameters here: the tied decoder
    # (the word embeddings and cls.predictions.bias) and buffers.
    IGNORED_KEYS = (r"cls\.predictions\.decoder\.(weight|bias)", r".*\.position_ids",
                    r".*\.token_type_ids", r"bert\.pooler\..*")

    def __init__(self, c: EncoderConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.bert = EncoderModel(c, rngs=rngs, dtype=dtype)
        self.cls = _OnlyMLMHead(c, rngs=rngs, dtype=dtype)
        self.config = c

    def features(self, input_ids, attention_mask=None, token_type_ids=None, *,
                 positions=None, dropout_rng=None) -> tuple[jax.Array, Projection]:
        """What the vocabulary projection takes ([B, T, d], or [B, K, d] at `positions`
        [B, K]) and the projection itself."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids, Noise(dropout_rng))
        return self.cls.features(_picked(hidden, positions),
                                 self.bert.embeddings.word_embeddings)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *,
                 positions=None, dropout_rng=None) -> jax.Array:
        """Float32 logits [B, T, V], or [B, K, V] at `positions` [B, K]."""
        x, projection = self.features(input_ids, attention_mask, token_type_ids,
                                      positions=positions, dropout_rng=dropout_rng)
        return projection(x)


class _RobertaLMHead(nnx.Module):
    def __init__(self, c: EncoderConfig, *, rngs: nnx.Rngs, dtype):
        self.dense = Linear(c.hidden_size, c.hidden_size, std=c.initializer_range, rngs=rngs,
                            dtype=dtype)
        self.layer_norm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps, dtype=dtype)
        self.bias = nnx.Param(jnp.zeros((c.vocab_size,), jnp.float32))

    def features(self, x, embeddings: Embedding) -> tuple[jax.Array, Projection]:
        # RoBERTa's head uses exact GELU whatever the encoder's activation is.
        x = self.layer_norm(activation("gelu")(self.dense(x)))
        return x, Projection(embeddings.weight[...], self.bias[...], embeddings.dtype)


class RobertaForMaskedLM(nnx.Module):
    Config = EncoderConfig
    IGNORED_KEYS = (r"lm_head\.decoder\.(weight|bias)", r".*\.position_ids",
                    r".*\.token_type_ids", r"roberta\.pooler\..*")

    def __init__(self, c: EncoderConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.roberta = EncoderModel(c, rngs=rngs, dtype=dtype)
        self.lm_head = _RobertaLMHead(c, rngs=rngs, dtype=dtype)
        self.config = c

    def features(self, input_ids, attention_mask=None, token_type_ids=None, *,
                 positions=None, dropout_rng=None) -> tuple[jax.Array, Projection]:
        """What the vocabulary projection takes ([B, T, d], or [B, K, d] at `positions`
        [B, K]) and the projection itself."""
        hidden = self.roberta(input_ids, attention_mask, token_type_ids, Noise(dropout_rng))
        return self.lm_head.features(_picked(hidden, positions),
                                     self.roberta.embeddings.word_embeddings)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *,
                 positions=None, dropout_rng=None) -> jax.Array:
        """Float32 logits [B, T, V], or [B, K, V] at `positions` [B, K]."""
        x, projection = self.features(input_ids, attention_mask, token_type_ids,
                                      positions=positions, dropout_rng=dropout_rng)
        return projection(x)

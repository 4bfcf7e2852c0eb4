"""Model FLOPs of training on one row, by family: the formulas the run plan, the meter and the
bench all count with.

    flops = encoder_flops(architecture, seq_len=128, predicted=20)   # a transformers config dict
    flops.total, flops.shares()

Each family's spec (payload.core.families) names its formula; all take (architecture, row
length, positions the head predicts).
"""

from __future__ import annotations

from dataclasses import dataclass

from payload.core.sizes import count_parameters


def millions(n: float) -> str:
    return f"{n / 1e6:,.1f}M"


@dataclass(frozen=True, kw_only=True)
class StepFlops:
    """Model FLOPs of one training step (forward and backward) for one row, by term."""

    dense: float  # 6 x non-embedding parameters x tokens
    attention: float  # scores and weighted values
    vocabulary: float  # the output projection at the predicted positions
    formula: str  # the estimate in words, with the figures it used

    @property
    def total(self) -> float:
        return self.dense + self.attention + self.vocabulary

    def shares(self) -> tuple[tuple[str, float], ...]:
        terms = (("vocabulary projection", self.vocabulary), ("layers' matrices", self.dense),
                 ("attention", self.attention))
        total = self.total or 1.0
        return tuple(sorted(((name, value / total) for name, value in terms),
                            key=lambda term: -term[1]))


def encoder_flops(c: dict, seq_len: int, predicted: int) -> StepFlops:
    """BERT and RoBERTa: the vocabulary projection at the `predicted` masked positions."""
    h, layers, v = c.get("hidden_size", 768), c.get("num_hidden_layers", 12), c["vocab_size"]
    count = count_parameters(c)
    head_transform = h * h + 3 * h  # dense + LayerNorm of the MLM head: masked positions only
    body = count.non_embedding - head_transform - v  # minus the decoder's bias
    return StepFlops(
        dense=6 * body * seq_len + 6 * head_transform * predicted,
        attention=12 * layers * seq_len * h * seq_len,
        vocabulary=6 * v * h * predicted,
        formula=(f"6 x N per token (N = {millions(body)} non-embedding parameters) + attention "
                 f"12 x layers x seq_len x hidden per token + vocabulary projection 6 x vocab x "
                 f"hidden at the {predicted} masked positions of each {seq_len}-token row"),
    )


def gpt2_flops(c: dict, seq_len: int, predicted: int) -> StepFlops:
    """GPT-2: the vocabulary projection counted at every position of the row (the formula's
    figure since the start; `predicted`, one less, is not used)."""
    del predicted
    h, layers, v = c.get("n_embd", 768), c.get("n_layer", 12), c["vocab_size"]
    body = count_parameters(c).non_embedding
    return StepFlops(
        dense=6 * body * seq_len,
        attention=12 * layers * seq_len * h * seq_len,
        vocabulary=6 * v * h * seq_len,
        formula=(f"6 x N per token (N = {millions(body)} non-embedding parameters) + attention "
                 "12 x layers x seq_len x hidden per token + vocabulary projection 6 x vocab x "
                 "hidden at every position"),
    )


def t5_flops(c: dict, input_len: int, target_len: int) -> StepFlops:
    """T5: encoder and decoder apart, `target_len` the decoder's positions."""
    d, v = c.get("d_model", 512), c["vocab_size"]
    heads = c.get("num_heads", 8)
    inner = heads * c.get("d_kv", 64)
    layers = c.get("num_layers", 6)
    decoder_layers = c.get("num_decoder_layers") or layers
    gated = str(c.get("feed_forward_proj", "relu")).startswith("gated-")
    ff = (3 if gated else 2) * d * c.get("d_ff", 2048)
    encoder = layers * (4 * d * inner + ff)  # per input token
    cross_kv = decoder_layers * 2 * d * inner  # the decoder's, applied to every input token
    decoder = decoder_layers * (6 * d * inner + ff)  # self q,k,v,o; cross q,o; feed-forward
    return StepFlops(
        dense=6 * (encoder + cross_kv) * input_len + 6 * decoder * target_len,
        attention=12 * inner * (layers * input_len * input_len
                                + decoder_layers * target_len * (target_len + input_len)),
        vocabulary=6 * v * d * target_len,
        formula=(f"encoder and decoder apart: 6 x N_enc per input token (N_enc = "
                 f"{millions(encoder)}, with the decoder's cross-attention keys and values "
                 f"{millions(cross_kv)}), 6 x N_dec per target token (N_dec = "
                 f"{millions(decoder)}), attention 12 x layers x length x "
                 f"heads x d_kv per token of each stack and over the {input_len} inputs per "
                 f"target token, vocabulary projection 6 x vocab x d_model at the {target_len} "
                 "target positions"),
    )

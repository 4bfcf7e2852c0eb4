"""GPT-2: a decoder pretrained as a causal LM (GPT2LMHeadModel).

    GPT2.sizes["small"]     # Shape(hidden_size=768, num_layers=12, num_heads=12, ...)
    GPT2.count({"model_type": "gpt2", "vocab_size": 50257}).total
"""

from __future__ import annotations

from payload.core import flops
from payload.core.families.base import (
    Dims,
    FamilySpec,
    MaskKind,
    ParameterCount,
    PyTorchNames,
    Shape,
    Site,
)
from payload.core.families.bert import TINY, encoder

SIZES = {"tiny": TINY, "small": encoder(12, 768, 12), "medium": encoder(24, 1024, 16),
         "large": encoder(36, 1280, 20), "xl": encoder(48, 1600, 25)}


def config_of(s: Shape, model_cfg, vocab_size: int, seq_len: int) -> dict:
    dropout = model_cfg.dropout
    return {
        "model_type": "gpt2",
        "vocab_size": vocab_size,
        "n_embd": s.hidden_size,
        "n_layer": s.num_layers,
        "n_head": s.num_heads,
        "n_inner": s.intermediate_size,
        "n_positions": max(1024, seq_len),
        "resid_pdrop": dropout,
        "embd_pdrop": dropout,
        # No dropout on the attention weights unless asked for (payload.core.fit.attention).
        "attn_pdrop": model_cfg.attention_dropout or 0.0,
    }


def count(c: dict) -> ParameterCount:
    v, h = c["vocab_size"], c.get("n_embd", 768)
    layers, positions = c.get("n_layer", 12), c.get("n_positions", 1024)
    i = c.get("n_inner") or 4 * h
    layer = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * i + i) + (i * h + h)
    untied = 0 if c.get("tie_word_embeddings", True) else v * h
    embeddings = (v + positions) * h + untied
    return ParameterCount(embeddings + layers * layer + 2 * h, embeddings)


def step_flops(c: dict, seq_len: int, predicted: int) -> flops.StepFlops:
    """The vocabulary projection counted at every position of the row (the formula's figure
    since the start; `predicted`, one less, is not used)."""
    del predicted
    h, layers, v = c.get("n_embd", 768), c.get("n_layer", 12), c["vocab_size"]
    body = count(c).non_embedding
    return flops.StepFlops(
        dense=6 * body * seq_len,
        attention=12 * layers * seq_len * h * seq_len,
        vocabulary=6 * v * h * seq_len,
        formula=(f"6 x N per token (N = {flops.millions(body)} non-embedding parameters) + "
                 "attention 12 x layers x seq_len x hidden per token + vocabulary projection "
                 "6 x vocab x hidden at every position"),
    )


def dims(c: dict) -> Dims:
    width = c.get("n_embd") or 768
    heads = c.get("n_head", 12)
    return Dims(width=width, layers=c.get("n_layer") or 12, heads=heads,
                head_dim=width // heads, ff=c.get("n_inner") or 4 * width,
                dropout=bool(c.get("resid_pdrop", 0.1)))


def attention_sites(c: dict, seq_len: int, target_len: int | None) -> list[Site]:
    del target_len
    hidden, heads = c.get("n_embd", 768), c.get("n_head", 12)
    return [Site("causal self-attention", seq_len, seq_len, heads, hidden // heads,
                 MaskKind.CAUSAL, c.get("attn_pdrop", 0.1))]


# GPT-2 rows start mid-stream: a causal LM learns from every position, no marker needed; no
# post-processing either: raw ids, documents are joined with </s> by prepare.
GPT2 = FamilySpec(
    name="gpt2", title="GPT-2", objective="clm", architecture="GPT2LMHeadModel",
    auto_class="AutoModelForCausalLM", pipeline_tag="text-generation", sizes=SIZES,
    config_of=config_of, count=count, flops=step_flops, dims=dims,
    attention_sites=attention_sites,
    names=PyTorchNames(
        tied={"lm_head.weight": "transformer.wte.weight"}, base_prefix="transformer.",
        embeddings="transformer.wte.weight", hidden="n_embd", layers=(("n_layer", "h."),)),
    unk="<unk>", pad="<pad>", bos="<s>", eos="</s>",
    mask="<mask>", separator="</s>", max_positions=1024,
)

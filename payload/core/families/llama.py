"""Llama: the decoder most 100M-1B models are pretrained as today (LlamaForCausalLM): rotary
positions, RMSNorm, a SwiGLU feed-forward, grouped-query attention, no biases.

    LLAMA.sizes["135m"]     # SmolLM-135M's shape: 576 wide, 30 layers, 9 heads, 3 of keys/values
    LLAMA.transformers_config(model_cfg, vocab_size=8000, seq_len=512)["num_key_value_heads"]

The named sizes are the published configs' shapes: 135m and 360m SmolLM's (HuggingFaceTB,
tied embeddings), 1.1b TinyLlama's (its own output matrix); tiny is this project's, for tests.
Trained by the JAX engine only: transformers has no TensorFlow Llama.
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
    check_heads_and_positions,
)

RMS_NORM_EPS = 1e-5  # SmolLM's and TinyLlama's


def _shape(hidden: int, layers: int, heads: int, kv_heads: int, ff: int, *,
           tied: bool = True) -> Shape:
    return Shape(hidden_size=hidden, num_layers=layers, num_heads=heads, intermediate_size=ff,
                 num_kv_heads=kv_heads, tied_head=tied, rope_theta=10000.0)


SIZES = {"tiny": _shape(128, 2, 4, 2, 384), "135m": _shape(576, 30, 9, 3, 1536),
         "360m": _shape(960, 32, 15, 5, 2560), "1.1b": _shape(2048, 22, 32, 4, 5632, tied=False)}


def config_of(s: Shape, model_cfg, vocab_size: int, seq_len: int) -> dict:
    tied = s.tied_head if model_cfg.tie_embeddings is None else model_cfg.tie_embeddings
    return {
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": s.hidden_size,
        "num_hidden_layers": s.num_layers,
        "num_attention_heads": s.num_heads,
        "num_key_value_heads": s.num_kv_heads or s.num_heads,
        "intermediate_size": s.intermediate_size,
        "hidden_act": "silu",
        "max_position_embeddings": max(2048, seq_len),
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": s.rope_theta,
        "tie_word_embeddings": tied,
        # Llama has no dropout but on the attention weights, none unless asked for.
        "attention_dropout": model_cfg.attention_dropout or 0.0,
        "attention_bias": False,
        "mlp_bias": False,
    }


def _widths(c: dict) -> tuple[int, int, int, int]:
    """(hidden, query heads, key/value heads, head width) of a config dict."""
    h, heads = c.get("hidden_size", 4096), c.get("num_attention_heads", 32)
    kv = c.get("num_key_value_heads") or heads
    return h, heads, kv, c.get("head_dim") or h // heads


def count(c: dict) -> ParameterCount:
    v = c["vocab_size"]
    h, heads, kv, hd = _widths(c)
    layers, i = c.get("num_hidden_layers", 32), c.get("intermediate_size", 11008)
    # q and o at the query heads' width, k and v at the shared heads'; gate, up, down; 2 norms.
    layer = 2 * h * heads * hd + 2 * h * kv * hd + 3 * h * i + 2 * h
    embeddings = v * h * (1 if c.get("tie_word_embeddings", False) else 2)
    return ParameterCount(embeddings + layers * layer + h, embeddings)


def step_flops(c: dict, seq_len: int, predicted: int) -> flops.StepFlops:
    """As GPT-2's: the vocabulary projection at every position; attention over the query
    heads' width (grouped keys and values save memory, not the scores' FLOPs)."""
    del predicted
    h, heads, _, hd = _widths(c)
    layers, v = c.get("num_hidden_layers", 32), c["vocab_size"]
    body = count(c).non_embedding
    return flops.StepFlops(
        dense=6 * body * seq_len,
        attention=12 * layers * seq_len * heads * hd * seq_len,
        vocabulary=6 * v * h * seq_len,
        formula=(f"6 x N per token (N = {flops.millions(body)} non-embedding parameters) + "
                 "attention 12 x layers x seq_len x heads x head width per token + vocabulary "
                 "projection 6 x vocab x hidden at every position"),
    )


def dims(c: dict) -> Dims:
    h, heads, _, hd = _widths(c)
    return Dims(width=h, layers=c.get("num_hidden_layers", 32), heads=heads, head_dim=hd,
                ff=c.get("intermediate_size", 11008), gated=True, dropout=False)


def attention_sites(c: dict, seq_len: int, target_len: int | None) -> list[Site]:
    del target_len
    _, heads, _, hd = _widths(c)
    return [Site("causal self-attention", seq_len, seq_len, heads, hd, MaskKind.CAUSAL,
                 c.get("attention_dropout", 0.0))]


def shape_check(spec, settings: dict, *, seq_len: int | None, what: str) -> None:
    """As the others' (unless head_dim sets the heads' width), and key/value heads that divide
    the query heads."""
    from payload.core.errors import UserError

    if not settings.get("head_dim"):
        check_heads_and_positions(spec, settings, seq_len=seq_len, what=what)
    else:
        check_heads_and_positions(spec, settings, seq_len=seq_len, what=what, hidden_keys=())
    heads, kv = settings.get("num_attention_heads"), settings.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise UserError(f"{what}: {kv} key/value heads do not divide {heads} attention heads",
                        hint="num_key_value_heads must divide num_attention_heads")


LLAMA = FamilySpec(
    name="llama", title="Llama", objective="clm", architecture="LlamaForCausalLM",
    auto_class="AutoModelForCausalLM", pipeline_tag="text-generation", sizes=SIZES,
    engines=("jax",), config_of=config_of, count=count, flops=step_flops, dims=dims,
    attention_sites=attention_sites, shape_check=shape_check,
    names=PyTorchNames(
        tied={"lm_head.weight": "model.embed_tokens.weight"}, base_prefix="model.",
        embeddings="model.embed_tokens.weight", hidden="hidden_size",
        layers=(("num_hidden_layers", "layers."),)),
    # The rows GPT-2 trains on: documents joined with </s>, raw ids, no row marker.
    unk="<unk>", pad="<pad>", bos="<s>", eos="</s>", separator="</s>",
    # Rotary positions have no table to run out of: the cap is a memory guard, as T5's.
    max_positions=4096, grouped_attention=True, timed_as="gpt2", residual_dropout=False,
    reuses_tokenizer_roles=True,
)

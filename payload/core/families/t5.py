"""T5 (v1.1): an encoder-decoder pretrained by span corruption (T5ForConditionalGeneration).

    T5.record_len(model_cfg, 512)     # the longer raw row whose corruption fills 512 tokens
    span_corruption_lengths(568, 0.15, 3.0)    # (input length, target length)
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

NUM_T5_SENTINELS = 100


def _v1_1(hidden: int, layers: int, heads: int, ff: int) -> Shape:
    return Shape(hidden_size=hidden, num_layers=layers, num_heads=heads, intermediate_size=ff,
                 head_size=64, gated_gelu=True, tied_head=False)


# T5's tiny is the T5-efficient "tiny" shape in v1.1 form.
SIZES = {"tiny": _v1_1(256, 4, 4, 1024), "small": _v1_1(512, 8, 6, 1024),
         "base": _v1_1(768, 12, 12, 2048), "large": _v1_1(1024, 24, 16, 2816)}


def span_counts(expanded_len: int, noise_density: float, mean_span_len: float) -> tuple[int, int]:
    """(noise tokens, noise spans) of a row: round(L * density) tokens, at least one and fewer
    than L, in round(noise / mean_span) spans (at least one)."""
    num_noise = min(max(round(expanded_len * noise_density), 1), expanded_len - 1)
    return num_noise, max(round(num_noise / mean_span_len), 1)


def span_corruption_lengths(
    expanded_len: int, noise_density: float, mean_span_len: float
) -> tuple[int, int]:
    """(input length, target length) that span corruption makes of `expanded_len` raw tokens.

    Inputs keep the non-noise tokens plus one sentinel per span plus EOS; targets hold the noise
    plus one sentinel per span plus EOS.
    """
    num_noise, num_spans = span_counts(expanded_len, noise_density, mean_span_len)
    num_nonnoise = expanded_len - num_noise
    return num_nonnoise + num_spans + 1, num_noise + num_spans + 1


def t5_expanded_length(seq_len: int, noise_density: float, mean_span_len: float) -> int:
    """The longest raw row whose corrupted input still fits in `seq_len` tokens."""
    expanded = seq_len
    while span_corruption_lengths(expanded + 1, noise_density, mean_span_len)[0] <= seq_len:
        expanded += 1
    return expanded


def record_len(model_cfg, seq_len: int) -> int:
    """Tokens per stored record: the longer pre-corruption row."""
    return t5_expanded_length(seq_len, model_cfg.noise_density, model_cfg.mean_noise_span_length)


def target_len(model_cfg, seq_len: int) -> int:
    """The decoder's length: what span corruption makes of a stored record."""
    return span_corruption_lengths(record_len(model_cfg, seq_len), model_cfg.noise_density,
                                   model_cfg.mean_noise_span_length)[1]


def config_of(s: Shape, model_cfg, vocab_size: int, seq_len: int) -> dict:
    del seq_len  # relative positions: no table to size
    settings = {
        "model_type": "t5",
        "vocab_size": vocab_size,
        "d_model": s.hidden_size,
        "d_kv": s.head_size or s.hidden_size // s.num_heads,
        "d_ff": s.intermediate_size,
        "num_layers": s.num_layers,
        "num_decoder_layers": s.num_layers,
        "num_heads": s.num_heads,
        "dropout_rate": model_cfg.dropout,
    }
    if s.gated_gelu:
        settings["feed_forward_proj"] = "gated-gelu"
    if not s.tied_head:
        settings["tie_word_embeddings"] = False
    return settings


def count(c: dict) -> ParameterCount:
    v, d = c["vocab_size"], c.get("d_model", 512)
    inner = c.get("num_heads", 8) * c.get("d_kv", 64)
    layers = c.get("num_layers", 6)
    decoder_layers = c.get("num_decoder_layers") or layers
    gated = str(c.get("feed_forward_proj", "relu")).startswith("gated-")
    ff = (3 if gated else 2) * d * c.get("d_ff", 2048)
    attention = 4 * d * inner  # q, k, v, o; no biases
    relative = c.get("relative_attention_num_buckets", 32) * c.get("num_heads", 8)
    encoder = layers * (attention + ff + 2 * d) + relative + d
    decoder = decoder_layers * (2 * attention + ff + 3 * d) + relative + d
    embeddings = v * d * (1 if c.get("tie_word_embeddings", True) else 2)
    return ParameterCount(embeddings + encoder + decoder, embeddings)


def step_flops(c: dict, input_len: int, target_len: int) -> flops.StepFlops:
    """Encoder and decoder apart, `target_len` the decoder's positions."""
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
    millions = flops.millions
    return flops.StepFlops(
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


def dims(c: dict) -> Dims:
    layers = c.get("num_layers", 6)
    return Dims(width=c.get("d_model", 512), layers=layers, heads=c.get("num_heads", 8),
                head_dim=c.get("d_kv", 64), ff=c.get("d_ff", 2048),
                gated=str(c.get("feed_forward_proj", "relu")).startswith("gated-"),
                dropout=bool(c.get("dropout_rate", 0.1)),
                decoder_layers=c.get("num_decoder_layers") or layers)


def attention_sites(c: dict, seq_len: int, target_len: int | None) -> list[Site]:
    heads, head_dim = c.get("num_heads", 8), c.get("d_kv", 64)
    dropout = c.get("dropout_rate", 0.1)
    target = target_len or seq_len
    return [Site("encoder self-attention", seq_len, seq_len, heads, head_dim,
                 MaskKind.RELATIVE_BIAS, dropout),
            Site("decoder self-attention", target, target, heads, head_dim,
                 MaskKind.RELATIVE_BIAS, dropout),
            Site("cross-attention", target, seq_len, heads, head_dim, MaskKind.PADDING,
                 dropout)]


def shape_check(spec, settings: dict, *, seq_len: int | None, what: str) -> None:
    """Nothing to check: T5 sizes its heads by d_kv, and its positions are relative (none to
    run out of)."""
    del spec, settings, seq_len, what


T5 = FamilySpec(
    name="t5", title="T5", objective="span", architecture="T5ForConditionalGeneration",
    auto_class="AutoModelForSeq2SeqLM", pipeline_tag="text2text-generation", sizes=SIZES,
    config_of=config_of, count=count, flops=step_flops, dims=dims,
    attention_sites=attention_sites, record_len=record_len, target_len=target_len,
    shape_check=shape_check,
    names=PyTorchNames(
        tied={"encoder.embed_tokens.weight": "shared.weight",
              "decoder.embed_tokens.weight": "shared.weight",
              # the original T5; v1.1 has a head of its own
              "lm_head.weight": "shared.weight"},
        base_prefix="", embeddings="shared.weight", hidden="d_model",
        layers=(("num_layers", "encoder.block."), ("num_decoder_layers", "decoder.block."))),
    unk="<unk>", pad="<pad>", eos="</s>", separator="</s>",
    extra=tuple(f"<extra_id_{i}>" for i in range(NUM_T5_SENTINELS)), max_positions=4096,
    template=("$A </s>", "$A </s> $B:1 </s>:1"),
    starts_decoder_with_pad=True, one_dropout=True,
)

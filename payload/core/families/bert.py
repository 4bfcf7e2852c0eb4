"""BERT and RoBERTa: encoders pretrained as masked LMs (BertForMaskedLM, RobertaForMaskedLM).

    BERT.transformers_config(model_cfg, vocab_size=8000, seq_len=128)["model_type"]  # "bert"
    ROBERTA.positions_needed(512)       # 514: RoBERTa counts positions after its padding index
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

# transformers' TF RoBERTa embeddings fix their padding index at 1 whatever the config says:
# positions count from there.
ROBERTA_POSITION_PADDING = 1


def encoder(layers: int, hidden: int, heads: int) -> Shape:
    return Shape(hidden_size=hidden, num_layers=layers, num_heads=heads,
                 intermediate_size=4 * hidden)


# tiny and small are the BERT miniatures' shapes (Turc et al. 2019, "BERT-Tiny", "BERT-Small");
# RoBERTa and GPT-2 were not published that small and take the same ones.
TINY, SMALL = encoder(2, 128, 2), encoder(4, 512, 8)
SIZES = {"tiny": TINY, "small": SMALL, "base": encoder(12, 768, 12),
         "large": encoder(24, 1024, 16)}


def _config(family: str):
    def config_of(s: Shape, model_cfg, vocab_size: int, seq_len: int) -> dict:
        settings = {
            "model_type": family,
            "vocab_size": vocab_size,
            "hidden_size": s.hidden_size,
            "num_hidden_layers": s.num_layers,
            "num_attention_heads": s.num_heads,
            "intermediate_size": s.intermediate_size,
            "hidden_dropout_prob": model_cfg.dropout,
            # No dropout on the attention weights unless asked for (payload.core.fit.attention).
            "attention_probs_dropout_prob": model_cfg.attention_dropout or 0.0,
            "max_position_embeddings": max(512, seq_len),
        }
        if family == "roberta":
            settings["max_position_embeddings"] += ROBERTA_POSITION_PADDING + 1
            settings["type_vocab_size"] = 1
        return settings

    return config_of


def count(c: dict) -> ParameterCount:
    # BertForMaskedLM / RobertaForMaskedLM: no pooler; the MLM head's decoder is the embedding
    # matrix, plus its own bias.
    v, h = c["vocab_size"], c.get("hidden_size", 768)
    layers, i = c.get("num_hidden_layers", 12), c.get("intermediate_size", 3072)
    positions = c.get("max_position_embeddings", 512)
    types = c.get("type_vocab_size", 2)
    layer = (4 * h * h + 4 * h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    head = (h * h + h) + 2 * h + v
    embeddings = (v + positions) * h
    return ParameterCount(embeddings + types * h + 2 * h + layers * layer + head, embeddings)


def step_flops(c: dict, seq_len: int, predicted: int) -> flops.StepFlops:
    """The vocabulary projection at the `predicted` masked positions."""
    h, layers, v = c.get("hidden_size", 768), c.get("num_hidden_layers", 12), c["vocab_size"]
    head_transform = h * h + 3 * h  # dense + LayerNorm of the MLM head: masked positions only
    body = count(c).non_embedding - head_transform - v  # minus the decoder's bias
    return flops.StepFlops(
        dense=6 * body * seq_len + 6 * head_transform * predicted,
        attention=12 * layers * seq_len * h * seq_len,
        vocabulary=6 * v * h * predicted,
        formula=(f"6 x N per token (N = {flops.millions(body)} non-embedding parameters) + "
                 f"attention 12 x layers x seq_len x hidden per token + vocabulary projection "
                 f"6 x vocab x hidden at the {predicted} masked positions of each "
                 f"{seq_len}-token row"),
    )


def dims(c: dict) -> Dims:
    width = c.get("hidden_size") or 768
    heads = c.get("num_attention_heads", 12)
    return Dims(width=width, layers=c.get("num_hidden_layers") or 12, heads=heads,
                head_dim=width // heads, ff=c.get("intermediate_size") or 4 * width,
                dropout=bool(c.get("hidden_dropout_prob", 0.1)), post_norm=True)


def attention_sites(c: dict, seq_len: int, target_len: int | None) -> list[Site]:
    del target_len
    hidden = c.get("hidden_size", 768)
    heads = c.get("num_attention_heads", 12)
    return [Site("self-attention", seq_len, seq_len, heads, hidden // heads, MaskKind.PADDING,
                 c.get("attention_probs_dropout_prob", 0.1))]


_COMMON = dict(objective="mlm", auto_class="AutoModelForMaskedLM", pipeline_tag="fill-mask",
               sizes=SIZES, count=count, flops=step_flops, dims=dims,
               attention_sites=attention_sites, max_positions=512)

BERT = FamilySpec(
    name="bert", title="BERT", architecture="BertForMaskedLM", config_of=_config("bert"),
    names=PyTorchNames(
        tied={"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
              "cls.predictions.decoder.bias": "cls.predictions.bias"},
        base_prefix="bert.", embeddings="bert.embeddings.word_embeddings.weight",
        hidden="hidden_size", layers=(("num_hidden_layers", "encoder.layer."),)),
    unk="[UNK]", pad="[PAD]", cls="[CLS]", sep="[SEP]",
    mask="[MASK]", separator="[SEP]", row_start="[CLS]",
    template=("[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1"),
    model_inputs=("input_ids", "token_type_ids", "attention_mask"),
    **_COMMON,
)

# RoBERTa's own layout: TF RoBERTa numbers positions from a padding index fixed at 1.
ROBERTA = FamilySpec(
    name="roberta", title="RoBERTa", architecture="RobertaForMaskedLM",
    config_of=_config("roberta"),
    names=PyTorchNames(
        tied={"lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
              "lm_head.decoder.bias": "lm_head.bias"},
        base_prefix="roberta.", embeddings="roberta.embeddings.word_embeddings.weight",
        hidden="hidden_size", layers=(("num_hidden_layers", "encoder.layer."),)),
    unk="<unk>", pad="<pad>", cls="<s>", sep="</s>",
    bos="<s>", eos="</s>", mask="<mask>", separator="</s>", row_start="<s>",
    template=("<s> $A </s>", "<s> $A </s> </s> $B:1 </s>:1"),
    id_order=("<s>", "<pad>", "</s>", "<unk>", "<mask>"),
    extra_positions=ROBERTA_POSITION_PADDING + 1,
    # TF RoBERTa numbers positions from a hard-coded padding index of 1, PyTorch's from
    # config.pad_token_id: say 1 so both frameworks give the same positions (and so the same
    # outputs). Ids equal to 1 then restart no position count in either; the pipeline pads
    # with the tokenizer's own pad id and masks it.
    fixed_pad_token_id=ROBERTA_POSITION_PADDING,
    timed_as="bert",
    **_COMMON,
)

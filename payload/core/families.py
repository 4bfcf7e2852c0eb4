"""What each model family means for the pipeline: special tokens, objective, position limit.

    spec = FAMILIES["roberta"]; spec.separator  # "</s>", appended after every document

One table, read by the tokenizer trainer, prepare (separators, row layout) and training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NUM_T5_SENTINELS = 100
# transformers' TF RoBERTa embeddings fix their padding index at 1 whatever the config says.
ROBERTA_POSITION_PADDING = 1


def max_predictions(seq_len: int, mlm_probability: float) -> int:
    """Masked positions per row that a masked LM's head looks at (BERT's
    max_predictions_per_seq)."""
    return max(1, math.ceil(seq_len * mlm_probability))


def positions_needed(family: str, seq_len: int) -> int:
    """The position embeddings a model of `family` needs for rows of `seq_len` tokens (RoBERTa
    counts positions after its padding index)."""
    return seq_len + (ROBERTA_POSITION_PADDING + 1 if family == "roberta" else 0)


@dataclass(frozen=True, kw_only=True)
class FamilySpec:
    name: str
    objective: str  # "mlm" | "clm" | "span"
    unk: str
    pad: str
    separator: str  # ends every document in the token stream
    bos: str | None = None
    row_start: str | None = None  # starts every row (BERT's [CLS], RoBERTa's <s>); None: raw
    mask: str | None = None
    cls: str | None = None
    sep: str | None = None
    eos: str | None = None
    extra: tuple[str, ...] = ()
    # The longest row the family's position embeddings allow; T5's relative positions have no
    # hard limit, so the cap there is a memory guard rather than a property of the model.
    max_positions: int = 512
    # Ids 0.. for these first, where the family has a fixed layout.
    id_order: tuple[str, ...] = ()
    # What the tokenizer returns for the model: what the model's call takes. A tokenizer that
    # also returns token_type_ids breaks `model.generate(**tokenizer(...))` in TF GPT-2 (they
    # are added as embeddings) and TF T5 (it refuses them).
    model_inputs: tuple[str, ...] = ("input_ids", "attention_mask")

    @property
    def special_tokens(self) -> list[str]:
        """Special tokens in id order: the trainer gives them ids 0..n-1."""
        ordered: list[str] = []
        for token in (*self.id_order, self.pad, self.unk, self.cls, self.sep, self.bos, self.eos,
                      self.mask, self.separator, *self.extra):
            if token is not None and token not in ordered:
                ordered.append(token)
        return ordered


FAMILIES: dict[str, FamilySpec] = {
    "bert": FamilySpec(
        name="bert", objective="mlm", unk="[UNK]", pad="[PAD]", cls="[CLS]", sep="[SEP]",
        mask="[MASK]", separator="[SEP]", row_start="[CLS]", max_positions=512,
        model_inputs=("input_ids", "token_type_ids", "attention_mask"),
    ),
    # RoBERTa's own layout: TF RoBERTa numbers positions from a padding index fixed at 1.
    "roberta": FamilySpec(
        name="roberta", objective="mlm", unk="<unk>", pad="<pad>", cls="<s>", sep="</s>",
        bos="<s>", eos="</s>", mask="<mask>", separator="</s>", row_start="<s>",
        max_positions=512, id_order=("<s>", "<pad>", "</s>", "<unk>", "<mask>"),
    ),
    # GPT-2 rows start mid-stream: a causal LM learns from every position, no marker needed.
    "gpt2": FamilySpec(
        name="gpt2", objective="clm", unk="<unk>", pad="<pad>", bos="<s>", eos="</s>",
        mask="<mask>", separator="</s>", max_positions=1024,
    ),
    "t5": FamilySpec(
        name="t5", objective="span", unk="<unk>", pad="<pad>", eos="</s>", separator="</s>",
        extra=tuple(f"<extra_id_{i}>" for i in range(NUM_T5_SENTINELS)), max_positions=4096,
    ),
}


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

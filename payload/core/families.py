"""Each model family once, as torchtitan's TrainSpec: what the pipeline, both engines, the run
plan and the export need to know of it.

    spec = FAMILIES["roberta"]; spec.separator  # "</s>", appended after every document
    spec.objective, spec.architecture           # "mlm", "RobertaForMaskedLM"
    spec.flops(architecture, 128, spec.predicted_len(128))   # the run plan's FLOPs of a row

One table, read by the tokenizer trainer, prepare (separators, row layout), the objectives, both
engines (the TF class is transformers' "TF" + architecture, the JAX model the class of that
name in payload.engines.jax.models), the run plan (FLOPs), the export and the model card
(architectures, Auto class, pipeline tag) and the PyTorch weight names (tied keys, prefixes).
Adding a family is an entry here, its sizes (payload.core.sizes) and its model files.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from payload.core import flops
from payload.core.sizes import ROBERTA_POSITION_PADDING, SIZES

NUM_T5_SENTINELS = 100


def max_predictions(seq_len: int, mlm_probability: float) -> int:
    """Masked positions per row that a masked LM's head looks at (BERT's
    max_predictions_per_seq)."""
    return max(1, math.ceil(seq_len * mlm_probability))


def positions_needed(family: str, seq_len: int) -> int:
    """The position embeddings a model of `family` needs for rows of `seq_len` tokens (RoBERTa
    counts positions after its padding index)."""
    return seq_len + (ROBERTA_POSITION_PADDING + 1 if family == "roberta" else 0)


def check_shape(settings: dict, family: str, *, seq_len: int | None, what: str) -> None:
    """What a config.json of `family` (its settings, sizes already whole numbers) must hold for
    the model to build and take rows of `seq_len` tokens (None: not checked): heads that divide
    the hidden size (T5 sizes its heads by d_kv instead), and position embeddings for every
    token of a row (T5's positions are relative: it has none to run out of). One line, or
    nothing."""
    from payload.core.errors import UserError

    if family != "t5":
        hidden = settings.get("hidden_size") or settings.get("n_embd")
        heads = settings.get("num_attention_heads") or settings.get("n_head")
        if hidden and heads and hidden % heads:
            raise UserError(f"{what}: {heads} heads do not divide hidden size {hidden}",
                            hint="pick a hidden size that is a multiple of the head count")
        positions = settings.get("max_position_embeddings") or settings.get("n_positions")
        if seq_len is not None and positions and positions < positions_needed(family, seq_len):
            raise UserError(f"{what} has {positions} positions, too few for data.seq_len "
                            f"{seq_len} (a {family} model needs "
                            f"{positions_needed(family, seq_len)})",
                            hint="lower data.seq_len or raise the position count in that file")


@dataclass(frozen=True, kw_only=True)
class PyTorchNames:
    """How PyTorch transformers names the family's weights (payload.core.pytorch_weights)."""

    # Keys that share the tensor of another key (tied weights); a key the state already holds
    # (an untied head of its own) is left as it is.
    tied: dict[str, str]
    # Where the weights live under the task model, so a checkpoint of the bare model (GPT-2's
    # own has "h.0..." for "transformer.h.0...") still matches.
    base_prefix: str
    # The token embeddings: the one matrix every checkpoint of the family has, [vocab, hidden].
    embeddings: str
    hidden: str  # config.json's name for the hidden width
    # config.json's layer counts and the keys that number the layers (the bare model's spelling).
    layers: tuple[tuple[str, str], ...]


@dataclass(frozen=True, kw_only=True)
class FamilySpec:
    name: str
    objective: str  # "mlm" | "clm" | "span"
    # transformers' class of the pretraining task: the export's config.json `architectures`,
    # the TF engine's class ("TF" + it), the JAX engine's model of the same name.
    architecture: str
    auto_class: str  # what loads the exported folder (the model card's example)
    pipeline_tag: str  # the Hub's task for the model card
    # Model FLOPs of training on one row (payload.core.flops): (architecture, row length,
    # positions the head predicts).
    flops: Callable[[dict, int, int], flops.StepFlops]
    names: PyTorchNames
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
    def sizes(self) -> dict:
        """The published sizes of the family, by name (payload.core.sizes)."""
        return SIZES[self.name]

    def predicted_len(self, seq_len: int, *, mlm_probability: float = 0.15,
                      target_len: int | None = None) -> int:
        """Positions per row the head predicts: the masked ones, every one with a next token,
        or the span-corruption target (`target_len`)."""
        if self.objective == "mlm":
            return max_predictions(seq_len, mlm_probability)
        if self.objective == "clm":
            return seq_len - 1
        if target_len is None:
            raise ValueError(f"{self.name}: the span objective needs the target length")
        return target_len

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
        name="bert", objective="mlm", architecture="BertForMaskedLM",
        auto_class="AutoModelForMaskedLM", pipeline_tag="fill-mask", flops=flops.encoder_flops,
        names=PyTorchNames(
            tied={"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
                  "cls.predictions.decoder.bias": "cls.predictions.bias"},
            base_prefix="bert.", embeddings="bert.embeddings.word_embeddings.weight",
            hidden="hidden_size", layers=(("num_hidden_layers", "encoder.layer."),)),
        unk="[UNK]", pad="[PAD]", cls="[CLS]", sep="[SEP]",
        mask="[MASK]", separator="[SEP]", row_start="[CLS]", max_positions=512,
        model_inputs=("input_ids", "token_type_ids", "attention_mask"),
    ),
    # RoBERTa's own layout: TF RoBERTa numbers positions from a padding index fixed at 1.
    "roberta": FamilySpec(
        name="roberta", objective="mlm", architecture="RobertaForMaskedLM",
        auto_class="AutoModelForMaskedLM", pipeline_tag="fill-mask", flops=flops.encoder_flops,
        names=PyTorchNames(
            tied={"lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
                  "lm_head.decoder.bias": "lm_head.bias"},
            base_prefix="roberta.", embeddings="roberta.embeddings.word_embeddings.weight",
            hidden="hidden_size", layers=(("num_hidden_layers", "encoder.layer."),)),
        unk="<unk>", pad="<pad>", cls="<s>", sep="</s>",
        bos="<s>", eos="</s>", mask="<mask>", separator="</s>", row_start="<s>",
        max_positions=512, id_order=("<s>", "<pad>", "</s>", "<unk>", "<mask>"),
    ),
    # GPT-2 rows start mid-stream: a causal LM learns from every position, no marker needed.
    "gpt2": FamilySpec(
        name="gpt2", objective="clm", architecture="GPT2LMHeadModel",
        auto_class="AutoModelForCausalLM", pipeline_tag="text-generation", flops=flops.gpt2_flops,
        names=PyTorchNames(
            tied={"lm_head.weight": "transformer.wte.weight"}, base_prefix="transformer.",
            embeddings="transformer.wte.weight", hidden="n_embd", layers=(("n_layer", "h."),)),
        unk="<unk>", pad="<pad>", bos="<s>", eos="</s>",
        mask="<mask>", separator="</s>", max_positions=1024,
    ),
    "t5": FamilySpec(
        name="t5", objective="span", architecture="T5ForConditionalGeneration",
        auto_class="AutoModelForSeq2SeqLM", pipeline_tag="text2text-generation",
        flops=flops.t5_flops,
        names=PyTorchNames(
            tied={"encoder.embed_tokens.weight": "shared.weight",
                  "decoder.embed_tokens.weight": "shared.weight",
                  # the original T5; v1.1 has a head of its own
                  "lm_head.weight": "shared.weight"},
            base_prefix="", embeddings="shared.weight", hidden="d_model",
            layers=(("num_layers", "encoder.block."), ("num_decoder_layers", "decoder.block."))),
        unk="<unk>", pad="<pad>", eos="</s>", separator="</s>",
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

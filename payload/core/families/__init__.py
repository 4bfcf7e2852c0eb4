"""Each model family as one module, as torchtitan's TrainSpec: what the pipeline, both engines,
the config, the run plan, the fit check, the export and the model card need to know of it.

    spec = FAMILIES["roberta"]; spec.separator  # "</s>", appended after every document
    spec.objective, spec.architecture           # "mlm", "RobertaForMaskedLM"
    family_of(architecture).count(architecture).total        # by its model_type ("llama")
    spec.flops(architecture, 128, spec.predicted_len(128))   # the run plan's FLOPs of a row

The registry below is what everything else asks (payload.core.sizes, payload.core.fit, the
config checks, the run plan, the tokenizer, prepare, both engines, the export and the model
card). A family is a module here (payload.core.families.<name>: its FamilySpec, sizes,
transformers config, counts, FLOPs, widths, attention sites, row lengths, tokenizer template,
engines and PyTorch names) plus its model files in each engine that trains it
(payload.engines.jax.models, transformers' own TF classes); nothing else compares a family's
name (tests/fast/test_families.py holds that).
"""

from __future__ import annotations

from payload.core.families.base import (
    Dims,
    FamilySpec,
    ParameterCount,
    PyTorchNames,
    Shape,
    max_predictions,
)
from payload.core.families.bert import BERT, ROBERTA, ROBERTA_POSITION_PADDING
from payload.core.families.gpt2 import GPT2
from payload.core.families.llama import LLAMA
from payload.core.families.t5 import (
    NUM_T5_SENTINELS,
    T5,
    span_corruption_lengths,
    span_counts,
    t5_expanded_length,
)

FAMILIES: dict[str, FamilySpec] = {spec.name: spec for spec in (BERT, ROBERTA, GPT2, T5, LLAMA)}


def family_of(architecture: dict) -> FamilySpec:
    """The family of a transformers config dict, by its model_type."""
    kind = architecture.get("model_type")
    if kind not in FAMILIES:
        raise ValueError(f"no model family for model_type {kind!r}")
    return FAMILIES[kind]


def positions_needed(family: str, seq_len: int) -> int:
    """The position embeddings a model of `family` needs for rows of `seq_len` tokens (RoBERTa
    counts positions after its padding index)."""
    return FAMILIES[family].positions_needed(seq_len)


def check_shape(settings: dict, family: str, *, seq_len: int | None, what: str) -> None:
    """What a config.json of `family` (its settings, sizes already whole numbers) must hold for
    the model to build and take rows of `seq_len` tokens (None: not checked): heads that divide
    the hidden size, and position embeddings for every token of a row; each family's module
    says what applies. One line, or nothing."""
    spec = FAMILIES[family]
    spec.shape_check(spec, settings, seq_len=seq_len, what=what)


def attention_sites(architecture: dict, *, seq_len: int, target_len: int | None = None) -> list:
    """The attention calls of a family's model (a transformers config dict) in training."""
    return family_of(architecture).attention_sites(architecture, seq_len, target_len)


__all__ = ["FAMILIES", "NUM_T5_SENTINELS", "ROBERTA_POSITION_PADDING", "Dims", "FamilySpec",
           "ParameterCount", "PyTorchNames", "Shape", "attention_sites", "check_shape",
           "family_of", "max_predictions", "positions_needed", "span_corruption_lengths",
           "span_counts", "t5_expanded_length"]

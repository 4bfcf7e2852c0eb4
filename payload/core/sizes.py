"""Model sizes by their published names, the shapes they stand for, and parameter counts.

    SIZES["roberta"]["base"]            # Shape(hidden_size=768, num_layers=12, num_heads=12, ...)
    parameter_count(config, vocab_size=32000)   # the model a run config builds, from its shapes
    parameter_count({"model_type": "gpt2", "n_embd": 768, "n_layer": 12}, vocab_size=50257)

The sizes and counts are each family's (payload.core.families.<name>); this module asks the
registry, for the config checks (`model.size`), the model builder and the run plan. Counting is
arithmetic on the shapes, no model is built: the tests check it against the real
models' own counts, TensorFlow's and PyTorch's, for every family and size.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from payload.core.families import FAMILIES, ParameterCount, family_of
from payload.core.families.base import SHAPE_DEFAULTS, Shape
from payload.core.families.bert import ROBERTA_POSITION_PADDING

# The published sizes of every family, by name (each family's module holds its own).
SIZES: dict[str, dict[str, Shape]] = {name: spec.sizes for name, spec in FAMILIES.items()}

__all__ = ["ROBERTA_POSITION_PADDING", "SHAPE_DEFAULTS", "SIZES", "ParameterCount", "Shape",
           "architecture", "config_settings", "count_parameters", "parameter_count",
           "read_config_json", "shape_of", "tokenizer_json_size", "transformers_config"]


def shape_of(model_cfg) -> Shape:
    """The shape a run config's `model` section asks for: its size, or its shape keys (the
    defaults for any it leaves out). Not for `model.config` / `model.init_from`."""
    return FAMILIES[model_cfg.family].shape(model_cfg)


def transformers_config(model_cfg, *, vocab_size: int, seq_len: int) -> dict:
    """The transformers config (keyword arguments with `model_type`) for a sized model (its
    family's module writes it)."""
    return FAMILIES[model_cfg.family].transformers_config(model_cfg, vocab_size=vocab_size,
                                                          seq_len=seq_len)


def parameter_count(source: Any, vocab_size: int | None = None) -> int:
    """Parameters of the model `source` describes: a run config (`RunConfig`, with the
    vocabulary it gets: payload.training.runplan.run_architecture finds it), a transformers config or its
    dict / config.json contents. `vocab_size` overrides the vocabulary."""
    return count_parameters(source, vocab_size).total


def count_parameters(source: Any, vocab_size: int | None = None) -> ParameterCount:
    """`parameter_count` with the embeddings' share, for FLOP estimates (6 x non-embedding)."""
    config = architecture(source, vocab_size)
    return family_of(config).count(config)


def architecture(source: Any, vocab_size: int | None = None) -> dict:
    """A transformers config dict for `source` (see `parameter_count`), vocab_size applied."""
    if hasattr(source, "model") and hasattr(source, "data"):  # a RunConfig
        model = source.model
        if vocab_size is None:
            raise ValueError("a run config's architecture needs its vocabulary size "
                             "(payload.data.tokenizer.planned_vocab_size)")
        folder_or_file = model.init_from or model.config
        if folder_or_file:
            config = read_config_json(folder_or_file, source=(
                f"model.init_from {model.init_from}" if model.init_from
                else f"model.config {model.config}"))
            if model.init_from:  # the checkpoint's embeddings stay as they are
                vocab_size = None
        else:
            config = transformers_config(model, vocab_size=vocab_size,
                                         seq_len=source.data.seq_len)
    elif hasattr(source, "to_dict"):
        config = source.to_dict()
    else:
        config = dict(source)
    if vocab_size is not None:
        config["vocab_size"] = vocab_size
    return config


# config.json's sizes, in each family's spelling: whole numbers above 0 where present.
CONFIG_SIZES = ("vocab_size", "hidden_size", "n_embd", "d_model", "num_hidden_layers", "n_layer",
                "num_layers", "num_decoder_layers", "num_attention_heads", "n_head", "num_heads",
                "intermediate_size", "n_inner", "d_ff", "d_kv", "max_position_embeddings",
                "n_positions", "n_ctx", "type_vocab_size", "relative_attention_num_buckets",
                "relative_attention_max_distance", "num_key_value_heads", "head_dim")
# Its other numbers, which transformers takes as they are and fails on only once a model is
# built: finite numbers above 0 (epsilons, initial scales), or shares in [0, 1) (dropouts).
CONFIG_POSITIVE = ("layer_norm_eps", "layer_norm_epsilon", "initializer_range",
                   "initializer_factor", "rms_norm_eps", "rope_theta")
CONFIG_SHARES = ("hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop",
                 "embd_pdrop", "attn_pdrop", "summary_first_dropout", "dropout_rate",
                 "classifier_dropout", "attention_dropout")
# Keys that send a loader elsewhere (code from another repository): never carried into the run
# or its export.
CONFIG_ELSEWHERE = ("auto_map", "custom_pipelines")
_CONFIG_HINT = "point it at a Hugging Face model's config.json (save_pretrained writes one)"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def config_settings(raw: bytes, *, what: str) -> dict:
    """A transformers config.json's bytes as its settings, or one line saying what is wrong: a
    JSON object with a model_type whose sizes (CONFIG_SIZES) are whole numbers above 0 and
    whose other numbers (CONFIG_POSITIVE, CONFIG_SHARES) are in range; keys that point
    elsewhere (CONFIG_ELSEWHERE) dropped, with a line in the log."""
    from payload.core import reading
    from payload.core.errors import UserError

    settings = reading.parse_json(raw, what=what, hint=_CONFIG_HINT)
    if not isinstance(settings, dict):
        raise UserError(f"{what} is not a JSON object", hint=_CONFIG_HINT)
    if not isinstance(settings.get("model_type"), str):
        raise UserError(f"{what} has no model_type", hint=_CONFIG_HINT)
    wrong = None
    for key in CONFIG_SIZES:
        value = settings.get(key)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool)
                                      and value > 0):
            wrong = wrong or (key, value, "a whole number above 0")
    for key in CONFIG_POSITIVE:
        value = settings.get(key)
        if value is not None and not (_number(value) and value > 0):
            wrong = wrong or (key, value, "a number above 0")
    for key in CONFIG_SHARES:
        value = settings.get(key)
        if value is not None and not (_number(value) and 0 <= value < 1):
            wrong = wrong or (key, value, "a share from 0 up to 1")
    if wrong:
        key, value, kind = wrong
        raise UserError(f"{what}'s {key} is {json.dumps(value)[:40]}, not {kind}",
                        hint="its config.json must describe the model")
    dropped = [key for key in CONFIG_ELSEWHERE if key in settings]
    if dropped:
        logging.getLogger(__name__).warning(
            "%s: %s ignored (it points at code elsewhere; tpuctl builds the model itself)",
            what, ", ".join(dropped))
        settings = {k: v for k, v in settings.items() if k not in dropped}
    return settings


def read_config_json(path: str, *, source: str | None = None) -> dict:
    """A transformers config.json file (a user's model.config: links followed), or the one in a
    model folder (its own file: payload.core.reading), local or gs://, as `config_settings`
    reads it. `source` names the file or folder in every refusal (default: its path)."""
    from payload.core import reading
    from payload.core.errors import UserError

    if path.endswith(".json"):
        what = source or path
        return config_settings(reading.read_file(path, what=what, hint=_CONFIG_HINT), what=what)
    what = f"{source or path}: config.json"
    raw = reading.read_folder(path, ("config.json",), source=source or path,
                              limit=reading.CONFIG_LIMIT).get("config.json")
    if raw is None:
        raise UserError(f"{what} does not exist", hint=_CONFIG_HINT)
    return config_settings(raw, what=what)


def tokenizer_json_size(raw: dict) -> int:
    """How many ids a tokenizer.json gives out: its model's vocabulary and added tokens."""
    vocab = raw["model"]["vocab"]
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
    ids += [t["id"] for t in raw.get("added_tokens", [])]
    return max(ids) + 1 if ids else 0

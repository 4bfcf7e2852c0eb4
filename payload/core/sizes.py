"""Model sizes by their published names, the shapes they stand for, and parameter counts.

    SIZES["roberta"]["base"]            # Shape(hidden_size=768, num_layers=12, num_heads=12, ...)
    parameter_count(config, vocab_size=32000)   # the model a run config builds, from its shapes
    parameter_count({"model_type": "gpt2", "n_embd": 768, "n_layer": 12}, vocab_size=50257)

One table, read by the config checks (`model.size`), the model builder and the run plan.
Counting is arithmetic on the shapes, no model is built: the tests check it against the real
models' own counts, TensorFlow's and PyTorch's, for every family and size.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any

# transformers' TF RoBERTa embeddings fix their padding index at 1 whatever the config says:
# positions count from there.
ROBERTA_POSITION_PADDING = 1
# Shape keys a run config may set one by one, and what they are when nothing describes the
# architecture.
SHAPE_DEFAULTS = {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "intermediate_size": 1024}


@dataclass(frozen=True, kw_only=True)
class Shape:
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    # T5 v1.1: every head is 64 wide whatever the head count, the feed-forward is gated GELU
    # (wi_0, wi_1) and the output projection is its own matrix, not the embeddings.
    head_size: int | None = None  # None: hidden_size / num_heads
    gated_gelu: bool = False
    tied_head: bool = True


def _encoder(layers: int, hidden: int, heads: int) -> Shape:
    return Shape(hidden_size=hidden, num_layers=layers, num_heads=heads,
                 intermediate_size=4 * hidden)


def _t5_v1_1(hidden: int, layers: int, heads: int, ff: int) -> Shape:
    return Shape(hidden_size=hidden, num_layers=layers, num_heads=heads, intermediate_size=ff,
                 head_size=64, gated_gelu=True, tied_head=False)


# tiny and small are the BERT miniatures' shapes (Turc et al. 2019, "BERT-Tiny", "BERT-Small");
# RoBERTa and GPT-2 were not published that small and take the same ones. T5's tiny is the
# T5-efficient "tiny" shape in v1.1 form.
_TINY, _SMALL = _encoder(2, 128, 2), _encoder(4, 512, 8)
SIZES: dict[str, dict[str, Shape]] = {
    "bert": {"tiny": _TINY, "small": _SMALL, "base": _encoder(12, 768, 12),
             "large": _encoder(24, 1024, 16)},
    "roberta": {"tiny": _TINY, "small": _SMALL, "base": _encoder(12, 768, 12),
                "large": _encoder(24, 1024, 16)},
    "gpt2": {"tiny": _TINY, "small": _encoder(12, 768, 12), "medium": _encoder(24, 1024, 16),
             "large": _encoder(36, 1280, 20), "xl": _encoder(48, 1600, 25)},
    "t5": {"tiny": _t5_v1_1(256, 4, 4, 1024), "small": _t5_v1_1(512, 8, 6, 1024),
           "base": _t5_v1_1(768, 12, 12, 2048), "large": _t5_v1_1(1024, 24, 16, 2816)},
}


def shape_of(model_cfg) -> Shape:
    """The shape a run config's `model` section asks for: its size, or its shape keys (the
    defaults for any it leaves out). Not for `model.config` / `model.init_from`."""
    if model_cfg.size is not None:
        return SIZES[model_cfg.family][model_cfg.size]
    keys = {k: getattr(model_cfg, k) or default for k, default in SHAPE_DEFAULTS.items()}
    return Shape(**keys)


def transformers_config(model_cfg, *, vocab_size: int, seq_len: int) -> dict:
    """The transformers config (keyword arguments with `model_type`) for a sized model."""
    family, s, dropout = model_cfg.family, shape_of(model_cfg), model_cfg.dropout
    # No dropout on the attention weights unless asked for: pretraining goes without it (T5
    # v1.1, MaxText), and the fused attention kernels have none (payload.core.fit.attention).
    attention_dropout = model_cfg.attention_dropout or 0.0
    if family in ("bert", "roberta"):
        encoder = {
            "model_type": family,
            "vocab_size": vocab_size,
            "hidden_size": s.hidden_size,
            "num_hidden_layers": s.num_layers,
            "num_attention_heads": s.num_heads,
            "intermediate_size": s.intermediate_size,
            "hidden_dropout_prob": dropout,
            "attention_probs_dropout_prob": attention_dropout,
            "max_position_embeddings": max(512, seq_len),
        }
        if family == "roberta":
            encoder["max_position_embeddings"] += ROBERTA_POSITION_PADDING + 1
            encoder["type_vocab_size"] = 1
        return encoder
    if family == "gpt2":
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
            "attn_pdrop": attention_dropout,
        }
    t5 = {
        "model_type": "t5",
        "vocab_size": vocab_size,
        "d_model": s.hidden_size,
        "d_kv": s.head_size or s.hidden_size // s.num_heads,
        "d_ff": s.intermediate_size,
        "num_layers": s.num_layers,
        "num_decoder_layers": s.num_layers,
        "num_heads": s.num_heads,
        "dropout_rate": dropout,
    }
    if s.gated_gelu:
        t5["feed_forward_proj"] = "gated-gelu"
    if not s.tied_head:
        t5["tie_word_embeddings"] = False
    return t5


@dataclass(frozen=True)
class ParameterCount:
    total: int
    embeddings: int  # token and position embeddings (and an untied output matrix)

    @property
    def non_embedding(self) -> int:
        return self.total - self.embeddings


def parameter_count(source: Any, vocab_size: int | None = None) -> int:
    """Parameters of the model `source` describes: a run config (`RunConfig`, with the
    vocabulary it gets: payload.training.runplan.run_architecture finds it), a transformers config or its
    dict / config.json contents. `vocab_size` overrides the vocabulary."""
    return count_parameters(source, vocab_size).total


def count_parameters(source: Any, vocab_size: int | None = None) -> ParameterCount:
    """`parameter_count` with the embeddings' share, for FLOP estimates (6 x non-embedding)."""
    config = architecture(source, vocab_size)
    return _COUNTERS[config["model_type"]](config)


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
                "relative_attention_max_distance", "num_key_value_heads")
# Its other numbers, which transformers takes as they are and fails on only once a model is
# built: finite numbers above 0 (epsilons, initial scales), or shares in [0, 1) (dropouts).
CONFIG_POSITIVE = ("layer_norm_eps", "layer_norm_epsilon", "initializer_range",
                   "initializer_factor")
CONFIG_SHARES = ("hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop",
                 "embd_pdrop", "attn_pdrop", "summary_first_dropout", "dropout_rate",
                 "classifier_dropout")
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


def _encoder_count(c: dict) -> ParameterCount:
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


def _gpt2_count(c: dict) -> ParameterCount:
    v, h = c["vocab_size"], c.get("n_embd", 768)
    layers, positions = c.get("n_layer", 12), c.get("n_positions", 1024)
    i = c.get("n_inner") or 4 * h
    layer = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * i + i) + (i * h + h)
    untied = 0 if c.get("tie_word_embeddings", True) else v * h
    embeddings = (v + positions) * h + untied
    return ParameterCount(embeddings + layers * layer + 2 * h, embeddings)


def _t5_count(c: dict) -> ParameterCount:
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


_COUNTERS = {"bert": _encoder_count, "roberta": _encoder_count, "gpt2": _gpt2_count,
             "t5": _t5_count}

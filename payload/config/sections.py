"""The run's sections beside the cluster: data, tokenizer, model, train, hub.

    ModelConfig(family="gpt2", size="small")
    check_model_config_file("gpt2.json", "gpt2", seq_len=1024)   # model.config, checked early
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from payload.config.base import (
    MAX_LEARNING_RATE,
    MAX_STEPS,
    MIN_SEQ_LEN,
    EngineName,
    PathText,
    Section,
    check,
    check_scheme,
)
from payload.core import reading
from payload.core.engines import DEFAULT as DEFAULT_ENGINE
from payload.core.errors import UserError
from payload.core.families import FAMILIES, check_shape
from payload.core.sizes import SHAPE_DEFAULTS, SIZES, config_settings
from payload.core.storage import has_magic

# The keys that describe an architecture one by one (the shape keys).
SHAPE_KEYS = (*SHAPE_DEFAULTS, "num_kv_heads")


class CorpusEntry(Section):
    """A weighted data.corpus entry: its files are one source, drawn by `weight` against the
    other sources (weights are relative; 0 leaves a source out, e.g. from a resume on)."""

    path: PathText
    weight: float = Field(ge=0, strict=True)


# The union tags of a data.corpus entry, and what each is (dropped from error locations).
CORPUS_TAGS = {"plain": str, "weighted": CorpusEntry}
# A plain entry (a path, glob, folder or hf:NAME) or a weighted one ({path, weight}); a mapping
# is read as a weighted entry only, so a mistake in one is reported once, not once per kind.
CorpusItem = Annotated[
    Annotated[PathText, Tag("plain")] | Annotated[CorpusEntry, Tag("weighted")],
    Discriminator(lambda v: "weighted" if isinstance(v, dict | CorpusEntry) else "plain")]


@dataclass(frozen=True)
class CorpusSource:
    """One source of the training mixture: its name (a weighted entry's path; "" for the pool
    of plain entries), the entries it reads and its weight."""

    name: str
    paths: tuple[str, ...]
    weight: float


class DataConfig(Section):
    corpus: list[CorpusItem] = Field(min_length=1)
    text_column: str = "text"
    # How plain-text files hold documents: one per line, or separated by blank lines.
    document_split: Literal["line", "blank_line"] = "line"
    seq_len: int = Field(128, ge=MIN_SEQ_LEN)
    # 0 holds nothing out: prepare then skips the validation split (what a prepare-only run or
    # a benchmark may want), and a job that trains is refused (check_stages).
    validation_fraction: float = Field(0.01, ge=0.0, lt=1.0)
    records_per_shard: int = Field(10_000, gt=0)
    # A longer document almost always means a file in the wrong format (a whole book on one line).
    max_document_mb: float = Field(4.0, gt=0)
    # For `hf:NAME` corpora.
    hf_config: str | None = None
    hf_split: str = "train"
    # Each corpus entry's path -> the text the user's config wrote for it (a relative path, a
    # local file's staged gs:// copy -> the entry it came from): what the run's reports name a
    # source by. Filled when a config file is read; paths not in it are named as they are.
    corpus_names: dict[str, str] = Field(default_factory=dict)

    @field_validator("corpus", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return [value] if isinstance(value, str | dict) else value

    @field_validator("corpus")
    @classmethod
    def _schemes(cls, value: list[str | CorpusEntry]) -> list[str | CorpusEntry]:
        paths = [entry_path(e) for e in value]
        for entry in paths:
            check_scheme(entry, "read")
            if _walks_the_root(entry):
                raise ValueError(f"'{entry}' would walk the whole filesystem; name the folder "
                                 "that holds the corpus (such as /data/corpus/**/*.txt)")
        twice = sorted({p for p in paths if paths.count(p) > 1})
        if twice:
            raise ValueError(f"'{twice[0]}' is named twice; name each input once")
        if all(isinstance(e, CorpusEntry) and e.weight == 0 for e in value):
            raise ValueError("every weight is 0, so there is nothing to train on; give at "
                             "least one entry a weight above 0")
        return value

    @property
    def paths(self) -> list[str]:
        """Every entry's path, in corpus order."""
        return [entry_path(e) for e in self.corpus]

    @property
    def sources(self) -> list[CorpusSource]:
        """The training mixture: the plain entries pooled into one source of weight 1 (named
        "", at the first plain entry's place), each weighted entry a source of its own."""
        plain = tuple(e for e in self.corpus if isinstance(e, str))
        out = []
        for e in self.corpus:
            if isinstance(e, CorpusEntry):
                out.append(CorpusSource(name=e.path, paths=(e.path,), weight=e.weight))
            elif e == plain[0]:
                out.append(CorpusSource(name="", paths=plain, weight=1.0))
        return out

    def source_name(self, source: str) -> str:
        """A training source (DataConfig.sources) as the config names it: a weighted entry's
        path as written, or for the pool of plain entries ("") those entries as written, joined.

        >>> data = DataConfig(corpus=["/r/a.txt", {"path": "/r/b.txt", "weight": 1}],
        ...                   corpus_names={"/r/a.txt": "a.txt", "/r/b.txt": "b.txt"})
        >>> data.source_name("/r/b.txt"), data.source_name("")
        ('b.txt', 'a.txt')
        """
        named = self.corpus_names.get
        if source:
            return named(source, source)
        pool = next((m.paths for m in self.sources if not m.name), tuple(self.paths))
        return " + ".join(dict.fromkeys(named(path, path) for path in pool))

    @property
    def weighted(self) -> bool:
        """Whether some entry has a weight (the sources are then kept apart)."""
        return any(isinstance(e, CorpusEntry) for e in self.corpus)


def entry_path(entry: str | CorpusEntry) -> str:
    return entry.path if isinstance(entry, CorpusEntry) else entry


def _walks_the_root(entry: str) -> bool:
    """Whether a local corpus entry is the filesystem's root folder, or a recursive pattern
    (`**`) whose folders before the first wildcard end at the root (/**, /*/**)."""
    if entry.startswith(("gs:", "hf:")):
        return False
    parts = entry.split(os.sep)
    fixed = list(itertools.takewhile(lambda part: not has_magic(part), parts))
    root = os.path.realpath(os.sep.join(fixed) or os.sep)
    if root != os.path.dirname(root):  # not the root
        return False
    return len(fixed) == len(parts) or "**" in parts[len(fixed):]


class TokenizerConfig(Section):
    kind: Literal["unigram", "bpe", "wordpiece", "sentencepiece"] = "unigram"
    vocab_size: int = Field(32_000, gt=0, le=1_000_000)
    # Reuse an existing Hugging Face tokenizer folder instead of training one.
    path: PathText | None = None
    # Train on the first megabytes of each input (proportionally); null trains on everything.
    sample_mb: float | None = Field(256.0, gt=0)
    min_frequency: int = Field(2, ge=1)

    @field_validator("path")
    @classmethod
    def _scheme(cls, value: str | None) -> str | None:
        return value if value is None else check_scheme(value, "read", quote=False)


# The families by name, as payload.core.families registers them.
FamilyName = Literal[tuple(FAMILIES)]  # type: ignore[valid-type]


class ModelConfig(Section):
    family: FamilyName
    # The architecture, described once: a published size by name, the shape keys (defaults for
    # any left out; all four defaults when nothing describes it), a transformers config.json,
    # or a model folder to continue pretraining (its weights, its tokenizer).
    size: str | None = None
    hidden_size: int | None = Field(None, gt=0)
    num_layers: int | None = Field(None, gt=0)
    num_heads: int | None = Field(None, gt=0)
    intermediate_size: int | None = Field(None, gt=0)
    # Llama's grouped-query attention: heads of keys and values, each shared by
    # num_heads / num_kv_heads query heads (1: multi-query); unset: one per query head. A shape
    # key beside the four above.
    num_kv_heads: int | None = Field(None, gt=0)
    # Llama: the output projection is the token embeddings (true) or a matrix of its own
    # (false); unset: as the named size has it (true with the shape keys).
    tie_embeddings: bool | None = None
    config: PathText | None = None
    init_from: PathText | None = None
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    # Dropout on the attention weights (transformers' attention_probs_dropout_prob / attn_pdrop)
    # of BERT, RoBERTa and GPT-2: none unless set (model.dropout is the other layers'). The JAX
    # engine's fused attention kernels have none, so a rate above 0 keeps a run on the reference
    # attention (payload.core.fit.attention). T5 has one rate for every layer: model.dropout.
    attention_dropout: float | None = Field(None, ge=0.0, lt=1.0)
    mlm_probability: float = Field(0.15, gt=0.0, lt=1.0)
    noise_density: float = Field(0.15, gt=0.0, lt=1.0)
    mean_noise_span_length: float = Field(3.0, ge=1.0)

    @field_validator("init_from")
    @classmethod
    def _init_scheme(cls, value: str | None) -> str | None:
        return value if value is None else check_scheme(value, "read", quote=False)

    @model_validator(mode="before")
    @classmethod
    def _one_architecture(cls, raw: Any) -> Any:
        # Unset and null are the same: the resolved config written for the workers says
        # `size: null` beside the shape keys (or the other way round) and must load again.
        if not isinstance(raw, dict):
            return raw
        given = [key for key in ("size", *SHAPE_KEYS, "config", "init_from")
                 if raw.get(key) is not None]
        kinds: dict[str, str] = {}  # one key named per kind of description
        for key in given:
            kinds.setdefault("shape" if key in SHAPE_KEYS else key, key)
        if len(kinds) > 1:
            first, second = list(kinds.values())[:2]
            raise ValueError(
                f"model.{first} and model.{second} both describe the architecture: set only one "
                "of model.size, the shape keys (hidden_size, num_layers, num_heads, "
                "intermediate_size, num_kv_heads), model.config, model.init_from"
            )
        if not kinds or "shape" in kinds:
            raw = {**raw, **{k: v for k, v in SHAPE_DEFAULTS.items() if raw.get(k) is None}}
        return raw

    @check
    def _known_size(self) -> list[str]:
        sizes = SIZES[self.family]
        if self.size is not None and self.size not in sizes:
            return [f"model.size '{self.size}' is not a {self.family} size; choose one of "
                    f"{', '.join(sizes)}"]
        return []

    @check
    def _heads_divide(self) -> list[str]:
        if self.hidden_size is not None and self.hidden_size % self.num_heads:
            return [f"model.num_heads={self.num_heads} does not divide model.hidden_size="
                    f"{self.hidden_size}; pick a hidden size that is a multiple of the head "
                    "count"]
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            return [f"model.num_kv_heads={self.num_kv_heads} does not divide model.num_heads="
                    f"{self.num_heads}; each key/value head serves the same number of query "
                    "heads"]
        return []


# Weights & Biases refuses these in a project or entity name.
WANDB_NAME = re.compile(r"^[^/\\#?%:\s]{1,128}\Z")


class WandbConfig(Section):
    # The Weights & Biases run the chief logs to (payload.training.wandb_sink): its project and
    # entity (a user or team; unset: the API key's default). wandb is installed on the workers
    # only when this is set (pyproject's `wandb` extra).
    project: str
    entity: str | None = None

    @field_validator("project", "entity")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not WANDB_NAME.match(value):
            raise ValueError(f"'{value}' is not a Weights & Biases name: at most 128 characters, "
                             "none of / \\ # ? % : or spaces")
        return value


class TrainConfig(Section):
    # Which framework trains (payload.engines): the same shards, checkpoint rules and model/
    # folder either way. TPU v6e and later have JAX only.
    engine: EngineName = DEFAULT_ENGINE
    steps: int = Field(gt=0, le=MAX_STEPS)
    batch_size: int = Field(gt=0)
    learning_rate: float = Field(gt=0.0, le=MAX_LEARNING_RATE)
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS)
    weight_decay: float = Field(0.01, ge=0.0)
    max_grad_norm: float = Field(1.0, gt=0.0)
    optimizer: Literal["adamw", "adafactor"] = "adamw"
    bf16: bool = False
    # The JAX engine's rematerialisation of its layers' activations (recomputed in the backward
    # pass instead of kept): none, dots (keep the products, recompute the rest), full (keep
    # each layer's input only, about a third more compute), or auto: the least that fits the
    # chip's memory by the run plan's estimate (payload.core.fit.memory).
    remat: Literal["auto", "none", "dots", "full"] = "auto"
    checkpoint_every: int = Field(500, gt=0)
    keep_checkpoints: int = Field(3, gt=0)
    eval_every: int = Field(500, gt=0)
    eval_batches: int = Field(20, gt=0)
    seed: int = 0
    # Hard stops, counted as billed (payload.cloud.budget): at the limit the run checkpoints,
    # exports and stops.
    max_hours: float | None = Field(None, gt=0)
    max_cost: float | None = Field(None, gt=0)  # USD, by the price table (gcp only)
    # Also log the scalars TensorBoard gets to Weights & Biases (the chief only).
    wandb: WandbConfig | None = None

    @field_validator("steps", "warmup_steps", mode="before")
    @classmethod
    def _countable(cls, value: Any) -> Any:
        # 1.0e+30 is a float too large for Pydantic to even parse as an integer: say the limit.
        if isinstance(value, float) and value > MAX_STEPS:
            raise ValueError(f"must be at most {MAX_STEPS:,}")
        return value


# A Hub repository id: OWNER/NAME, each letters, digits, '-', '_' and '.', not starting or
# ending with '-' or '.', NAME at most 96 characters (the Hub's own rule).
HUB_REPO = re.compile(r"^[A-Za-z0-9]([\w.-]{0,94}[A-Za-z0-9])?/[A-Za-z0-9]([\w.-]{0,94}[A-Za-z0-9])?\Z")


class HubConfig(Section):
    # Publish model/ (with a generated model card) to this Hugging Face model repository after
    # export; `tpuctl train --push-to-hub OWNER/NAME` sets it for one run.
    repo: str | None = None
    private: bool = False  # for a repository the run creates; an existing one stays as it is

    @field_validator("repo")
    @classmethod
    def _repo(cls, value: str | None) -> str | None:
        if value is not None and (not HUB_REPO.match(value) or ".." in value or "--" in value):
            raise ValueError(f"'{value}' is not a Hub repository id: write OWNER/NAME (letters, "
                             "digits, '-', '_', '.')")
        return value


def check_model_config_file(path: str, family: str, *, seq_len: int | None = None) -> dict:
    """`model.config` is a readable transformers config.json for `family` (with positions for
    rows of `seq_len`, when given), as its settings: checked without transformers, before a job
    starts and before the train stage builds the model (which builds it from these settings,
    so both read the same bytes)."""
    what = f"model.config {path}"
    hint = "point it at the config.json file (a transformers model config)"
    config = config_settings(reading.read_file(path, what=what, hint=hint), what=what)
    if config["model_type"] != family:
        raise UserError(f"model.config is a {config['model_type']} config but model.family is "
                        f"{family}", hint="make them agree")
    check_shape(config, family, seq_len=seq_len, what=what)
    return config

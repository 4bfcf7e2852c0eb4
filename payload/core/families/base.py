"""What every family module gives (FamilySpec) and the shapes and counts they share.

    spec = FAMILIES["gpt2"]                                   # a FamilySpec, one per module
    spec.transformers_config(model_cfg, vocab_size=8000, seq_len=128)   # the config it writes
    spec.count(architecture).total, spec.dims(architecture).width

A family module (payload.core.families.<name>) fills one FamilySpec with its data and its
functions; payload.core.families holds the registry that everything else asks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from payload.core import flops
from payload.core.fit.attention import MaskKind, Site

# The engines by name (payload.core.engines: their specs); every family trains on both unless
# its module says otherwise.
BOTH_ENGINES = ("tensorflow", "jax")
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
    # Grouped-query attention (Llama): heads of keys and values, each shared by
    # num_heads / num_kv_heads query heads; None: one per query head.
    num_kv_heads: int | None = None
    rope_theta: float = 10000.0  # the rotary embeddings' base (Llama)


@dataclass(frozen=True)
class ParameterCount:
    total: int
    embeddings: int  # token and position embeddings (and an untied output matrix)

    @property
    def non_embedding(self) -> int:
        return self.total - self.embeddings


@dataclass(frozen=True, kw_only=True)
class Dims:
    """A model's widths as the memory estimates read them (payload.core.fit.memory,
    payload.training.runplan.cpu_memory): one stack (decoder_layers 0) or an encoder and a
    decoder."""

    width: int
    layers: int  # the (encoder's) stack
    heads: int
    head_dim: int
    ff: int
    gated: bool = False  # the feed-forward has two input matrices
    dropout: bool = False  # dropout on the residual stream
    decoder_layers: int = 0
    # The norm follows the residual sum (BERT's post-norm), so its float32 input is kept
    # apart from the residual stream; before the sum (pre-norm) it reads the stream itself.
    post_norm: bool = False

    @property
    def all_layers(self) -> int:
        return self.layers + self.decoder_layers


def max_predictions(seq_len: int, mlm_probability: float) -> int:
    """Masked positions per row that a masked LM's head looks at (BERT's
    max_predictions_per_seq)."""
    return max(1, math.ceil(seq_len * mlm_probability))


def same_length(model_cfg, seq_len: int) -> int:
    """A stored record is a row: `seq_len` tokens."""
    del model_cfg
    return seq_len


def no_target(model_cfg, seq_len: int) -> None:
    del model_cfg, seq_len


def check_heads_and_positions(spec: FamilySpec, settings: dict, *, seq_len: int | None,
                              what: str, hidden_keys=("hidden_size", "n_embd"),
                              head_keys=("num_attention_heads", "n_head"),
                              position_keys=("max_position_embeddings", "n_positions")) -> None:
    """Heads that divide the hidden size, and position embeddings for every token of a row."""
    from payload.core.errors import UserError

    def first(keys):
        return next((settings[k] for k in keys if settings.get(k)), None)

    hidden, heads = first(hidden_keys), first(head_keys)
    if hidden and heads and hidden % heads:
        raise UserError(f"{what}: {heads} heads do not divide hidden size {hidden}",
                        hint="pick a hidden size that is a multiple of the head count")
    positions = first(position_keys)
    if seq_len is not None and positions and positions < spec.positions_needed(seq_len):
        raise UserError(f"{what} has {positions} positions, too few for data.seq_len "
                        f"{seq_len} (a {spec.name} model needs "
                        f"{spec.positions_needed(seq_len)})",
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
    title: str  # the family in prose ("GPT-2")
    objective: str  # "mlm" | "clm" | "span"
    # transformers' class of the pretraining task: the export's config.json `architectures`,
    # the TF engine's class ("TF" + it), the JAX engine's model of the same name.
    architecture: str
    auto_class: str  # what loads the exported folder (the model card's example)
    pipeline_tag: str  # the Hub's task for the model card
    # The published sizes by name.
    sizes: dict[str, Shape]
    # The engines that train it (payload.core.engines names).
    engines: tuple[str, ...] = BOTH_ENGINES
    # The transformers config (keyword arguments with model_type) of a shape:
    # (shape, the run config's model section, vocabulary size, row length).
    config_of: Callable[..., dict]
    # Parameters of a transformers config dict, counted from its shapes.
    count: Callable[[dict], ParameterCount]
    # Model FLOPs of training on one row (payload.core.flops): (architecture, row length,
    # positions the head predicts).
    flops: Callable[[dict, int, int], flops.StepFlops]
    dims: Callable[[dict], Dims]
    # The attention calls of its model in training: (architecture, row length, target length).
    attention_sites: Callable[[dict, int, int | None], list[Site]]
    # Tokens per stored record and the decoder's target length, from the model section and
    # data.seq_len (only span corruption stores longer rows and has a target).
    record_len: Callable[[object, int], int] = same_length
    target_len: Callable[[object, int], int | None] = no_target
    # What config.json must hold beyond its sizes: (spec, settings, seq_len=row length or
    # None, what=...) raises a UserError; see payload.core.families.check_shape.
    shape_check: Callable[..., None] = check_heads_and_positions
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
    # The tokenizer's post-processing (tokenizers' TemplateProcessing: single, pair) for the
    # model's own use of the tokenizer; None: raw ids (prepare joins documents itself).
    template: tuple[str, str] | None = None
    # The longest row the family's position embeddings allow; T5's relative positions have no
    # hard limit, so the cap there is a memory guard rather than a property of the model.
    max_positions: int = 512
    # Positions the model needs beyond a row's tokens (RoBERTa counts from its padding index).
    extra_positions: int = 0
    # config.json's pad_token_id when the family fixes it (RoBERTa), else the tokenizer's.
    fixed_pad_token_id: int | None = None
    starts_decoder_with_pad: bool = False  # T5's decoder_start_token_id
    # One dropout rate for every layer (T5's dropout_rate): model.attention_dropout is refused.
    one_dropout: bool = False
    # model.dropout applies (embeddings and the residual stream); Llama has dropout only on the
    # attention weights, so a model.dropout the file sets is named as ignored.
    residual_dropout: bool = True
    # A reused tokenizer (model.init_from, tokenizer.path) may name the end, start, unknown and
    # padding tokens its own way (SmolLM's only <|endoftext|>): a causal LM then takes the ones
    # the tokenizer declares, padding and the document separator falling back to its end token,
    # as transformers users pad a causal LM (`tokens_of`).
    reuses_tokenizer_roles: bool = False
    # model.num_kv_heads (grouped-query attention) and model.tie_embeddings apply.
    grouped_attention: bool = False
    # Ids 0.. for these first, where the family has a fixed layout.
    id_order: tuple[str, ...] = ()
    # What the tokenizer returns for the model: what the model's call takes. A tokenizer that
    # also returns token_type_ids breaks `model.generate(**tokenizer(...))` in TF GPT-2 (they
    # are added as embeddings) and TF T5 (it refuses them).
    model_inputs: tuple[str, ...] = ("input_ids", "attention_mask")
    # The family whose measured CPU step times stand for this one's (launcher.estimate).
    timed_as: str | None = None

    def shape(self, model_cfg) -> Shape:
        """The shape a run config's `model` section asks for: its size, or its shape keys (the
        defaults for any it leaves out). Not for `model.config` / `model.init_from`."""
        if model_cfg.size is not None:
            return self.sizes[model_cfg.size]
        keys = {k: getattr(model_cfg, k) or default for k, default in SHAPE_DEFAULTS.items()}
        return Shape(**keys, num_kv_heads=getattr(model_cfg, "num_kv_heads", None))

    def transformers_config(self, model_cfg, *, vocab_size: int, seq_len: int) -> dict:
        """The transformers config (keyword arguments with `model_type`) for a sized model."""
        return self.config_of(self.shape(model_cfg), model_cfg, vocab_size, seq_len)

    def positions_needed(self, seq_len: int) -> int:
        """The position embeddings a model needs for rows of `seq_len` tokens."""
        return seq_len + self.extra_positions

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

    def tokens_of(self, has: Callable[[str], bool],
                  declared: Mapping[str, object]) -> FamilySpec:
        """This family with the special tokens a reused tokenizer has: the family's own names
        where `has` finds them, else (`reuses_tokenizer_roles`) what the tokenizer `declared`
        (tokenizer_config.json's bos_token, eos_token, unk_token, pad_token: a string or
        {"content": ...}), padding, the separator and any role left unfilled taking its end
        token. A name still missing is left as it is, for the caller to refuse.

            spec.tokens_of(lambda t: t in vocab, {"eos_token": "<|endoftext|>"}).pad
        """
        if not self.reuses_tokenizer_roles:
            return self

        def named(key: str) -> str | None:
            token = declared.get(key)
            token = token.get("content") if isinstance(token, dict) else token
            return token if isinstance(token, str) and has(token) else None

        def role(own: str | None, key: str, fallback: str | None = None) -> str | None:
            if own is None or has(own):
                return own
            return named(key) or fallback or own

        eos = role(self.eos, "eos_token")
        end = eos if eos is not None and has(eos) else None
        return dataclasses.replace(
            self, eos=eos, bos=role(self.bos, "bos_token", end),
            unk=role(self.unk, "unk_token", end), pad=role(self.pad, "pad_token", end),
            separator=role(self.separator, "eos_token", end))

    @property
    def special_tokens(self) -> list[str]:
        """Special tokens in id order: the trainer gives them ids 0..n-1."""
        ordered: list[str] = []
        for token in (*self.id_order, self.pad, self.unk, self.cls, self.sep, self.bos, self.eos,
                      self.mask, self.separator, *self.extra):
            if token is not None and token not in ordered:
                ordered.append(token)
        return ordered


__all__ = ["BOTH_ENGINES", "SHAPE_DEFAULTS", "Dims", "FamilySpec", "MaskKind", "ParameterCount", "PyTorchNames",
           "Shape", "Site", "check_heads_and_positions", "max_predictions"]

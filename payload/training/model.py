"""The run's model as both engines describe it: its transformers config, its tokenizer and the
token ids the objectives need. No framework.

    tokenizer, fingerprint = load_tokenizer(config)
    vocab = token_ids(tokenizer, "roberta")
    hf_config = model_config(config.model, vocab=vocab, seq_len=128)
    config_fingerprint(hf_config)             # what a resumed run must not change

Each engine builds its own model from the config (payload.engines.NAME.model / models).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from payload.config import check_model_config_file
from payload.core.errors import UserError
from payload.core.families import FAMILIES, positions_needed


@dataclass(frozen=True, kw_only=True)
class TokenIds:
    """The ids the model config and the objectives need, read from the tokenizer."""

    vocab_size: int
    special: tuple[int, ...]  # never masked, never a random replacement
    pad: int
    unk: int
    mask: int | None = None
    bos: int | None = None
    eos: int | None = None
    sentinels: tuple[int, ...] = ()  # T5's <extra_id_0>, <extra_id_1>, ...


def token_ids(tokenizer, family: str) -> TokenIds:
    """Look the family's special tokens up in a loaded `PreTrainedTokenizerFast` (trained here,
    with them at ids 0..n-1, or reused through tokenizer.path or model.init_from, wherever they
    are, and named as that tokenizer names them: FamilySpec.tokens_of)."""
    def has(token: str) -> bool:
        found = tokenizer.convert_tokens_to_ids(token)
        return found is not None and (found != tokenizer.unk_token_id
                                      or token == tokenizer.unk_token)

    spec = FAMILIES[family].tokens_of(has, {
        key: getattr(tokenizer, key)
        for key in ("bos_token", "eos_token", "unk_token", "pad_token")})

    def lookup(token: str | None) -> int | None:
        if token is None:
            return None
        found = tokenizer.convert_tokens_to_ids(token)
        if found is None or (found == tokenizer.unk_token_id and token != spec.unk):
            raise UserError(
                f"the tokenizer has no {token} token, which {family} needs",
                hint="retrain the tokenizer for this model family",
            )
        return found

    special = {lookup(t) for t in spec.special_tokens} | set(tokenizer.all_special_ids)
    return TokenIds(
        vocab_size=len(tokenizer),
        special=tuple(sorted(special)),
        pad=lookup(spec.pad),
        unk=lookup(spec.unk),
        mask=lookup(spec.mask),
        bos=lookup(spec.bos),
        eos=lookup(spec.eos or spec.separator),
        sentinels=tuple(lookup(t) for t in spec.extra),
    )


def model_config(model_cfg, *, vocab: TokenIds, seq_len: int):
    """A transformers config from the run config's `model` section (its size or shape keys,
    its config file, or the config of the model folder it continues from)."""
    import transformers

    family = model_cfg.family
    if model_cfg.init_from:
        from payload.training.pretrained import pretrained_config

        hf = pretrained_config(model_cfg.init_from, family=family, vocab_size=vocab.vocab_size)
    elif model_cfg.config:
        # The settings the pre-flight checked, read once: transformers gets them, not the path.
        settings = dict(check_model_config_file(model_cfg.config, family, seq_len=seq_len))
        hf = transformers.AutoConfig.for_model(settings.pop("model_type"), **settings)
        hf.vocab_size = vocab.vocab_size
    else:
        hf = _sized_config(model_cfg, vocab=vocab, seq_len=seq_len)
    hf.pad_token_id = vocab.pad
    spec = FAMILIES[family]
    if spec.fixed_pad_token_id is not None:
        # The family fixes it (RoBERTa: payload.core.families.bert, why).
        hf.pad_token_id = spec.fixed_pad_token_id
    if vocab.bos is not None:
        hf.bos_token_id = vocab.bos
    if vocab.eos is not None:
        hf.eos_token_id = vocab.eos
    if spec.starts_decoder_with_pad:
        hf.decoder_start_token_id = vocab.pad
    positions = getattr(hf, "max_position_embeddings", None) or getattr(hf, "n_positions", None)
    needed = positions_needed(family, seq_len)
    if positions is not None and positions < needed:
        raise UserError(
            f"the model has {positions} positions but data.seq_len is {seq_len}",
            hint="lower data.seq_len or raise the model's position count",
        )
    return hf


def _sized_config(m, *, vocab: TokenIds, seq_len: int):
    import transformers

    from payload.core.sizes import transformers_config

    settings = transformers_config(m, vocab_size=vocab.vocab_size, seq_len=seq_len)
    return transformers.AutoConfig.for_model(settings.pop("model_type"), **settings)


def config_fingerprint(hf_config) -> str:
    """What must not change between a checkpoint and a resumed run."""
    raw = hf_config.to_dict()
    for volatile in ("transformers_version", "_name_or_path", "torch_dtype", "dtype"):
        raw.pop(volatile, None)
    return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()


def load_tokenizer(config, files: dict[str, bytes] | None = None):
    """The run's tokenizer as a `PreTrainedTokenizerFast`, and the fingerprint prepare recorded
    for it: both from the same bytes, the tokenizer files read once (`read_tokenizer_files`,
    unless given), which transformers loads from a private folder of their own."""
    import tempfile

    from transformers import PreTrainedTokenizerFast

    from payload.data.tokenizer import (
        TOKENIZER_FILE,
        fingerprint,
        read_tokenizer_files,
        tokenizer_label,
    )

    files = read_tokenizer_files(config) if files is None else files
    tokenizer_fp = fingerprint(files[TOKENIZER_FILE], what=tokenizer_label(config))
    with tempfile.TemporaryDirectory(prefix="tpuctl-tokenizer-") as folder:
        for name, data in files.items():  # private: not one of the run's writes
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
        return PreTrainedTokenizerFast.from_pretrained(folder), tokenizer_fp

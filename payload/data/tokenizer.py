"""Stage `tokenizer`: train a tokenizer on (a sample of) the corpus and save Hugging Face files.

    python -m payload tokenizer --config run.yaml   # -> output_dir/tokenizer/tokenizer.json ...

Kinds: `unigram` (tokenizers' Unigram over Metaspace words), `bpe` (byte-level), `wordpiece`
(BERT style), `sentencepiece` (the sentencepiece trainer, converted to a fast tokenizer).
Special tokens come from the model family and take ids 0..n-1. The folder is saved with the
plain `PreTrainedTokenizerFast` class: a model-specific class name makes newer transformers
rebuild the tokenizer with that model's own normalisation, changing the ids.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator

from payload.config import RunConfig
from payload.core import folders, layout, ownership, reading, storage
from payload.core.errors import UserError, one_line
from payload.core.families import FAMILIES, FamilySpec
from payload.data import corpus

log = logging.getLogger(__name__)

TOKENIZER_DIR = layout.TOKENIZER_DIR
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
# What the tokenizer was trained from. tokenizers' Unigram and WordPiece trainers do not give
# the same vocabulary twice, so a rerun with the same settings keeps the trained tokenizer
# (and the shards made with it) instead of training a new one.
TRAINING_STAMP = layout.TOKENIZER_STAMP
# sentencepiece skips longer "sentences"; documents are fed to it line by line.
_SPM_MAX_SENTENCE_BYTES = 1 << 16


def tokenizer_dir(config: RunConfig) -> str:
    """Where the tokenizer stage writes: output_dir/tokenizer."""
    return storage.join(config.output_dir, TOKENIZER_DIR)


def tokenizer_source(config: RunConfig) -> str:
    """Where later stages read the tokenizer: `tokenizer.path`, or the model folder of
    `model.init_from`, when set (the tokenizer stage may be skipped then), else what the
    tokenizer stage wrote."""
    return config.tokenizer.path or config.model.init_from or tokenizer_dir(config)


def planned_vocab_size(config: RunConfig) -> int:
    """The vocabulary a run's model gets: the reused tokenizer's, or the one it will train."""
    from payload.core.sizes import tokenizer_json_size

    if _reused_from(config):
        raw = _folder_files(config).get(TOKENIZER_FILE)
        if raw is not None:
            what = tokenizer_label(config)
            value, problem = reading.json_value(raw)
            if problem and problem != reading.NOT_JSON:  # too deep to be anything
                raise UserError(f"{what} {problem}", hint="save it with a Hugging Face fast "
                                                         "tokenizer's save_pretrained")
            try:
                return tokenizer_json_size(value)
            except (KeyError, TypeError, AttributeError, ValueError):  # not a tokenizer's JSON
                raise UserError(f"{what} is not a tokenizer (no model vocabulary in it)",
                                hint="save it with a Hugging Face fast tokenizer's "
                                     "save_pretrained") from None
    return config.tokenizer.vocab_size


def _reused_from(config: RunConfig) -> str | None:
    """How the config names a tokenizer it reuses, for messages; None when one is trained."""
    if config.tokenizer.path:
        return f"tokenizer.path {config.tokenizer.path}"
    if config.model.init_from:
        return f"model.init_from {config.model.init_from}"
    return None


# The files of a Hugging Face tokenizer, by name: all that is ever copied from a folder
# (a reused folder may be a whole model folder, or hold anything else beside them).
TOKENIZER_FILES = (
    TOKENIZER_FILE, TOKENIZER_CONFIG, "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "vocab.txt", "merges.txt",  # byte-level BPE, WordPiece
    "spiece.model", "sentencepiece.bpe.model", "tokenizer.model",  # sentencepiece models
)


def tokenizer_label(config: RunConfig) -> str:
    """How messages name the run's tokenizer.json: by the config key that brings it, or its
    path in output_dir."""
    reused = _reused_from(config)
    return f"{reused}: {TOKENIZER_FILE}" if reused else storage.join(tokenizer_dir(config),
                                                                        TOKENIZER_FILE)


def _folder_files(config: RunConfig) -> dict[str, bytes]:
    """The run's tokenizer files (TOKENIZER_FILES) its folder holds, read once into a private
    copy (payload.core.reading.read_folder: the folder's own plain files, no link followed)."""
    folder = tokenizer_source(config)
    if not _reused_from(config) and not storage.is_gcs(folder) and not os.path.isdir(folder):
        return {}  # not trained yet: read_tokenizer_files says so
    return reading.read_folder(folder, TOKENIZER_FILES, source=_reused_from(config) or folder)


def fingerprint(tokenizer_json: bytes, *, what: str = TOKENIZER_FILE) -> str:
    """Identifies a tokenizer by what it encodes with: its canonical tokenizer.json (one line
    naming `what` when it is not JSON)."""
    value = reading.parse_json(tokenizer_json, what=what)
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def _post_processor(family: FamilySpec, tok):
    """The family's template (payload.core.families: [CLS] $A [SEP] and the like) with the ids
    of its special tokens, or None: raw ids (GPT-2, Llama: prepare joins documents itself)."""
    from tokenizers import processors

    if family.template is None:
        return None
    single, pair = family.template
    words = {word.split(":")[0] for word in f"{single} {pair}".split()}
    specials = [t for t in family.special_tokens if t in words]
    return processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(t, tok.token_to_id(t)) for t in specials])


def _train_tokenizers(kind: str, texts: Iterable[str], *, vocab_size: int, family: FamilySpec,
                      min_frequency: int):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    specials = family.special_tokens
    if kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=specials, unk_token=family.unk,
            max_piece_length=16, show_progress=False,
        )
    elif kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        )
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=family.unk, max_input_chars_per_word=100))
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
            continuing_subword_prefix="##", show_progress=False,
        )
    else:
        raise ValueError(kind)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _lines(texts: Iterable[str]) -> Iterator[str]:
    for text in texts:
        for line in text.split("\n"):
            if line.strip():
                yield line[:_SPM_MAX_SENTENCE_BYTES // 4]


def _train_sentencepiece(texts: Iterable[str], *, vocab_size: int, family: FamilySpec):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    specials = family.special_tokens
    others = [t for t in specials if t not in (family.pad, family.unk)]
    pad_id, unk_id = specials.index(family.pad), specials.index(family.unk)
    model = io.BytesIO()
    # sentencepiece fixes pad and unk where asked and fills the free ids below them with the
    # other specials in order, so every special lands on the family's id.
    spm.SentencePieceTrainer.train(
        sentence_iterator=_lines(texts), model_writer=model, model_type="unigram",
        vocab_size=vocab_size, hard_vocab_limit=False, character_coverage=0.9995,
        pad_id=pad_id, pad_piece=family.pad, unk_id=unk_id, unk_piece=family.unk, bos_id=-1,
        eos_id=-1,
        user_defined_symbols=others, max_sentence_length=_SPM_MAX_SENTENCE_BYTES,
        train_extremely_large_corpus=False, minloglevel=2, num_threads=os.cpu_count() or 1,
    )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.getvalue())
    vocab = [(p.piece, p.score if p.type == 1 else 0.0) for p in proto.pieces]
    tok = Tokenizer(models.Unigram(vocab, unk_id=unk_id, byte_fallback=False))
    steps = []
    if proto.normalizer_spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
    # sentencepiece drops leading/trailing whitespace and collapses runs of spaces.
    steps += [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
    tok.normalizer = normalizers.Sequence(steps)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tok, model.getvalue()


def train_tokenizer(kind: str, texts: Iterable[str], *, vocab_size: int, family: FamilySpec,
                    min_frequency: int = 2):
    """A trained `tokenizers.Tokenizer` with the family's special tokens at ids 0..n-1."""
    from tokenizers import AddedToken

    if kind == "sentencepiece":
        tok, _ = _train_sentencepiece(texts, vocab_size=vocab_size, family=family)
    else:
        tok = _train_tokenizers(kind, texts, vocab_size=vocab_size, family=family,
                                min_frequency=min_frequency)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in family.special_tokens])
    for expected, token in enumerate(family.special_tokens):
        if tok.token_to_id(token) != expected:
            raise AssertionError(f"special token {token} got id {tok.token_to_id(token)}")
    processor = _post_processor(family, tok)
    if processor is not None:
        tok.post_processor = processor
    return tok


def save_tokenizer(tok, family: FamilySpec, out_dir: str, *, model_max_length: int,
                   stamp: dict | None = None) -> None:
    """Write Hugging Face tokenizer files to `out_dir` (local or gs://), all at once, with the
    training stamp when given: the folder is replaced whole (folders.replacing_folder)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=model_max_length,
        unk_token=family.unk, pad_token=family.pad, mask_token=family.mask,
        cls_token=family.cls, sep_token=family.sep, bos_token=family.bos, eos_token=family.eos,
        additional_special_tokens=list(family.extra) or None,
        model_input_names=list(family.model_inputs),
    )
    with folders.replacing_folder(out_dir, {"stage": "tokenizer"}) as folder:
        fast.save_pretrained(folder)
        if stamp is not None:
            with open(os.path.join(folder, TRAINING_STAMP), "w", encoding="utf-8") as f:
                json.dump(stamp, f, indent=1)


def _points_elsewhere(key: str) -> bool:
    """A tokenizer_config.json key that sends transformers to a file other than the folder's own
    (tokenizer_file, fast_tokenizer_files, vocab_file, special_tokens_map_file: every *_file and
    *_files) or to code elsewhere (auto_map), or names where it was saved (name_or_path)."""
    return key in ("auto_map", "name_or_path") or key.endswith(("_file", "_files"))


_WARNED: set[str] = set()


def _own_settings(raw: bytes, what: str) -> bytes:
    """tokenizer_config.json without the keys that point elsewhere (one line in the log when
    one pointed somewhere): what is loaded is then the tokenizer.json that was fingerprinted."""
    settings = reading.parse_json(raw, what=what, hint="save the tokenizer again with "
                                                       "save_pretrained")
    if not isinstance(settings, dict):
        raise UserError(f"{what} is not a JSON object",
                        hint="save the tokenizer again with save_pretrained")
    dropped = [key for key in settings if _points_elsewhere(key)]
    if not dropped:
        return raw
    shown = [key for key in dropped if key != "name_or_path" and settings[key]]
    if shown and what not in _WARNED:  # once a process: the stages read the files more than once
        _WARNED.add(what)
        log.warning("%s: %s ignored: tpuctl reads only the folder's own tokenizer files",
                    what, ", ".join(f"{k}={json.dumps(settings[k])[:60]}" for k in shown))
    return _settings_bytes({k: v for k, v in settings.items() if k not in dropped})


def _settings_bytes(settings: dict) -> bytes:
    return (json.dumps(settings, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def with_model_inputs(files: dict[str, bytes], family: FamilySpec) -> dict[str, bytes]:
    """The tokenizer files with a tokenizer_config.json that makes the tokenizer return what the
    family's model takes (a tokenizer saved before this was recorded, or reused from
    elsewhere, may return token_type_ids)."""
    settings = json.loads(files.get(TOKENIZER_CONFIG, b"{}"))  # read_tokenizer_files' object
    settings["model_input_names"] = list(family.model_inputs)
    return {**files, TOKENIZER_CONFIG: _settings_bytes(settings)}


def read_tokenizer_files(config: RunConfig) -> dict[str, bytes]:
    """The run's tokenizer files by name, read once from its folder (`tokenizer_source`) into a
    private copy: every later use (the fingerprint, prepare's encoder, transformers' tokenizer,
    the copies into output_dir and model/) takes these bytes, never the folder again.
    tokenizer.json must be there; tokenizer_config.json, when there, is an object, without the
    keys that point elsewhere (`_own_settings`)."""
    folder = tokenizer_source(config)
    files = _folder_files(config)
    if TOKENIZER_FILE not in files:
        if _reused_from(config):
            why = storage.not_a_folder(folder) or f"has no {TOKENIZER_FILE}"
            raise UserError(f"{_reused_from(config)} {why}",
                            hint="point it at a folder saved by a Hugging Face fast tokenizer "
                            "(AutoTokenizer.from_pretrained(P).save_pretrained(P) writes one)")
        raise UserError(f"no tokenizer at {folder}",
                        hint="run the tokenizer stage first, or set tokenizer.path")
    if TOKENIZER_CONFIG in files:
        files[TOKENIZER_CONFIG] = _own_settings(
            files[TOKENIZER_CONFIG], f"{_reused_from(config) or folder}: {TOKENIZER_CONFIG}")
    return files


def write_tokenizer_files(files: dict[str, bytes], dest: str) -> None:
    """Write the tokenizer files read once (`read_tokenizer_files`) into a folder, local or
    gs://: the exported model, a reused tokenizer's place in output_dir."""
    for name, data in files.items():
        storage.write_bytes(storage.join(dest, name), data)


def load_tokenizer(config: RunConfig, files: dict[str, bytes] | None = None):
    """The `tokenizers.Tokenizer` prepare encodes with, and its fingerprint, from the tokenizer
    files read once (`read_tokenizer_files`, unless given)."""
    from tokenizers import Tokenizer

    files = read_tokenizer_files(config) if files is None else files
    raw = files[TOKENIZER_FILE]
    tokenizer_fp = fingerprint(raw, what=tokenizer_label(config))  # refuses what is not JSON
    try:
        tok = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as exc:  # the Rust side raises a plain Exception for bad files
        raise UserError(f"{tokenizer_label(config)} is not a valid tokenizer "
                        f"({one_line(str(exc))[:200]})") from None
    return tok, tokenizer_fp


def _read_json(path: str):
    """One of tpuctl's own records, or None when it is unreadable in any way."""
    try:
        return reading.read_json(path)
    except UserError:
        return None


def made_with(output_dir: str, tokenizer_fp: str) -> list[str]:
    """What in output_dir was made with the tokenizer of this fingerprint (shards, checkpoints):
    what replacing that tokenizer would orphan, since it cannot be trained again the same."""
    from payload.data import shards as records

    found = []
    stamps = [records.manifest_path(output_dir),
              *storage.listdir(storage.join(layout.data_dir(output_dir), layout.PARTS_DIR))]
    for path in stamps:
        stamp = _read_json(path) if storage.exists(path) else None
        if isinstance(stamp, dict) and stamp.get("tokenizer_fingerprint") == tokenizer_fp:
            found.append("the shards in data/")
            break
    # The checkpoints' identity (written by training.checkpoints) names their tokenizer.
    identity_path = layout.run_identity_path(output_dir)
    identity = _read_json(identity_path) if storage.exists(identity_path) else None
    if isinstance(identity, dict) and identity.get("tokenizer") == tokenizer_fp:
        found.append("the checkpoints")
    return found


def check_replacement(config: RunConfig, *, overwrite: bool,
                      sources: list[corpus.Source] | None = None,
                      files: dict[str, bytes] | None = None) -> bool:
    """Whether the tokenizer stage would (re)write output_dir/tokenizer; refuses, without
    --overwrite, to replace one that shards or checkpoints were made with. Writes nothing."""
    out = tokenizer_dir(config)
    current = storage.join(out, TOKENIZER_FILE)
    if not storage.exists(current):
        return True
    def held() -> str:
        return fingerprint(reading.read_file(current, limit=reading.JSON_LIMIT), what=current)

    if _reused_from(config):
        wanted = (files or read_tokenizer_files(config))[TOKENIZER_FILE]
        if fingerprint(wanted) == held():
            return True  # the same tokenizer: copying it again changes nothing
        why = f"{_reused_from(config)} is another tokenizer"
    else:
        stamp_path = storage.join(out, TRAINING_STAMP)
        stamp = _training_stamp(config, sources or corpus.resolve_sources(config.data))
        if storage.exists(stamp_path) and _read_json(stamp_path) == stamp:
            return overwrite  # the same settings: trained again only when asked to
        why = "the tokenizer settings or the corpus changed"
    users = made_with(config.output_dir, held())
    if users and not overwrite:
        raise UserError(
            f"{out} would be replaced ({why}), but {' and '.join(users)} were made with it",
            hint="pass --overwrite to replace it (then prepare and train need --overwrite too), "
                 "or restore the earlier settings",
        )
    return True


def family_tokens(config: RunConfig, tok, files: dict[str, bytes]) -> FamilySpec:
    """The run's family with the special tokens its tokenizer (`tok`, loaded from the files read
    once) has: a reused one may name them its own way (FamilySpec.tokens_of)."""
    declared = json.loads(files[TOKENIZER_CONFIG]) if TOKENIZER_CONFIG in files else {}
    return FAMILIES[config.model.family].tokens_of(lambda t: tok.token_to_id(t) is not None,
                                                   declared)


def _check_reused(config: RunConfig, files: dict[str, bytes]) -> None:
    """A reused tokenizer must carry the special tokens the family's objective needs."""
    tok, _ = load_tokenizer(config, files)
    family = family_tokens(config, tok, files)
    needed = [t for t in (family.pad, family.unk, family.mask, family.separator, family.row_start,
                          *family.extra) if t]
    missing = [t for t in needed if tok.token_to_id(t) is None]
    if missing:
        raise UserError(
            f"{_reused_from(config)} lacks {family.name}'s special tokens "
            f"{', '.join(missing[:5])}",
            hint=("continue from a model whose tokenizer has them" if config.model.init_from
                  else "train one with tokenizer.kind, or use a tokenizer made for this family"),
        )


def _start(config: RunConfig) -> None:
    """Checks passed: take output_dir and record the config (the first writes of a run)."""
    from payload.config import dump_config

    ownership.claim_output_dir(config.output_dir)
    ownership.check_writable(config.output_dir)
    storage.write_text(layout.config_path(config.output_dir), dump_config(config))


def run_tokenizer(config: RunConfig, *, overwrite: bool = False) -> None:
    out = tokenizer_dir(config)
    if _reused_from(config):
        corpus.check_apart(config.data, config.output_dir)
        ownership.check_output_dir(config.output_dir)
        files = read_tokenizer_files(config)  # once: what is checked is what is copied
        _check_reused(config, files)
        write = check_replacement(config, overwrite=overwrite, files=files)
        _start(config)
        if write:
            with folders.replacing_folder(out, {"stage": "tokenizer",
                                                "source": tokenizer_source(config)}) as folder:
                write_tokenizer_files(files, folder)
        log.info("reusing the tokenizer of %s -> %s", _reused_from(config), out)
        return
    family = FAMILIES[config.model.family]
    sources = corpus.resolve_sources(config.data)
    corpus.check_apart(config.data, config.output_dir, sources)
    ownership.check_output_dir(config.output_dir)
    stamp = _training_stamp(config, sources)
    if not check_replacement(config, overwrite=overwrite, sources=sources):
        _start(config)
        log.info("tokenizer already trained with these settings: %s (--overwrite trains it "
                 "again)", out)
        return
    _start(config)
    if overwrite and storage.exists(storage.join(out, TOKENIZER_FILE)):
        log.info("--overwrite: training the tokenizer again, %s", folders.replacing_words(out))
    elif storage.exists(storage.join(out, TOKENIZER_FILE)):
        log.info("tokenizer settings or corpus changed: training a new one")
    sample_bytes = None if config.tokenizer.sample_mb is None else int(
        config.tokenizer.sample_mb * 1e6)
    counter = corpus.ByteCounter()
    texts = counter.count(corpus.sample_documents(sources, config.data, sample_bytes))
    started = time.monotonic()
    log.info("training %s tokenizer (vocab %d) on %s", config.tokenizer.kind,
             config.tokenizer.vocab_size,
             "all of the corpus" if sample_bytes is None else f"up to {sample_bytes / 1e6:g} MB")
    tok = train_tokenizer(config.tokenizer.kind, texts, vocab_size=config.tokenizer.vocab_size,
                          family=family, min_frequency=config.tokenizer.min_frequency)
    if counter.documents == 0:
        raise UserError("the corpus has no documents (only blank lines)",
                        hint="check data.corpus and data.document_split")
    save_tokenizer(tok, family, out, model_max_length=config.data.seq_len, stamp=stamp)
    log.info("tokenizer: %d tokens from %.1f MB in %.1fs -> %s", tok.get_vocab_size(),
             counter.bytes / 1e6, time.monotonic() - started, out)


def _training_stamp(config: RunConfig, sources: list[corpus.Source]) -> dict:
    d, t = config.data, config.tokenizer
    return {
        "kind": t.kind, "vocab_size": t.vocab_size, "sample_mb": t.sample_mb,
        "min_frequency": t.min_frequency, "family": config.model.family,
        "seq_len": d.seq_len, "sources": [[s.path, s.size] for s in sources],
        "data": [d.document_split, d.text_column, d.max_document_mb, d.hf_config, d.hf_split],
    }

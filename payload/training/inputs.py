"""What a training run reads, checked before anything is written: the manifest, the shards, the
tokenizer and the model config agree with the run config; and the input order over them.

    inputs = check_inputs(config)          # a mistake is one line and nothing is written
    inputs = with_data_order(config, inputs, resume=True, start=30)   # payload.data.stream
    inputs.train_batches(30, host=0, num_hosts=2, digest=True)  # host 0's masked rows, numpy
    check_batch_size(64, replicas=8)       # the global batch splits evenly over the replicas
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from payload.core import layout, storage
from payload.core.errors import UserError
from payload.data import shards as records
from payload.data import stream as data_stream
from payload.data.objectives import objective_for
from payload.data.reader import Reader


@dataclass(frozen=True, kw_only=True)
class RunInputs:
    """Everything checked before training starts."""

    manifest: records.Manifest
    train_files: list[str]
    validation_files: list[str]
    vocab: object  # model.TokenIds
    hf_config: object
    identity: dict
    objective: object  # payload.data.objectives: what each batch trains (masks, spans)
    seed: int
    batch_size: int
    output_dir: str
    stream: data_stream.TrainStream | None = None  # with_data_order: the order from the start

    def train_batches(self, start: int, *, host: int, num_hosts: int, digest: bool = False):
        """Host `host` of `num_hosts`'s rows of global batches start, start + 1, ... with the
        objective applied (numpy dicts): the same order, masks and exact resume for every engine
        and every layout; `digest`: also note each batch's digest (the chief, for metrics.json)."""
        assert self.stream is not None, "with_data_order first"
        return self.stream.host_batches(start, host, num_hosts, digest=digest)

    def eval_batches(self, *, host: int, num_hosts: int):
        """Host `host`'s rows of the validation batches, the same at every evaluation."""
        out = layout.data_dir(self.output_dir)
        evals = data_stream.EvalStream(Reader.of(self.manifest, out, "validation"),
                                       self.objective, self.seed, self.batch_size)
        return evals.host_batches(host, num_hosts)

    def feature_shapes(self, rows: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """The features of `rows` rows the objective gives: {name: (shape, dtype)}."""
        ids = np.zeros((rows, self.manifest.record_len), np.int32)
        features = data_stream.apply_objective(self.objective, ids, 0, np.arange(rows))
        return {k: (v.shape, v.dtype) for k, v in features.items()}


def run_identity(config, hf_config, tokenizer_fingerprint: str) -> dict:
    """What the checkpoints' run.json records of the run that wrote them (a resume must match)."""
    from payload.training import model as model_lib

    return {"model": model_lib.config_fingerprint(hf_config), "tokenizer": tokenizer_fingerprint,
            "family": config.model.family, "engine": config.train.engine}


def run_model(config) -> tuple[object, dict]:
    """(the transformers config of this run's model, its identity), from the tokenizer and the
    model settings alone: what a resume restores into, without reading the shards."""
    from payload.training import model as model_lib

    tokenizer, fingerprint = model_lib.load_tokenizer(config)
    vocab = model_lib.token_ids(tokenizer, config.model.family)
    hf_config = model_lib.model_config(config.model, vocab=vocab, seq_len=config.data.seq_len)
    return hf_config, run_identity(config, hf_config, fingerprint)


def check_inputs(config) -> RunInputs:
    """The manifest, the shards and the tokenizer agree with the config; nothing is written."""
    from payload.training import model as model_lib

    out = config.output_dir
    manifest = records.load_manifest(out)
    family = config.model.family
    if manifest.family != family:
        raise UserError(
            f"the shards were prepared for {manifest.family}, not {family}",
            hint="rerun prepare with --overwrite for this model family",
        )
    if manifest.seq_len != config.data.seq_len or manifest.record_len != config.record_len:
        raise UserError(
            f"the shards hold rows of {manifest.seq_len} tokens but data.seq_len is "
            f"{config.data.seq_len}",
            hint=f"rerun prepare with --overwrite, or set data.seq_len back to {manifest.seq_len}",
        )
    tokenizer, fingerprint = model_lib.load_tokenizer(config)
    if manifest.tokenizer_fingerprint != fingerprint:
        raise UserError(
            "the shards were made with a different tokenizer than the one this run now uses",
            hint="rerun prepare with --overwrite after changing the tokenizer",
        )
    if manifest.splits["train"].records == 0:
        raise UserError("the training split has no records", hint="add text to data.corpus")
    records.check_shards(out, manifest)
    vocab = model_lib.token_ids(tokenizer, family)
    if vocab.vocab_size != manifest.vocab_size:
        raise UserError(
            f"the tokenizer has {vocab.vocab_size} tokens but the manifest says "
            f"{manifest.vocab_size}",
            hint="rerun prepare with --overwrite",
        )
    hf_config = model_lib.model_config(config.model, vocab=vocab, seq_len=config.data.seq_len)

    def files(split: str) -> list[str]:
        return [
            storage.join(layout.data_dir(out), s.name) for s in manifest.splits[split].shards if s.records
        ]

    identity = run_identity(config, hf_config, fingerprint)
    return RunInputs(
        manifest=manifest,
        train_files=files("train"),
        validation_files=files("validation"),
        vocab=vocab,
        hf_config=hf_config,
        identity=identity,
        objective=objective_for(config, vocab),
        seed=config.train.seed,
        batch_size=config.train.batch_size,
        output_dir=out,
    )


def data_weights(config, manifest: records.Manifest) -> dict[str, float]:
    """The weight of each of the manifest's training sources by this config, in the manifest's
    order; refused when the config's sources are not the ones the data was prepared with."""
    named = {m.name: m.weight for m in config.data.sources}
    held = list(records.split_sources(manifest, "train"))
    if set(held) != set(named):
        def words(names) -> str:
            return ", ".join(sorted(config.data.source_name(n) for n in names)) or "none"
        raise UserError(
            f"data.corpus names sources the prepared data does not keep apart (data: "
            f"{words(held)}; data.corpus: {words(named)})",
            hint="rerun prepare with --overwrite, or restore data.corpus")
    return {name: named[name] for name in held}


def with_data_order(config, inputs: RunInputs, *, resume: bool, start: int,
                    allow_change: bool = False) -> RunInputs:
    """`inputs` with the run's input order (payload.data.stream): a fresh run's from step 0, a
    resume's continued from the order recorded beside the checkpoints, at step `start`."""
    from payload.training.voice import log

    out = config.output_dir
    want = data_stream.Segment(step=0, consumed={}, batch_size=config.train.batch_size,
                               weights=data_weights(config, inputs.manifest),
                               seed=config.train.seed, data=inputs.manifest.data_fingerprint)
    saved = data_stream.read_segments(out) if resume else None
    segments, note = data_stream.resume_segments(saved, want, start=start if resume else 0,
                                                 allow_change=allow_change)
    if note:
        log(note)
    reader = Reader.of(inputs.manifest, layout.data_dir(out), "train")
    return replace(inputs, stream=data_stream.TrainStream(reader, segments, inputs.objective,
                                                          config.train.seed))


def check_batch_size(batch_size: int, replicas: int) -> None:
    if batch_size % replicas:
        raise UserError(
            f"train.batch_size={batch_size} is not divisible by the {replicas} replicas",
            hint=f"use a multiple of {replicas}",
        )

"""What a training run reads, checked before anything is written: the manifest, the shards, the
tokenizer and the model config agree with the run config; and the input pipeline over them.

    inputs = check_inputs(config)          # a mistake is one line and nothing is written
    inputs.pipeline(config, inputs.train_files, shuffle=True, start_batch=0, batch_size=8)
    check_batch_size(64, replicas=8)       # the global batch splits evenly over the replicas
"""

from __future__ import annotations

from dataclasses import dataclass

from payload.core import layout, storage
from payload.core.errors import UserError
from payload.data import shards as records
from payload.data.objectives import objective_for


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

    def pipeline(self, config, files: list[str], *, shuffle: bool, start_batch: int,
                 batch_size: int, pipeline_id: int = 0, num_pipelines: int = 1):
        """Input pipeline `pipeline_id` of `num_pipelines` over `files` (a tf.data dataset of
        `batch_size` rows a batch, the objective applied; each pipeline a share of the global
        batch), from global batch `start_batch` on: the same order, masks and exact resume
        for every engine."""
        from payload.data.pipeline import input_pipeline

        return input_pipeline(
            files, record_len=config.record_len, dtype=self.manifest.dtype,
            batch_size=batch_size, objective=self.objective, seed=config.train.seed,
            shuffle=shuffle, pipeline_id=pipeline_id, num_pipelines=num_pipelines,
            start_batch=start_batch)


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
    )


def check_batch_size(batch_size: int, replicas: int) -> None:
    if batch_size % replicas:
        raise UserError(
            f"train.batch_size={batch_size} is not divisible by the {replicas} replicas",
            hint=f"use a multiple of {replicas}",
        )

"""What the stages would refuse, checked from the config before a job starts anywhere.

    check_before_start(config, stages={Stage.TOKENIZER, Stage.PREPARE, Stage.TRAIN},
                       resume=False, overwrite=False)

The stages make the same checks themselves on the workers; this runs them early where the
launcher sees what the workers see (local workers share its disk and credentials), so a user
mistake is one line and exit status 2 with nothing shipped, started or written. No TensorFlow.
"""

from __future__ import annotations

from collections.abc import Collection

from payload import checkpoints, corpus, storage, tokenizer
from payload.config import RunConfig, check_model_config_file
from payload.stages import Stage


def check_before_start(config: RunConfig, *, stages: Collection[Stage], resume: bool,
                       overwrite: bool, num_workers: int = 1) -> None:
    """Raise the `UserError` the first stage to meet a problem would raise (`num_workers`: the
    workers prepare splits the corpus over)."""
    stages = {Stage(s) for s in stages}
    checkpoints.check_flags(resume=resume, overwrite=overwrite)
    sources = None
    if {Stage.TOKENIZER, Stage.PREPARE} & stages:
        sources = corpus.resolve_sources(config.data)  # missing, unmatched, empty or binary
        corpus.check_apart(config.data, config.output_dir, sources)
        corpus.check_sample(sources, config.data)  # a .jsonl line without the text field
    if Stage.PREPARE in stages:
        from payload.prepare import in_validation

        fraction = config.data.validation_fraction
        corpus.check_shares(sources, config.data, num_workers=num_workers,
                            keep=lambda text: not in_validation(text, fraction))
    # A file, or someone else's non-empty folder (every stage refuses those).
    storage.check_output_dir(config.output_dir)
    if config.model.init_from:
        from payload import pretrained

        pretrained.check_folder(config)  # a model folder of the family, with weights we read
    if config.tokenizer.path or config.model.init_from:
        tokenizer.load_tokenizer(config)  # a reused tokenizer exists and parses
    if Stage.TOKENIZER in stages and config.trains_tokenizer:  # else the launcher skips it
        tokenizer.check_replacement(config, overwrite=overwrite, sources=sources)
    if config.model.config and {Stage.TRAIN, Stage.EXPORT} & stages:
        check_model_config_file(config.model.config, config.model.family,
                                seq_len=config.data.seq_len)
    if Stage.TRAIN in stages:
        checkpoints.check_start(config.output_dir, resume=resume, overwrite=overwrite)

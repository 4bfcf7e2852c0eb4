"""What the stages would refuse, checked from the config before a job starts anywhere.

    check_before_start(config, stages={Stage.TOKENIZER, Stage.PREPARE, Stage.TRAIN},
                       resume=False, overwrite=False)

The stages make the same checks themselves on the workers; this runs them early where the
launcher sees what the workers see (local workers share its disk and credentials), so user
mistakes are one line each, all at once, and exit status 2 with nothing shipped, started or
written. No TensorFlow, no JAX.
"""

from __future__ import annotations

from collections.abc import Collection

from payload.config import RunConfig, check_model_config_file
from payload.core import folders, ownership
from payload.core.errors import UserError, UserErrors
from payload.core.stages import Stage
from payload.data import corpus, tokenizer
from payload.training import checkpoints


def check_stage_inputs(config: RunConfig, stages: Collection[Stage]) -> None:
    """What a stage of `stages` reads that an earlier stage left out of them would have written
    (`--stages export` on an empty output_dir: no checkpoint): one line, for the first such
    input in pipeline order (what the stages after it would say only repeats it)."""
    from payload.data import shards

    stages = {Stage(s) for s in stages}
    out = config.output_dir
    # A reused tokenizer (tokenizer.path, init_from's) is checked with its folder, not here.
    made_by = {"tokenizer": Stage.TOKENIZER if config.trains_tokenizer else None,
               "shards": Stage.PREPARE, "checkpoints": Stage.TRAIN, "model": Stage.EXPORT}
    check = {"tokenizer": lambda: tokenizer.read_tokenizer_files(config),
             "shards": lambda: shards.load_manifest(out),
             # Read by the engine that wrote them, whatever train.engine says now (the export's rule).
             "checkpoints": lambda: checkpoints.check_exportable(
                 out, checkpoints.recorded_engine(out) or config.train.engine),
             "model": lambda: folders.check_exported(out)}
    needs = {Stage.PREPARE: ("tokenizer",), Stage.TRAIN: ("shards", "tokenizer"),
             Stage.EXPORT: ("checkpoints", "tokenizer"),
             Stage.PUBLISH: ("model",) if config.hub.repo else ()}
    for stage in Stage:
        if stage not in stages:
            continue
        for need in needs.get(stage, ()):
            if made_by[need] is not None and made_by[need] not in stages:
                check[need]()


def check_before_start(config: RunConfig, *, stages: Collection[Stage], resume: bool,
                       overwrite: bool, num_workers: int = 1) -> None:
    """Raise what the stages would refuse, every problem at once (`num_workers`: the workers
    prepare splits the corpus over). A check that reads what an earlier one refused (the
    corpus's files, output_dir, the init_from folder) is left out rather than refusing twice."""
    stages = {Stage(s) for s in stages}
    problems: list[UserError] = []

    def passes(check, *args, **kwargs) -> bool:
        try:
            check(*args, **kwargs)
        except UserError as exc:
            problems.append(exc)
            return False
        return True

    flags_ok = passes(checkpoints.check_flags, resume=resume, overwrite=overwrite)
    sources = None
    if {Stage.TOKENIZER, Stage.PREPARE} & stages:
        try:
            sources = corpus.resolve_sources(config.data)  # missing, unmatched, empty or binary
        except UserError as exc:
            problems.append(exc)
    if sources is not None:
        passes(corpus.check_apart, config.data, config.output_dir, sources)
        read_ok = passes(corpus.check_sample, sources, config.data)  # a .jsonl without its field
        if Stage.PREPARE in stages and read_ok:
            from payload.data.prepare import in_validation

            fraction = config.data.validation_fraction
            passes(corpus.check_shares, sources, config.data, num_workers=num_workers,
                   keep=lambda text: not in_validation(text, fraction))
    # A file, or someone else's non-empty folder (every stage refuses those).
    output_dir_ok = passes(ownership.check_output_dir, config.output_dir)
    folder_ok = True
    if config.model.init_from:
        from payload.training import pretrained

        # A model folder of the family, with weights we read.
        folder_ok = passes(pretrained.check_folder, config)
    if (config.tokenizer.path or config.model.init_from) and folder_ok:
        passes(tokenizer.load_tokenizer, config)  # a reused tokenizer exists and parses
    if (Stage.TOKENIZER in stages and config.trains_tokenizer  # else the launcher skips it
            and sources is not None and output_dir_ok):
        passes(tokenizer.check_replacement, config, overwrite=overwrite, sources=sources)
    if config.model.config and {Stage.TRAIN, Stage.EXPORT} & stages:
        passes(check_model_config_file, config.model.config, config.model.family,
               seq_len=config.data.seq_len)
    if Stage.TRAIN in stages and output_dir_ok and flags_ok:
        passes(checkpoints.check_start, config.output_dir, resume=resume, overwrite=overwrite,
               engine=config.train.engine)
    if output_dir_ok and folder_ok:
        passes(check_stage_inputs, config, stages)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise UserErrors([str(problem) for problem in problems])

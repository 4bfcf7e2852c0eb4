"""The run plan the launcher shows before a run: figures, the batch refusal and the warnings.

    refuse_unsplittable_batch(config, fleet, stages)       # in plan_train: a UserError, exit 2
    lines, warnings = describe(launch, read_remote=False)  # what `train --dry-run` prints

The arithmetic is payload.runplan's; this module only gathers its inputs (the fleet's hardware,
the shard manifest when prepare has run) and turns what cannot be known here into words.
"""

from __future__ import annotations

from payload import runplan
from payload.errors import UserError
from payload.stages import Stage


def refuse_unsplittable_batch(config, fleet, stages) -> None:
    """A global batch the training replicas cannot split is refused before anything starts."""
    if Stage.TRAIN in stages:
        replicas, what = runplan.replicas_of(fleet.hardware, len(fleet.workers))
        runplan.check_batch_split(config.train.batch_size, replicas, what)


def dataset_rows(config, *, read_remote: bool) -> int | None:
    """Training rows in the shard manifest, None before prepare has run (or, in a dry run, when
    it lives on gs://: a dry run asks no cloud)."""
    from payload import records, storage

    path = records.manifest_path(config.output_dir)
    if storage.is_gcs(path) and not read_remote:
        return None
    try:
        if not storage.exists(path):
            return None
        return records.load_manifest(config.output_dir).splits["train"].records
    except (UserError, OSError, KeyError):
        return None


def describe(launch, *, read_remote: bool) -> tuple[list[str], list[str]]:
    """(plan lines, warning lines) for the launch's config and fleet."""
    config, fleet = launch.config, launch.fleet
    try:
        plan = runplan.run_plan(config, hardware=fleet.hardware, num_workers=len(fleet.workers))
    except UserError as exc:  # e.g. an init_from folder on gs:// a dry run does not read
        return [f"run plan: not worked out here ({exc})"], []
    if Stage.TRAIN not in launch.options.stages:
        return runplan.render(plan), []
    rows = dataset_rows(config, read_remote=read_remote)
    return runplan.render(plan), runplan.warnings(plan, dataset_rows=rows)

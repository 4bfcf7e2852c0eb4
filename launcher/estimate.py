"""The run plan the launcher shows before a run: figures, the batch refusal and the warnings.

    refuse_unsplittable_batch(config, fleet, stages)       # in plan_train: a UserError, exit 2
    refuse_unholdable_state(config, fleet, stages)         # a model the chips cannot hold
    lines, warnings = describe(launch, read_remote=False)  # what `train --dry-run` prints

The arithmetic is payload.training.runplan's; this module only gathers its inputs (the fleet's hardware,
the shard manifest when prepare has run) and turns what cannot be known here into words.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from payload.core import layout
from payload.core.errors import UserError
from payload.core.stages import Stage
from payload.training import runplan

if TYPE_CHECKING:
    from payload.config import RunConfig



def refuse_unsplittable_batch(config: RunConfig, fleet, stages) -> None:
    """A global batch the training replicas cannot split is refused before anything starts."""
    if Stage.TRAIN in stages:
        replicas, what = runplan.replicas_of(fleet.hardware, len(fleet.workers))
        runplan.check_batch_split(config.train.batch_size, replicas, what)


def refuse_unholdable_state(config: RunConfig, fleet, stages) -> None:
    """A model whose training state the slice's chips cannot hold, however the engine lays it
    out, is refused before anything starts (the config refuses it at load when its shape is
    in the config; this catches a model.config / init_from / tokenizer.path one)."""
    if Stage.TRAIN not in stages:
        return
    try:
        architecture = runplan.run_architecture(config)
    except (UserError, OSError):  # files a dry run does not read: the train stage checks
        return
    runplan.state_sharding(config, fleet.hardware, architecture)


def dataset_rows(config: RunConfig, *, read_remote: bool) -> int | None:
    """Training rows in the shard manifest, None before prepare has run (or, in a dry run, when
    it lives on gs://: a dry run asks no cloud)."""
    from payload.core import storage
    from payload.data import shards as records

    path = records.manifest_path(config.output_dir)
    if storage.is_gcs(path) and not read_remote:
        return None
    try:
        if not storage.exists(path):
            return None
        return records.load_manifest(config.output_dir).splits["train"].records
    except (UserError, OSError, KeyError):
        return None


def measured_cpu_speed(config: RunConfig, *, read_remote: bool) -> runplan.CpuSpeed | None:
    """The model FLOP/s the last CPU run in this output_dir measured (its metrics.json), when it
    trained the same family over as many processes as this one will."""
    from payload.core import storage

    path = layout.metrics_path(config.output_dir)
    if storage.is_gcs(path) and not read_remote:
        return None
    try:
        if not storage.exists(path):
            return None
        metrics = json.loads(storage.read_text(path))
    except (OSError, ValueError, UserError):
        return None
    reports = [metrics.get("final") or {}, *reversed(metrics.get("train") or [])]
    speed = next((r["model_flops_per_s"] for r in reports if r.get("model_flops_per_s")), None)
    if (speed is None or (metrics.get("utilisation") or {}).get("device") != "process"
            or metrics.get("family") != config.model.family):
        return None
    return runplan.CpuSpeed(
        model_flops_per_s=speed,
        source=(f"at the {speed / 1e9:,.1f} GFLOP/s of model FLOPs the last "
                f"{metrics['family']} run in {config.output_dir} measured on "
                f"{metrics.get('replicas', '?')} CPU process(es)"))


def cpu_speed(launch, *, read_remote: bool) -> runplan.CpuSpeed | str:
    """How fast training will go on CPU workers: the last run's measured figure, else (a dry
    run, workers on this machine) a quick matrix-product probe of this machine scaled by how
    much of it training of this family reaches; or why there is no figure."""
    measured = measured_cpu_speed(launch.config, read_remote=read_remote)
    if measured is not None:
        return measured
    if not launch.fleet.shares_launcher_machine:  # the fleet says so; no provider name asked
        return ("the CPU workers are other machines and no earlier run in output_dir measured "
                "their speed")
    if not launch.options.dry_run:
        # The job's workers have just started on these cores: a probe now would measure what
        # they leave over, not what training will get.
        return "no run here has measured it yet; `--dry-run` probes this machine before a run"
    from payload.training.utilisation import matmul_probe_flops

    family = launch.config.model.family
    peak = matmul_probe_flops()
    share = runplan.CPU_MODEL_FLOPS_SHARE[family]
    return runplan.CpuSpeed(
        model_flops_per_s=peak * share,
        source=(f"a matrix-product probe of this machine now, {peak / 1e9:,.0f} GFLOP/s, x the "
                f"{share:.0%} of that {family} training reached on a 2-core machine; a rough "
                "guess until a run here measures its own"))


def describe(launch, *, read_remote: bool) -> tuple[list[str], list[str]]:
    """(plan lines, warning lines) for the launch's config and fleet."""
    from payload.training.strategy import uses_tpu

    config, fleet = launch.config, launch.fleet
    speed = None
    if not uses_tpu(fleet.hardware) and Stage.TRAIN in launch.options.stages:
        speed = cpu_speed(launch, read_remote=read_remote)
    try:
        plan = runplan.run_plan(config, hardware=fleet.hardware, num_workers=len(fleet.workers),
                                cpu_speed=speed)
    except UserError as exc:  # e.g. an init_from folder on gs:// a dry run does not read
        return [f"run plan: not worked out here ({exc})"], []
    if Stage.TRAIN not in launch.options.stages:
        return runplan.render(plan), []
    rows = dataset_rows(config, read_remote=read_remote)
    return runplan.render(plan), runplan.warnings(plan, dataset_rows=rows)

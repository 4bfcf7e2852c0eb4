"""The run plan the launcher shows before a run: figures, the batch refusal and the warnings.

    refuse_unsplittable_batch(config, fleet, stages)       # in plan_train: a UserError, exit 2
    refuse_unholdable_state(config, fleet, stages)         # a model the chips cannot hold
    refuse_unfit_memory(config, fleet, stages)             # local workers this machine cannot hold
    lines, warnings = describe(launch, read_remote=False)  # what `train --dry-run` prints

The arithmetic is payload.training.runplan's; this module only gathers its inputs (the fleet's hardware,
the shard manifest when prepare has run, the corpus's size, this machine's memory, a probe of its
speed, the measured CPU figures of launcher/cpu_times.json) and turns what cannot be known here
into words.
"""

from __future__ import annotations

import dataclasses
import json
import os
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


def machine_memory_bytes() -> int | None:
    """This machine's physical memory, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def refuse_unfit_memory(config: RunConfig, fleet, stages, *,
                        memory_bytes: int | None = None) -> None:
    """Training processes on this machine (local workers) whose model this machine's memory
    cannot hold are refused before anything starts, in one line: what they need, what the
    machine has, and what would fit (fewer workers, Adafactor, a smaller published size)."""
    from payload.training.strategy import uses_tpu

    if Stage.TRAIN not in stages or uses_tpu(fleet.hardware) or not (
            fleet.shares_launcher_machine):
        return
    have = memory_bytes or machine_memory_bytes()
    try:
        architecture = runplan.run_architecture(config)
    except (UserError, OSError):  # files a dry run does not read: the train stage's to check
        return
    processes, _ = runplan.replicas_of(fleet.hardware, len(fleet.workers))
    need = runplan.cpu_memory(config, architecture, processes=processes)
    usable = (have or 0) * runplan.USABLE_SHARE_OF_MEMORY
    if have is None or need.total <= usable:
        return
    what = " ".join(filter(None, (config.model.family, config.model.size)))
    raise UserError(
        f"{what} ({architecture_parameters(architecture)} parameters) needs about "
        f"{need.describe(config.train.optimizer)} local training process"
        f"{'es' if processes > 1 else ''}, but this machine has {have / runplan.GIB:,.1f} GiB "
        f"of memory ({usable / runplan.GIB:,.1f} GiB of it for training)",
        hint=_what_would_fit(config, architecture, processes, usable))


def architecture_parameters(architecture: dict) -> str:
    from payload.core.sizes import count_parameters

    return f"{count_parameters(architecture).total / 1e6:,.1f}M"


def _what_would_fit(config: RunConfig, architecture: dict, processes: int,
                    usable: float) -> str:
    """Ways to make a local run fit this machine's memory, each with what it would need."""
    from payload.core.sizes import SIZES, transformers_config

    ways = []
    fewer = next((n for n in range(processes - 1, 0, -1) if runplan.cpu_memory(
        config, architecture, processes=n).total <= usable), None)
    if fewer:
        need = runplan.cpu_memory(config, architecture, processes=fewer).total
        ways.append(f"--workers {fewer} (about {need / runplan.GIB:,.1f} GiB)")
    if config.train.optimizer == "adamw":
        need = runplan.cpu_memory(config, architecture, processes=processes,
                                  optimizer="adafactor").total
        if need <= usable:
            ways.append(f"train.optimizer: adafactor (about {need / runplan.GIB:,.1f} GiB)")
    model = config.model
    if not (model.init_from or model.config):
        sizes = list(SIZES[model.family])
        smaller = sizes[:sizes.index(model.size)] if model.size else sizes
        for size in reversed(smaller):  # the largest that fits
            variant = model.model_copy(update={"size": size, "hidden_size": None,
                                               "num_layers": None, "num_heads": None,
                                               "intermediate_size": None})
            shaped = transformers_config(variant, vocab_size=architecture["vocab_size"],
                                         seq_len=config.data.seq_len)
            need = runplan.cpu_memory(config, shaped, processes=processes).total
            if need <= usable:
                ways.append(f"model.size: {size} (about {need / runplan.GIB:,.1f} GiB)")
                break
    if not ways:
        return "use a smaller model, or a TPU (cluster.provider: gcp or gce)"
    return "use " + ", or ".join(ways) + "; or a TPU (cluster.provider: gcp or gce)"


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


# The CPU figures the estimate reads, measured on a machine by `python -m bench.calibrate_cpu`
# (which rewrites this file): per tokenizer kind, prepare, per engine and family the train
# stage's start-up and its speed as a share of the matrix-product probe, and export.
CALIBRATION = "cpu_times.json"


def _same_as(family: str) -> str:
    """Families without figures of their own take a family's that computes the same way (the
    family's module names it: payload.core.families)."""
    from payload.core.families import FAMILIES

    spec = FAMILIES.get(family)
    return (spec.timed_as if spec is not None else None) or family


def calibration() -> dict | None:
    """launcher/cpu_times.json, or None when it is missing or unreadable."""
    from importlib import resources

    try:
        return json.loads(resources.files("launcher").joinpath(CALIBRATION).read_text("utf-8"))
    except (OSError, ValueError):
        return None


def _calibrated(table: dict | None, engine: str, family: str) -> dict | None:
    if not table:
        return None
    return (table.get("train", {}).get(engine, {}).get(family)
            or table.get("train", {}).get(engine, {}).get(_same_as(family)))


def measured_cpu_speed(config: RunConfig, *, processes: int,
                       read_remote: bool) -> runplan.CpuSpeed | None:
    """The model FLOP/s the last CPU run in this output_dir measured (its metrics.json), when it
    trained the same family with the same engine over as many processes as this one will."""
    from payload.core import storage
    from payload.core.engines import DEFAULT

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
            or metrics.get("family") != config.model.family
            or metrics.get("engine", DEFAULT) != config.train.engine
            or metrics.get("replicas", processes) != processes):
        return None
    return runplan.CpuSpeed(
        model_flops_per_s=speed,
        source=(f"at the {speed / 1e9:,.1f} GFLOP/s of model FLOPs the last "
                f"{metrics['family']} run in {config.output_dir} measured on "
                f"{metrics.get('replicas', '?')} CPU process(es)"))


def cpu_speed(launch, *, read_remote: bool) -> runplan.CpuSpeed | str:
    """How fast training will go on CPU workers: the last run's measured figure, else (workers
    on this machine) the model FLOP/s training of this engine and family reached when
    calibrated (launcher/cpu_times.json; on a machine with another number of cores, scaled by
    it: a rough guess); or why there is no figure. The train stage's start-up and the other
    stages' times come from the calibration too. A measured average, not a probe of the moment:
    on a shared machine a one-second probe ranged over 5x while training's speed held."""
    config = launch.config
    engine, family = config.train.engine, config.model.family
    table = calibration()
    calibrated = _calibrated(table, engine, family)
    processes, _ = runplan.replicas_of(launch.fleet.hardware, len(launch.fleet.workers))
    speed = measured_cpu_speed(config, processes=processes, read_remote=read_remote)
    if speed is None:
        if not launch.fleet.shares_launcher_machine:  # the fleet says so; no provider asked
            return ("the CPU workers are other machines and no earlier run in output_dir "
                    "measured their speed")
        if calibrated is None:
            return (f"no calibrated figure for {family} on the {engine} engine "
                    f"(launcher/{CALIBRATION})")
        cores, measured_on = os.cpu_count() or 1, table["machine"]["cores"]
        scale = cores / measured_on
        flops = calibrated["model_flops_per_s"] * scale
        speed = runplan.CpuSpeed(
            model_flops_per_s=flops,
            source=(f"at the {flops / 1e9:,.1f} GFLOP/s of model FLOPs {family} training on the "
                    f"{engine} engine reached when calibrated on a {measured_on}-core machine"
                    + ("" if scale == 1 else f", x {cores}/{measured_on} cores here: a rough "
                       "guess")))
    start = calibrated["start_s"] if calibrated else 0.0
    return dataclasses.replace(speed, start_s=start,
                               stages=other_stages(launch, table, read_remote=read_remote))


def other_stages(launch, table: dict | None,
                 *, read_remote: bool) -> tuple[tuple[str, float | None, str], ...]:
    """(stage, seconds or None, how) for the tokenizer, prepare and export stages the run
    will run, from the calibration's rates and the corpus's size; a stage whose output is
    there already (tokenizer, prepare: each keeps what matches) counts nothing, unless
    --overwrite does it again."""
    from payload.core import storage
    from payload.data import shards
    from payload.data.tokenizer import TOKENIZER_FILE, tokenizer_dir

    if not table:
        return ()
    config, stages = launch.config, launch.options.stages
    when = f"measured on a {table['machine']['cores']}-core machine, {table['measured']}"
    size = corpus_megabytes(config, read_remote=read_remote)
    found = []

    def there(path: str) -> bool:
        if launch.options.overwrite:  # every stage that runs is done again
            return False
        if storage.is_gcs(path) and not read_remote:
            return False
        try:
            return storage.exists(path)
        except (OSError, UserError):
            return False

    if Stage.TOKENIZER in stages and config.trains_tokenizer:
        if there(storage.join(tokenizer_dir(config), TOKENIZER_FILE)):
            found.append(("tokenizer", 0.0, "trained already"))
        else:
            rate = table["tokenizer"]["s_per_mb"].get(config.tokenizer.kind)
            sample = size if config.tokenizer.sample_mb is None or size is None else min(
                size, config.tokenizer.sample_mb)
            found.append(("tokenizer", None if sample is None or rate is None else
                          table["tokenizer"]["start_s"] + rate * sample,
                          f"{config.tokenizer.kind} at {rate} s/MB {when}" if sample is not None
                          else "the corpus is not on this machine"))
    if Stage.PREPARE in stages:
        if there(shards.manifest_path(config.output_dir)):
            found.append(("prepare", 0.0, "prepared already"))
        else:
            cores = os.cpu_count() or 1
            share = None if size is None else size / max(1, min(len(launch.fleet.workers),
                                                                 cores))
            prepare = table["prepare"]
            found.append(("prepare", None if share is None else
                          prepare["start_s"] + prepare["s_per_mb_per_worker"] * share,
                          f"{_megabytes(size)} of text, {when}" if size is not None
                          else "the corpus is not on this machine"))
    if Stage.EXPORT in stages:
        export = table["export_s"].get(config.train.engine, {})
        seconds = export.get(config.model.family) or export.get(
            _same_as(config.model.family))
        found.append(("export", seconds, when if seconds is not None else "not calibrated"))
    return tuple(found)


def _megabytes(size: float) -> str:
    return f"{size:,.1f} MB" if size >= 0.1 else f"{size * 1000:,.0f} KB"


def corpus_megabytes(config: RunConfig, *, read_remote: bool) -> float | None:
    """The corpus's text in MB (a gzip file by the size its trailer records), or None when
    some of it is not a local file (a dry run asks no cloud; a Hugging Face dataset)."""
    from payload.core import storage

    entries = config.data.paths
    if any(e.startswith("hf:") or (storage.is_gcs(e) and not read_remote) for e in entries):
        return None
    from payload.data.corpus import resolve_sources

    try:
        sources = resolve_sources(config.data)
    except (UserError, OSError):
        return None
    total = 0
    for source in sources:
        if source.compressed and not storage.is_gcs(source.path):
            total += _gunzipped_size(source.path, source.size)
        else:
            total += source.size
    return total / 1e6


def _gunzipped_size(path: str, size: int) -> int:
    """What a .gz file holds, by its trailer (the size mod 4 GiB; read as at least the file)."""
    try:
        with open(path, "rb") as f:
            f.seek(-4, os.SEEK_END)
            return max(int.from_bytes(f.read(4), "little"), size)
    except OSError:
        return size * 3


def describe(launch, *, read_remote: bool) -> tuple[list[str], list[str]]:
    """(plan lines, warning lines) for the launch's config and fleet. Warnings include every
    setting the run will not use (payload.config.ignored_settings, an export's engine)."""
    from payload.config import ignored_settings
    from payload.training.strategy import uses_tpu

    config, fleet = launch.config, launch.fleet
    ignored = ignored_settings(config) + export_engine_notes(launch, read_remote=read_remote)
    speed = None
    if not uses_tpu(fleet.hardware) and Stage.TRAIN in launch.options.stages:
        speed = cpu_speed(launch, read_remote=read_remote)
    try:
        plan = runplan.run_plan(config, hardware=fleet.hardware, num_workers=len(fleet.workers),
                                cpu_speed=speed, start_step=resumed_at(launch,
                                                                      read_remote=read_remote))
    except UserError as exc:  # e.g. an init_from folder on gs:// a dry run does not read
        return [f"run plan: not worked out here ({exc})"], ignored
    if Stage.TRAIN not in launch.options.stages:
        return runplan.render(plan), ignored
    rows = dataset_rows(config, read_remote=read_remote)
    return runplan.render(plan), ignored + runplan.warnings(plan, dataset_rows=rows)


def resumed_at(launch, *, read_remote: bool) -> int:
    """The step a `--resume` continues from (the newest checkpoint's), 0 for a fresh start or
    where it cannot be read here (a dry run asks no cloud): the estimate counts the steps
    left."""
    from payload.core import storage
    from payload.training.checkpoints import newest_step

    output_dir = launch.config.output_dir
    if not launch.options.resume or (storage.is_gcs(output_dir) and not read_remote):
        return 0
    try:
        return newest_step(output_dir) or 0
    except (OSError, ValueError, UserError):
        return 0


def export_engine_notes(launch, *, read_remote: bool) -> list[str]:
    """An export without training reads the checkpoints with the engine that wrote them: a
    line when the run names another one (train.engine, or --engine)."""
    from payload.core import storage
    from payload.stages.export import engine_note
    from payload.training.checkpoints import recorded_engine

    config, options = launch.config, launch.options
    if Stage.EXPORT not in options.stages or Stage.TRAIN in options.stages:
        return []
    if storage.is_gcs(config.output_dir) and not read_remote:
        return []
    try:
        written_by = recorded_engine(config.output_dir)
    except (OSError, ValueError, UserError):
        return []
    engine = config.train.engine
    named = f"--engine {engine}" if options.engine else f"train.engine {engine}"
    note = engine_note(named, engine, written_by)
    return [note] if note else []

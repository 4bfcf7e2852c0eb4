"""The train stage: shards in, checkpoints, TensorBoard events and metrics.json out.

    python -m payload train --config run.yaml [--worker-index I --num-workers N] [--resume]
    run_train(config, worker_index=0, num_workers=1, resume=False, hardware=CPU)

Parse and check everything first (manifest, shards, tokenizer, sizes: a mistake is one line and
nothing is written), then let the engine (`train.engine`, payload.engines) build its model,
optimizer and steps, then run the one loop every engine shares (`TrainingLoop`: reports,
evaluations, checkpoints, budget stops, metrics.json, TensorBoard) whose step count is the
optimizer's own counter, so a resumed run continues the schedule and ends at `train.steps`
total.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import json
import logging
import math
import time
from dataclasses import dataclass

from payload.cloud.budget import Budget
from payload.core import layout, storage
from payload.core.errors import UserError
from payload.core.families import FAMILIES
from payload.data import shards as records
from payload.engines import engine_for
from payload.training import checkpoints, progress
from payload.training.strategy import CPU, Hardware, cluster_facts, plan_strategy

logger = logging.getLogger(__name__)
# Between reports (train.eval_every, checkpoint_every, at most 100 steps apart) the chief still
# says where training is at least this often, for the launcher's live view.
PROGRESS_EVERY_S = 3.0


def log(message: str, *, own: bool = False) -> None:
    """A line of training's one voice, the chief's; `own=True`: one every worker says itself."""
    logger.info(message, extra={"own": own})


def _own_lines_only(record: logging.LogRecord) -> bool:
    return getattr(record, "own", True)


@dataclass(frozen=True, kw_only=True)
class RunInputs:
    """Everything checked before training starts."""

    manifest: records.Manifest
    train_files: list[str]
    validation_files: list[str]
    vocab: object  # model.TokenIds
    hf_config: object
    identity: dict


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

    identity = {
        "model": model_lib.config_fingerprint(hf_config),
        "tokenizer": fingerprint,
        "family": family,
        "engine": config.train.engine,
    }
    return RunInputs(
        manifest=manifest,
        train_files=files("train"),
        validation_files=files("validation"),
        vocab=vocab,
        hf_config=hf_config,
        identity=identity,
    )


def objective_for(config, vocab):
    from payload.data import objectives

    family = FAMILIES[config.model.family]
    if family.objective == "mlm":
        return objectives.MaskedLM(
            seq_len=config.data.seq_len,
            vocab_size=vocab.vocab_size,
            special_ids=vocab.special,
            mask_id=vocab.mask,
            pad_id=vocab.pad,
            mlm_probability=config.model.mlm_probability,
        )
    if family.objective == "clm":
        return objectives.CausalLM(pad_id=vocab.pad)
    corruption = objectives.SpanCorruption(
        expanded_len=config.record_len,
        seq_len=config.data.seq_len,
        noise_density=config.model.noise_density,
        mean_noise_span_length=config.model.mean_noise_span_length,
        eos_id=vocab.eos,
        pad_id=vocab.pad,
        sentinel_ids=vocab.sentinels,
        decoder_start_id=vocab.pad,
    )
    if corruption.num_spans > len(vocab.sentinels):
        raise UserError(
            f"span corruption makes {corruption.num_spans} spans per row but the tokenizer has "
            f"{len(vocab.sentinels)} sentinel tokens",
            hint="lower data.seq_len or model.noise_density, or raise model.mean_noise_span_length",
        )
    return corruption


def run_train(
    config,
    *,
    worker_index: int = 0,
    num_workers: int = 1,
    resume: bool = False,
    overwrite: bool = False,
    hardware: Hardware = CPU,
) -> None:
    checkpoints.check_flags(resume=resume, overwrite=overwrite)
    engine = engine_for(config.train.engine)
    plan = plan_strategy(cluster_facts(hardware, worker_index=worker_index,
                                       num_workers=num_workers, engine=engine.name))
    # Before anything imports a framework: TPU_LOAD_LIBRARY is read when TensorFlow loads.
    os.environ.update(plan.env)
    # The chief speaks for training; the others say only their own lines. (Set for every run:
    # the logger outlives it, and this process may have been another worker before.)
    if plan.is_chief:
        logger.removeFilter(_own_lines_only)
    elif _own_lines_only not in logger.filters:
        logger.addFilter(_own_lines_only)
    if not plan.runs_training:
        log(f"worker {worker_index}: this host serves the TPU runtime; worker 0 drives training",
            own=True)
        return
    storage.check_output_dir(config.output_dir)
    inputs = check_inputs(config)
    checkpoints.check_start(config.output_dir, resume=resume, overwrite=overwrite,
                            engine=engine.name)
    if resume:
        checkpoints.check_resume(config.output_dir, inputs.identity)
    if plan.is_chief:
        storage.claim_output_dir(config.output_dir)
    trainer = engine.trainer(config, inputs, plan)
    from payload.training.utilisation import meter_for

    meter = meter_for(config, inputs.hf_config, hardware, devices=trainer.devices,
                      drives_tpu=trainer.drives_tpu)
    log(f"model FLOPs per step {meter.flops_per_step:.3g}; peak: {meter.peak_source}")
    TrainingLoop(config, inputs, trainer, plan, meter=meter).run(resume=resume)
    trainer.leave()  # with the trainer (and its input iterator) still alive


def check_batch_size(batch_size: int, replicas: int) -> None:
    if batch_size % replicas:
        raise UserError(
            f"train.batch_size={batch_size} is not divisible by the {replicas} replicas",
            hint=f"use a multiple of {replicas}",
        )


class TrainingLoop:
    """The train stage's loop, the same for every engine: when to train, report, evaluate,
    checkpoint and stop, and what is said and written about it (progress records,
    metrics.json, TensorBoard). The engine's trainer (payload.engines.Trainer) does the work."""

    def __init__(self, config, inputs: RunInputs, trainer, plan, meter=None):
        self.config, self.inputs, self.trainer, self.plan = config, inputs, trainer, plan
        self.meter = meter  # payload.training.utilisation: tokens/s per device and MFU in every report
        self.family = config.model.family
        self.tokens_per_step = config.train.batch_size * config.data.seq_len
        self.budget = Budget.for_run(config)
        self.stopped: str | None = None  # why training ended before train.steps
        out = config.output_dir
        self.metrics_path = layout.metrics_path(out)
        self.writer = None  # opened once training has started (the events file is a write)

    def _open_writer(self):
        import tensorflow as tf  # TensorBoard's writer; the CPU input library on either engine

        out = self.config.output_dir
        return (
            tf.summary.create_file_writer(storage.join(out, layout.LOGS_DIR, layout.TENSORBOARD_DIR))
            if self.plan.is_chief
            else tf.summary.create_noop_writer()
        )

    def run(self, *, resume: bool) -> None:
        config, out, trainer = self.config, self.config.output_dir, self.trainer
        steps = config.train.steps
        if self.plan.is_chief and not resume:
            checkpoints.start_fresh(out, self.inputs.identity)
        try:
            # A checkpoint or model folder that cannot be read ends here, before anything of
            # this attempt is written.
            start = trainer.start(resume=resume)
            self.writer = self._open_writer()
            if trainer.init_source:
                log(f"starting from the weights in {trainer.init_source}")
            history = self._load_history(start) if resume else {"evals": [], "train": []}
            if resume:
                log(f"resuming from {trainer.latest} at step {start} of {steps}")
            if start >= steps:
                log(f"already at step {start} of {steps}; nothing to train")
                self._finish_metrics(history, start)
                return
            if self.plan.is_chief:
                if resume:
                    note = schedule_change(_read_schedule(out), config.train, start)
                    if note:
                        log(note)
                storage.write_text(_schedule_path(out), json.dumps(_schedule(config.train)) + "\n")
            self._loop(start, history)
        finally:
            trainer.close()
            if self.writer is not None:
                self.writer.flush()

    def _loop(self, start: int, history: dict) -> None:
        config, trainer = self.config, self.trainer
        steps, every = config.train.steps, config.train
        log_every = max(1, min(every.eval_every, every.checkpoint_every, 100))
        trainer.open_train(start)
        evaluate = self._evaluator()
        self._emit("start", {"step": start, "steps": steps})
        compiled = trainer.compile_step()  # None: the engine compiles in its first step
        if compiled is not None:
            history.setdefault("compiles", []).append({"step": start, **compiled})
            self._emit("compiled", {"step": start, "steps": steps, **compiled})
        step, window_loss, window_steps = start, 0.0, 0
        # Rates count chunks after the first, whose time is mostly compiling: the window's, and
        # the steady rate of the whole run.
        window_time, window_timed_steps = 0.0, 0
        rate_steps, rate_time = 0, 0.0
        first_step_s = None
        began_training = said_at = time.monotonic()
        if evaluate and start == 0:
            history["evals"].append(evaluate(0))  # the untrained baseline to compare against
        while step < steps:
            stop = min(
                _next_multiple(step, log_every),
                _next_multiple(step, every.eval_every),
                _next_multiple(step, every.checkpoint_every),
                steps,
                # The first chunk is one step, so its time (compiling included) is told at once.
                step + (self.plan.steps_per_execution if step > start else 1),
            )
            began = time.monotonic()
            loss_sum, first_bad = trainer.train_chunk(stop - step)
            if first_bad >= 0:
                kept = (
                    f"the last good checkpoint, {trainer.latest}, is kept: continue from it with "
                    "--resume"
                    if trainer.latest
                    else "no checkpoint was written yet"
                )
                raise UserError(
                    f"training diverged: the loss is not finite at step {step + first_bad + 1}",
                    hint=f"lower train.learning_rate or raise train.warmup_steps; {kept}",
                )
            elapsed = time.monotonic() - began
            if step == start:
                first_step_s = elapsed
            else:
                rate_steps, rate_time = rate_steps + stop - step, rate_time + elapsed
                window_timed_steps, window_time = window_timed_steps + stop - step, (
                    window_time + elapsed)
            window_loss += loss_sum
            window_steps += stop - step
            step = stop
            report = step % log_every == 0 or step == steps
            if report or step == start + 1 or time.monotonic() - said_at >= PROGRESS_EVERY_S:
                record = self._progress(
                    step, window_loss / window_steps,
                    steps_per_s=window_timed_steps / window_time if window_time else None,
                    steady_steps_per_s=rate_steps / rate_time if rate_time else None,
                    elapsed_s=time.monotonic() - began_training,
                    first_step_s=first_step_s if step == start + 1 else None,
                    compile_s=compiled["compile_s"] if compiled and step == start + 1 else None,
                )
                self._emit("train", record)
                said_at = time.monotonic()
                if report:
                    self._summarize(record)
                    history["train"].append(record)
                    window_loss, window_steps, window_time, window_timed_steps = 0.0, 0, 0.0, 0
            if evaluate and (step % every.eval_every == 0 or step == steps):
                result = evaluate(step)
                history["evals"].append(result)
            # The figures before the checkpoint: a run killed between the two resumes from the
            # checkpoint before, and keeps the figures up to it, so none is ever missing.
            if step % every.eval_every == 0 or step == steps:
                self._write_metrics(history, step)
            over = self._over_budget() if step < steps else None
            if step % every.checkpoint_every == 0 or step == steps or over:
                trainer.save(step)
            if over:
                self.stopped = over
                log(f"stopping at step {step} of {steps}: {over}; the checkpoint of step "
                    f"{step} is saved and the export follows")
                break
        self._write_metrics(history, step, final=True, rate=(rate_steps, rate_time))
        # Every worker prints it: in a multi-worker run the lines must agree (replicas in sync).
        log(f"finished at step {step}; weights sha256 {trainer.weights_digest()}", own=True)

    def _over_budget(self) -> str | None:
        """Why the run must stop now (train.max_hours / max_cost), agreed by every worker."""
        if self.budget is None:
            return None
        reason = self.budget.exceeded()
        # Each worker reads its own clock: they stop together when any of them is over.
        if self.trainer.anyone(reason is not None) and reason is None:
            reason = "another worker reached the run's time or cost limit"
        return reason

    def _emit(self, kind: str, fields: dict) -> None:
        """Say a progress record (payload.training.progress): the chief alone speaks for training."""
        if self.plan.is_chief:
            progress.emit(kind, fields)

    def _progress(self, step: int, loss: float, *, steps_per_s: float | None,
                  steady_steps_per_s: float | None, elapsed_s: float,
                  first_step_s: float | None = None, compile_s: float | None = None) -> dict:
        """The training progress record for the steps since the last report: the one place its
        fields are made (the live view, `tpuctl status` and metrics.json's "train" read them)."""
        steps = self.config.train.steps
        record = {
            "step": step,
            "steps": steps,
            "loss": loss,
            "learning_rate": self.trainer.learning_rate(step),
            "tokens_per_s": self.tokens_per_step * steps_per_s if steps_per_s else None,
            "elapsed_s": round(elapsed_s, 3),
            "eta_s": (steps - step) / steady_steps_per_s if steady_steps_per_s else None,
        }
        if self.meter and steps_per_s:  # payload.training.utilisation: tokens/s per device, MFU
            record.update(self.meter.fields(steps_per_s))
        if first_step_s is not None:
            record["first_step_s"] = round(first_step_s, 3)
        if compile_s is not None:
            record["compile_s"] = compile_s
        return record

    def _summarize(self, record: dict) -> None:
        """A report's TensorBoard scalars."""
        import tensorflow as tf

        with self.writer.as_default(step=record["step"]):
            tf.summary.scalar("train/loss", record["loss"])
            tf.summary.scalar("train/learning_rate", record["learning_rate"])
            if record["tokens_per_s"] is not None:
                tf.summary.scalar("train/tokens_per_s", record["tokens_per_s"])
            if self.meter and "mfu" in record:
                for tag, value in self.meter.scalars(record).items():
                    tf.summary.scalar(tag, value)

    def _evaluator(self):
        import tensorflow as tf

        manifest, config = self.inputs.manifest, self.config
        available = manifest.splits["validation"].records // config.train.batch_size
        if not self.inputs.validation_files or available == 0:
            log("no evaluation: the validation split has fewer records than one batch")
            return None
        num_batches = min(config.train.eval_batches, available)
        objective = FAMILIES[self.family].objective

        def evaluate(step: int) -> dict:
            xent, count, correct = self.trainer.evaluate(num_batches)
            loss = xent / max(count, 1.0)
            result = {"step": step, "loss": loss, "accuracy": correct / max(count, 1.0)}
            if objective != "mlm":
                result["perplexity"] = math.exp(min(loss, 50.0))
            self._emit("eval", result)
            with self.writer.as_default(step=step):
                for key, value in result.items():
                    if key != "step":
                        tf.summary.scalar(f"eval/{key}", value)
            return result

        return evaluate

    def _load_history(self, start: int) -> dict:
        if not storage.exists(self.metrics_path):
            return {"evals": [], "train": []}
        old = json.loads(storage.read_text(self.metrics_path))
        # "compiles": each start's compile of the step (engines that compile ahead).
        keys = ("evals", "train", *(("compiles",) if "compiles" in old else ()))
        return {key: [e for e in old.get(key, []) if e["step"] <= start] for key in keys}

    def _finish_metrics(self, history: dict, step: int) -> None:
        """A run cut short after its last checkpoint wrote no final figures: its last
        evaluation and the final figures are written now, as the uninterrupted run would have
        (the training loss of the last steps went with the process)."""
        written = (json.loads(storage.read_text(self.metrics_path))
                   if storage.exists(self.metrics_path) else {})
        if "final" in written:
            return
        evaluate = self._evaluator()
        if evaluate and all(e["step"] != step for e in history["evals"]):
            history["evals"].append(evaluate(step))
        self._write_metrics(history, step, final=True)

    def _write_metrics(self, history: dict, step: int, *, final: bool = False, rate=None) -> None:
        if not self.plan.is_chief:
            return
        config = self.config
        payload = {
            "family": self.family,
            "engine": config.train.engine,
            "step": step,
            "steps": config.train.steps,
            "global_batch_size": config.train.batch_size,
            "seq_len": config.data.seq_len,
            "replicas": self.trainer.replicas,
            "strategy": self.plan.kind.value,
            **({"utilisation": self.meter.header()} if self.meter else {}),
            **history,
        }
        if final:
            steady_steps, steady_time = rate or (0, 0.0)
            payload["final"] = {
                "step": step,
                "train_loss": history["train"][-1]["loss"] if history["train"] else None,
                "eval": history["evals"][-1] if history["evals"] else None,
                "steps_per_s": steady_steps / steady_time if steady_time else None,
                "tokens_per_s": (
                    self.tokens_per_step * steady_steps / steady_time if steady_time else None
                ),
                "stopped": self.stopped,
            }
            if self.meter and steady_time:
                payload["final"].update(self.meter.fields(steady_steps / steady_time))
        storage.write_text(self.metrics_path, json.dumps(payload, indent=1) + "\n")
        if final:
            self._emit("final", {"family": self.family, **payload["final"]})


# The schedule the checkpoints in a folder are trained on (the TF checkpoint holds only the
# optimizer's variables), so a resume can say when its schedule differs.
SCHEDULE = layout.SCHEDULE


def _schedule_path(output_dir: str) -> str:
    return storage.join(checkpoints.checkpoint_dir(output_dir), SCHEDULE)


def _schedule(train_cfg) -> dict:
    return {"steps": train_cfg.steps, "warmup_steps": train_cfg.warmup_steps,
            "learning_rate": train_cfg.learning_rate}


def _read_schedule(output_dir: str) -> dict | None:
    path = _schedule_path(output_dir)
    if storage.exists(path):
        return json.loads(storage.read_text(path))
    metrics = layout.metrics_path(output_dir)  # runs from before schedule.json
    if storage.exists(metrics):
        return {"steps": json.loads(storage.read_text(metrics)).get("steps")}
    return None


def schedule_change(old: dict | None, train_cfg, updates_done: int) -> str | None:
    """One line for a resume whose train.steps differs from the run it continues: the
    learning-rate schedule (linear decay to zero at train.steps) is stretched or squeezed."""
    from payload.training.optimization import learning_rate_at

    if not old or not old.get("steps") or old["steps"] == train_cfg.steps:
        return None
    before = learning_rate_at(old.get("learning_rate", train_cfg.learning_rate),
                              old.get("warmup_steps", train_cfg.warmup_steps), old["steps"],
                              updates_done)
    after = learning_rate_at(train_cfg.learning_rate, train_cfg.warmup_steps, train_cfg.steps,
                             updates_done)
    how = "stretched" if train_cfg.steps > old["steps"] else "squeezed"
    moves = ("stays" if math.isclose(after, before) else
             "goes back up" if after > before else "drops")
    return (
        f"train.steps changed from {old['steps']} to {train_cfg.steps} since the checkpoints "
        f"were written: the learning-rate schedule is {how} to decay linearly to 0 at step "
        f"{train_cfg.steps}, so at step {updates_done} the rate {moves} from {before:.3g} "
        f"(the old schedule) to {after:.3g}"
    )


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every

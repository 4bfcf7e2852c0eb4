"""The training loop every engine shares, and what happens between its chunks of steps: hooks.

    loop = TrainingLoop(trainer, steps=200, steps_per_execution=1)
    loop.add_hook(save, every=50)            # after steps 50, 100, ... and the last
    loop.add_hook(watch_budget)              # after every chunk
    step = loop.run(start)
    train(config, inputs, trainer, plan, meter=meter, resume=False)   # a whole run

The loop trains chunks of steps (the engine's trainer runs a chunk as one compiled call) and
calls the hooks after each, as levanter's `add_hook(fn, every=N)` does; a hook with `every`
makes chunks end on its multiples. `train` is one run on it: start or resume, then reports,
evaluations, metrics.json, the budget stop and checkpoints as hooks, in that order (the figures
of a step before its checkpoint: a run killed between the two resumes from the checkpoint
before and keeps the figures up to it, so none is ever missing), then the final figures. The
step count is the optimizer's own counter, so a resumed run continues the schedule and ends at
`train.steps` total.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from payload.cloud.budget import Budget
from payload.core.errors import UserError
from payload.core.families import FAMILIES
from payload.data.stream import write_segments
from payload.training import checkpoints, schedule
from payload.training.metrics import MetricsSink
from payload.training.trainer import weights_digest
from payload.training.voice import log

# Between reports (train.eval_every, checkpoint_every, at most 100 steps apart) the chief still
# says where training is at least this often, for the launcher's live view.
PROGRESS_EVERY_S = 3.0


@dataclass(frozen=True, kw_only=True)
class Chunk:
    """The steps just trained: from `start` (done before) to `end` (done now)."""

    start: int
    end: int
    loss_sum: float  # of its steps' losses
    seconds: float
    first: bool  # the first chunk of this process: its time is mostly compiling
    last: bool  # it ends at train.steps


@dataclass(frozen=True)
class _Hook:
    fn: Callable[[Chunk], None]
    every: int | None


class TrainingLoop:
    def __init__(self, trainer, *, steps: int, steps_per_execution: int):
        self.trainer, self.steps, self.per_call = trainer, steps, steps_per_execution
        self.hooks: list[_Hook] = []
        self.boundaries: list[int] = []
        self.stopped: str | None = None  # why training ended before `steps`

    def add_hook(self, fn: Callable[[Chunk], None], *, every: int | None = None) -> None:
        """Call `fn(chunk)` after each chunk that ends on a multiple of `every`, and after the
        last; `every=None`: after every chunk. Also after the chunk whose hooks stopped the loop,
        for a hook added after the one that stopped it."""
        self.hooks.append(_Hook(fn, every))
        if every is not None:
            self.end_chunks_at(every)

    def end_chunks_at(self, every: int) -> None:
        """Chunks end on the multiples of `every` (a hook that counts them itself)."""
        self.boundaries.append(every)

    def stop(self, reason: str) -> None:
        """End training after this chunk's remaining hooks (the budget's stop)."""
        self.stopped = reason

    def run(self, start: int) -> int:
        """Train from step `start` to `steps` (or a stop); returns the step reached."""
        step = start
        while step < self.steps and self.stopped is None:
            end = min([_next_multiple(step, every) for every in self.boundaries] + [
                self.steps, step + (self.per_call if step > start else 1)])
            began = time.monotonic()
            loss_sum, first_bad = self.trainer.train_chunk(end - step)
            if first_bad >= 0:
                raise _diverged(step + first_bad + 1, self.trainer.latest)
            chunk = Chunk(start=step, end=end, loss_sum=loss_sum, first=step == start,
                          seconds=time.monotonic() - began, last=end == self.steps)
            step = end
            for hook in self.hooks:
                if (hook.every is None or end % hook.every == 0 or chunk.last
                        or self.stopped is not None):
                    hook.fn(chunk)
        return step


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every


def _diverged(step: int, latest: str | None) -> UserError:
    kept = (f"the last good checkpoint, {latest}, is kept: continue from it with --resume"
            if latest else "no checkpoint was written yet")
    return UserError(f"training diverged: the loss is not finite at step {step}",
                     hint=f"lower train.learning_rate or raise train.warmup_steps; {kept}")


class Reporter:
    """The progress report hook: the mean loss since the last report, the learning rate, the
    throughput (chunks after the first, whose time is mostly compiling) and, with a meter
    (payload.training.utilisation), tokens/s per device and MFU. Reports (every `every` steps
    and the last) are kept; between them the chief still says where training is, after the
    first step and at least every PROGRESS_EVERY_S."""

    def __init__(self, config, sink: MetricsSink, *, every: int, meter=None,
                 compile_s: float | None = None):
        self.train_cfg, self.sink, self.every, self.meter = config.train, sink, every, meter
        self.compile_s = compile_s  # the step's compile ahead of the first step, if it had one
        self.tokens_per_step = config.train.batch_size * config.data.seq_len
        self.window_loss, self.window_steps = 0.0, 0
        self.window_time, self.window_timed_steps = 0.0, 0
        self.rate_steps, self.rate_time = 0, 0.0  # the steady rate of the whole run
        self.first_step_s = None
        self.began = self.said_at = time.monotonic()

    def __call__(self, chunk: Chunk) -> None:
        steps = chunk.end - chunk.start
        if chunk.first:
            self.first_step_s = chunk.seconds
        else:
            self.rate_steps, self.rate_time = self.rate_steps + steps, self.rate_time + chunk.seconds
            self.window_timed_steps += steps
            self.window_time += chunk.seconds
        self.window_loss += chunk.loss_sum
        self.window_steps += steps
        kept = chunk.end % self.every == 0 or chunk.last
        if kept or chunk.first or time.monotonic() - self.said_at >= PROGRESS_EVERY_S:
            self.sink.report(self.record(chunk), kept=kept)
            self.said_at = time.monotonic()
            if kept:
                self.window_loss, self.window_steps = 0.0, 0
                self.window_time, self.window_timed_steps = 0.0, 0

    def record(self, chunk: Chunk) -> dict:
        """The training progress record for the steps since the last report: the one place its
        fields are made (the live view, `tpuctl status` and metrics.json's "train" read them)."""
        step, steps = chunk.end, self.train_cfg.steps
        steps_per_s = self.window_timed_steps / self.window_time if self.window_time else None
        steady = self.steady_steps_per_s
        record = {
            "step": step,
            "steps": steps,
            "loss": self.window_loss / self.window_steps,
            "learning_rate": schedule.applied_rate(self.train_cfg, step),
            "tokens_per_s": self.tokens_per_step * steps_per_s if steps_per_s else None,
            "elapsed_s": round(time.monotonic() - self.began, 3),
            "eta_s": (steps - step) / steady if steady else None,
        }
        if self.meter and steps_per_s:
            record.update(self.meter.fields(steps_per_s))
        if chunk.first:
            record["first_step_s"] = round(self.first_step_s, 3)
            if self.compile_s is not None:
                record["compile_s"] = self.compile_s
        return record

    @property
    def steady_steps_per_s(self) -> float | None:
        return self.rate_steps / self.rate_time if self.rate_time else None

    def final(self, step: int, sink: MetricsSink, stopped: str | None) -> dict:
        return final_figures(step, sink.history, steps_per_s=self.steady_steps_per_s,
                             tokens_per_step=self.tokens_per_step, meter=self.meter,
                             stopped=stopped)


def final_figures(step: int, history: dict, *, steps_per_s: float | None, tokens_per_step: int,
                  meter=None, stopped: str | None = None) -> dict:
    """metrics.json's "final": the last report's loss and evaluation, the steady rate."""
    final = {
        "step": step,
        "train_loss": history["train"][-1]["loss"] if history["train"] else None,
        "eval": history["evals"][-1] if history["evals"] else None,
        "steps_per_s": steps_per_s,
        "tokens_per_s": tokens_per_step * steps_per_s if steps_per_s else None,
        "stopped": stopped,
    }
    if meter and steps_per_s:
        final.update(meter.fields(steps_per_s))
    return final


def evaluator(config, inputs, trainer, sink: MetricsSink) -> Callable[[int], None] | None:
    """The evaluation at a step: the same first train.eval_batches batches of the validation
    split every time, its figures to the sink; None (said once) when the split holds fewer
    records than one batch."""
    available = inputs.manifest.splits["validation"].records // config.train.batch_size
    if not inputs.validation_files or available == 0:
        log("no evaluation: the validation split has fewer records than one batch")
        return None
    num_batches = min(config.train.eval_batches, available)
    objective = FAMILIES[config.model.family].objective

    def evaluate(step: int) -> None:
        sink.mark("eval_start", step=step)
        xent, count, correct = trainer.evaluate(num_batches)
        sink.mark("eval_end", step=step)
        loss = xent / max(count, 1.0)
        result = {"step": step, "loss": loss, "accuracy": correct / max(count, 1.0)}
        if objective != "mlm":
            result["perplexity"] = math.exp(min(loss, 50.0))
        sink.evaluation(result)

    return evaluate


def budget_watch(config, trainer, loop: TrainingLoop) -> Callable[[Chunk], None] | None:
    """The hook that stops training at train.max_hours / max_cost (payload.cloud.budget), agreed
    by every process: each reads its own clock, and they stop together when any is over."""
    budget = Budget.for_run(config)
    if budget is None:
        return None

    def watch(chunk: Chunk) -> None:
        if chunk.last:
            return
        reason = budget.exceeded()
        if trainer.anyone(reason is not None) and reason is None:
            reason = "another worker reached the run's time or cost limit"
        if reason is not None:
            loop.stop(reason)

    return watch


def train(config, inputs, trainer, plan, *, meter=None, resume: bool) -> None:
    """One run of the train stage on this process: start fresh (the chief clears an earlier
    run's checkpoints) or resume, train to train.steps with the hooks, and write the final
    figures; the trainer is closed however it ends."""
    out, train_cfg = config.output_dir, config.train
    if plan.is_chief and not resume:
        checkpoints.start_fresh(out, inputs.identity)
    sink = MetricsSink(config, trainer, plan, meter=meter, stream=inputs.stream)
    sink.mark("devices_ready")
    try:
        # A checkpoint or model folder that cannot be read ends here, before anything of this
        # attempt is written (the ledger's events so far are held until sink.open).
        if resume:
            sink.mark("restore_start")
        start = trainer.start(resume=resume)
        if resume:
            sink.mark("restore_end", step=start)
        if plan.is_chief and inputs.stream is not None:
            write_segments(out, inputs.stream.segments)
        sink.open(resume=resume, start=start)
        if trainer.init_source:
            log(f"starting from the weights in {trainer.init_source}")
        if resume:
            log(f"resuming from {trainer.latest} at step {start} of {train_cfg.steps}")
        if start >= train_cfg.steps:
            log(f"already at step {start} of {train_cfg.steps}; nothing to train")
            _finish_cut_short(config, inputs, trainer, sink, start)
            return
        if plan.is_chief:
            note = schedule.record(out, train_cfg, resumed_at=start if resume else None)
            if note:
                log(note)
        _train(config, inputs, trainer, plan, sink, meter=meter, start=start)
    finally:
        trainer.close()
        sink.close()


def _train(config, inputs, trainer, plan, sink: MetricsSink, *, meter, start: int) -> None:
    every = config.train
    log_every = max(1, min(every.eval_every, every.checkpoint_every, 100))
    trainer.open_train(start)
    evaluate = evaluator(config, inputs, trainer, sink)
    sink.say("start", {"step": start, "steps": every.steps})
    sink.mark("compile_start", step=start)
    compiled = trainer.compile_step()  # None: the engine compiles in its first step
    if compiled is not None:
        sink.mark("compile_end", step=start, cache=compiled.get("cache"))
        sink.compiled(start, every.steps, compiled)
    if evaluate and start == 0:
        evaluate(0)  # the untrained baseline to compare against
    loop = TrainingLoop(trainer, steps=every.steps,
                        steps_per_execution=plan.steps_per_execution)
    reporter = Reporter(config, sink, every=log_every, meter=meter,
                        compile_s=compiled["compile_s"] if compiled else None)
    loop.add_hook(ledger_steps(sink, trainer, every=log_every,
                               compiled_ahead=compiled is not None))
    loop.add_hook(reporter)
    loop.end_chunks_at(log_every)
    if evaluate:
        loop.add_hook(lambda chunk: evaluate(chunk.end), every=every.eval_every)
    loop.add_hook(lambda chunk: sink.write(chunk.end), every=every.eval_every)
    watch = budget_watch(config, trainer, loop)
    if watch:
        loop.add_hook(watch)
    loop.add_hook(lambda chunk: _save(trainer, sink, chunk.end), every=every.checkpoint_every)
    step = loop.run(start)
    if loop.stopped:
        log(f"stopping at step {step} of {every.steps}: {loop.stopped}; the checkpoint of step "
            f"{step} is saved and the export follows")
    sink.mark("train_end", step=step, stopped=loop.stopped)
    sink.write(step, final=reporter.final(step, sink, loop.stopped))
    # Every worker prints it: in a multi-worker run the lines must agree (replicas in sync).
    log(f"finished at step {step}; weights sha256 {weights_digest(trainer.weights())}", own=True)


def _save(trainer, sink: MetricsSink, step: int) -> None:
    sink.mark("checkpoint_save_start", step=step)
    trainer.save(step)
    sink.mark("checkpoint_save_end", step=step)


def ledger_steps(sink: MetricsSink, trainer, *, every: int, compiled_ahead: bool
                 ) -> Callable[[Chunk], None]:
    """The hook that notes steps in the run's ledger: the first (which ends the compile of an
    engine that compiles in its first step) and every reported one, with the seconds the loop
    waited for its batches since the last (`input_wait_s`, where the engine measures it)."""
    waited = [trainer.input_wait_s]

    def note(chunk: Chunk) -> None:
        if chunk.first and not compiled_ahead:
            sink.mark("compile_end", step=chunk.end, first_step_s=round(chunk.seconds, 3))
        if chunk.first or chunk.end % every == 0 or chunk.last:
            fields = {}
            if trainer.input_wait_s is not None:
                fields["input_wait_s"] = round(trainer.input_wait_s - waited[0], 4)
                waited[0] = trainer.input_wait_s
            sink.mark("step", step=chunk.end, first=chunk.first, **fields)

    return note


def _finish_cut_short(config, inputs, trainer, sink: MetricsSink, step: int) -> None:
    """A run cut short after its last checkpoint wrote no final figures: its last evaluation
    and the final figures are written now, as the uninterrupted run would have (the training
    loss of the last steps went with the process)."""
    if "final" in sink.read():
        return
    evaluate = evaluator(config, inputs, trainer, sink)
    if evaluate and all(e["step"] != step for e in sink.history["evals"]):
        evaluate(step)
    sink.write(step, final=final_figures(step, sink.history, steps_per_s=None,
                                         tokens_per_step=0))

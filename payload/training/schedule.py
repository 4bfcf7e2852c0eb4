"""The learning rate a run applies, step by step, and the optimizers' constants: once, for every
engine.

    learning_rate_at(1e-3, warmup_steps=10, total_steps=100, updates_done=4)   # 5e-4
    applied_rate(config.train, step=5)        # what the optimizer applied at step 5 (1-based)
    decays("bert.encoder.layer.0.output.LayerNorm.weight")   # False: no weight decay there
    note = record(output_dir, config.train, resumed_at=120)   # checkpoints/schedule.json

Linear warm-up from 0 to the peak over train.warmup_steps, then linear decay to 0 at
train.steps; AdamW with the constants below, or Adafactor, which also caps its step at
1/sqrt(t) whatever the schedule says (tf_keras: rho_t = min(lr, rsqrt(t)); the JAX engine does
the same), so the rate a run reports is that capped one. The engines compute the rule inside
their compiled steps with their own array operations (`rate_at(..., ops=...)`: tf or jnp);
the loop and the messages compute it here in plain Python.
"""

from __future__ import annotations

import json
import math
from typing import NamedTuple

from payload.core import layout, storage

# Substrings of parameter names that get no weight decay: LayerNorm in BERT/RoBERTa, layer_norm
# in T5 and RoBERTa's head, ln_* in GPT-2, and every bias (the PyTorch names the JAX models use
# keep these substrings, as TensorFlow's variable names do).
NO_DECAY = ("LayerNorm", "layer_norm", "ln_", "bias")
# AdamW.
ADAM_BETA_1 = 0.9
ADAM_BETA_2 = 0.98
ADAM_EPSILON = 1e-6
# Adafactor: tf_keras' defaults, which both engines keep.
ADAFACTOR_DECAY = 0.8  # beta_2_t = 1 - t ** -0.8
ADAFACTOR_EPSILON_1 = 1e-30
ADAFACTOR_EPSILON_2 = 1e-3
ADAFACTOR_CLIP = 1.0


class Ops(NamedTuple):
    """The array operations the rule is written in: plain Python's, tf's or jnp's."""

    where: object
    maximum: object
    minimum: object
    rsqrt: object


PYTHON = Ops(where=lambda cond, a, b: a if cond else b, maximum=max, minimum=min,
             rsqrt=lambda x: 1.0 / math.sqrt(x))


def rate_at(step, peak: float, warmup_steps: int, total_steps: int, *, ops: Ops = PYTHON):
    """The scheduled rate of update `step` (1-based: the optimizer's count of updates done
    plus one), in `ops`' arithmetic."""
    warmup = peak * step / max(warmup_steps, 1)
    decay_steps = float(max(total_steps - warmup_steps, 1))
    decay = peak * ops.maximum(0.0, total_steps - step + 1.0) / decay_steps
    return ops.where(step <= warmup_steps, warmup, ops.minimum(decay, peak))


def applied_at(step, train_cfg, *, ops: Ops = PYTHON):
    """The rate the run's optimizer applies at update `step` (1-based): the schedule's, capped
    at 1/sqrt(step) for Adafactor."""
    rate = rate_at(step, train_cfg.learning_rate, train_cfg.warmup_steps, train_cfg.steps,
                   ops=ops)
    if train_cfg.optimizer != "adafactor":
        return rate
    return ops.minimum(rate, ops.rsqrt(step))


def learning_rate_at(peak: float, warmup_steps: int, total_steps: int, updates_done: int) -> float:
    """The scheduled rate of the update after `updates_done` updates."""
    return rate_at(updates_done + 1, peak, warmup_steps, total_steps)


def applied_rate(train_cfg, step: int) -> float:
    """What the optimizer applied at step `step` (1-based), as progress records and
    metrics.json report it."""
    return float(applied_at(float(step), train_cfg))


def decays(name: str) -> bool:
    """Whether weight decay applies to the parameter called `name`."""
    return not any(part in name for part in NO_DECAY)


# --- the schedule the checkpoints in a folder are trained on (checkpoints/schedule.json: the
# TF checkpoint holds only the optimizer's variables), so a resume can say when it differs.


def _schedule_path(output_dir: str) -> str:
    return storage.join(layout.checkpoints_dir(output_dir), layout.SCHEDULE)


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


def record(output_dir: str, train_cfg, *, resumed_at: int | None) -> str | None:
    """Write the schedule this run trains its checkpoints on (the chief, before the first
    step); for a resume at step `resumed_at`, the line saying how it changed, if it did."""
    note = (schedule_change(_read_schedule(output_dir), train_cfg, resumed_at)
            if resumed_at is not None else None)
    storage.write_text(_schedule_path(output_dir), json.dumps(_schedule(train_cfg)) + "\n")
    return note

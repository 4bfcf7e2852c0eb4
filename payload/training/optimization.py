"""The optimizer and its learning-rate schedule.

    optimizer, schedule = build_optimizer(config.train)

AdamW with linear warm-up and linear decay to zero, no weight decay on LayerNorm weights and
biases; or Adafactor (T5's usual choice) on the same schedule. Gradient clipping by global norm
happens in the training step, after the replicas' gradients are summed, so it clips the true
global norm on any strategy.
"""

from __future__ import annotations

# Substrings of variable names that get no weight decay (LayerNorm in BERT/RoBERTa, layer_norm
# in T5 and RoBERTa's head, ln_* in GPT-2, and every bias).
NO_DECAY = ("LayerNorm", "layer_norm", "ln_", "bias")


def learning_rate_at(peak: float, warmup_steps: int, total_steps: int, updates_done: int) -> float:
    """The rate `warmup_linear_decay` gives the update after `updates_done` (plain Python)."""
    step = updates_done + 1
    if step <= warmup_steps:
        return peak * step / max(warmup_steps, 1)
    decay_steps = max(total_steps - warmup_steps, 1)
    return min(peak * max(0.0, total_steps - step + 1.0) / decay_steps, peak)


def warmup_linear_decay(peak: float, warmup_steps: int, total_steps: int):
    import tf_keras

    class WarmupLinearDecay(tf_keras.optimizers.schedules.LearningRateSchedule):
        """Linear from 0 to `peak` over the warm-up, then linear to 0 at `total_steps`."""

        def __init__(self, peak, warmup_steps, total_steps):
            self.peak = float(peak)
            self.warmup_steps = int(warmup_steps)
            self.total_steps = int(total_steps)

        def __call__(self, step):
            import tensorflow as tf

            # The optimizer's counter counts updates done; the rate applies to update step + 1.
            step = tf.cast(step, tf.float32) + 1.0
            warmup = self.peak * step / max(self.warmup_steps, 1)
            decay_steps = float(max(self.total_steps - self.warmup_steps, 1))
            decay = self.peak * tf.maximum(0.0, self.total_steps - step + 1.0) / decay_steps
            return tf.where(step <= self.warmup_steps, warmup, tf.minimum(decay, self.peak))

        def get_config(self):
            return {
                "peak": self.peak,
                "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps,
            }

    return WarmupLinearDecay(peak, warmup_steps, total_steps)


def build_optimizer(train_cfg, *, jit_compile: bool = False):
    import tf_keras

    schedule = warmup_linear_decay(train_cfg.learning_rate, train_cfg.warmup_steps, train_cfg.steps)
    if train_cfg.optimizer == "adafactor":
        optimizer = tf_keras.optimizers.Adafactor(
            learning_rate=schedule,
            relative_step=False,
            jit_compile=jit_compile,
            weight_decay=train_cfg.weight_decay or None,
        )
    else:
        optimizer = tf_keras.optimizers.AdamW(
            learning_rate=schedule,
            weight_decay=train_cfg.weight_decay,
            beta_1=0.9,
            beta_2=0.98,
            epsilon=1e-6,
            jit_compile=jit_compile,
        )
    if train_cfg.weight_decay:
        optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY))
    return optimizer, schedule

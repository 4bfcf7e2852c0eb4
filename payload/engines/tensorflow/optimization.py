"""The TensorFlow engine's optimizer and its learning-rate schedule, in tf_keras.

    optimizer, schedule = build_optimizer(config.train)

AdamW, or Adafactor (T5's usual choice), on the schedule and with the constants and
no-decay rule of payload.training.schedule, the one place they are written. Gradient clipping
by global norm happens in the training step, after the replicas' gradients are summed, so it
clips the true global norm on any strategy.
"""

from __future__ import annotations

from payload.training import schedule as rule


def warmup_linear_decay(peak: float, warmup_steps: int, total_steps: int):
    """The schedule as a tf_keras LearningRateSchedule of the optimizer's update counter."""
    import tensorflow as tf
    import tf_keras

    ops = rule.Ops(where=tf.where, maximum=tf.maximum, minimum=tf.minimum, rsqrt=tf.math.rsqrt)

    class WarmupLinearDecay(tf_keras.optimizers.schedules.LearningRateSchedule):
        """Linear from 0 to `peak` over the warm-up, then linear to 0 at `total_steps`."""

        def __init__(self, peak, warmup_steps, total_steps):
            self.peak = float(peak)
            self.warmup_steps = int(warmup_steps)
            self.total_steps = int(total_steps)

        def __call__(self, step):
            # The optimizer's counter counts updates done; the rate applies to update step + 1.
            return rule.rate_at(tf.cast(step, tf.float32) + 1.0, self.peak, self.warmup_steps,
                                self.total_steps, ops=ops)

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
            beta_2_decay=-rule.ADAFACTOR_DECAY,
            epsilon_1=rule.ADAFACTOR_EPSILON_1,
            epsilon_2=rule.ADAFACTOR_EPSILON_2,
            clip_threshold=rule.ADAFACTOR_CLIP,
            relative_step=False,
            jit_compile=jit_compile,
            weight_decay=train_cfg.weight_decay or None,
        )
    else:
        optimizer = tf_keras.optimizers.AdamW(
            learning_rate=schedule,
            weight_decay=train_cfg.weight_decay,
            beta_1=rule.ADAM_BETA_1,
            beta_2=rule.ADAM_BETA_2,
            epsilon=rule.ADAM_EPSILON,
            jit_compile=jit_compile,
        )
    if train_cfg.weight_decay:
        optimizer.exclude_from_weight_decay(var_names=list(rule.NO_DECAY))
    return optimizer, schedule

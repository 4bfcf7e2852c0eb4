"""The JAX engine's optimizer: the TF engine's AdamW or Adafactor, schedule and exclusions, in optax.

    tx = build_optimizer(config.train)          # an optax.GradientTransformation
    opt_state = tx.init(params)                 # params: the model's nnx.Param state
    rate = learning_rate(config.train)(count)   # the rate of the update after `count` updates

The rule and every constant are payload.training.schedule's, the same the TF engine's tf_keras
optimizer takes (payload.engines.tensorflow.optimization): the schedule is `rate_at` in jnp,
clipping is by the global norm of the whole gradient, weight decay is decoupled
(`param -= lr * weight_decay * param`, as tf_keras does it) and skips the parameters whose names
hold one of `NO_DECAY`. The PyTorch names the JAX models use keep those substrings
(`LayerNorm`, `layer_norm`, `ln_1`, `bias`, T5's `relative_attention_bias`), so the same rule
picks the same parameters. Adam's epsilon is added as tf_keras adds it (to the uncorrected
root), which optax.adam does not do.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from payload.training import schedule as rule
from payload.training.schedule import (
    ADAFACTOR_CLIP,
    ADAFACTOR_DECAY,
    ADAFACTOR_EPSILON_1,
    ADAFACTOR_EPSILON_2,
    ADAM_BETA_1,
    ADAM_BETA_2,
    ADAM_EPSILON,
    decays,
)

OPS = rule.Ops(where=jnp.where, maximum=jnp.maximum, minimum=jnp.minimum, rsqrt=jax.lax.rsqrt)


def _step(count):
    """The 1-based update that follows `count` updates, as the rule takes it."""
    return jnp.asarray(count, jnp.float32) + 1.0


def schedule(peak: float, warmup_steps: int, total_steps: int) -> optax.Schedule:
    """Linear warm-up from 0 to `peak`, then linear decay to 0 at `total_steps`: the rate for
    the update after `count` updates (payload.training.schedule.rate_at)."""
    return lambda count: rule.rate_at(_step(count), peak, warmup_steps, total_steps, ops=OPS)


def learning_rate(train_cfg) -> optax.Schedule:
    """The rate the optimizer applies after `count` updates: the schedule's, capped at
    1/sqrt(t) for Adafactor as tf_keras caps it (payload.training.schedule.applied_at)."""
    return lambda count: rule.applied_at(_step(count), train_cfg, ops=OPS)


def parameter_name(path) -> str:
    """A parameter's PyTorch name from its path in an nnx.State pytree."""
    parts = []
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
        # GetAttrKey('value'): the array inside an nnx Variable, not part of the name.
    return ".".join(parts)


def decay_mask(params):
    """A pytree like `params`: True where weight decay applies."""
    return jax.tree_util.tree_map_with_path(lambda path, _: decays(parameter_name(path)), params)


class _TFAdamState(NamedTuple):
    count: jax.Array
    mu: optax.Updates
    nu: optax.Updates


def scale_by_tf_adam(b1: float = ADAM_BETA_1, b2: float = ADAM_BETA_2,
                     eps: float = ADAM_EPSILON) -> optax.GradientTransformation:
    """Adam's direction as tf_keras computes it: m * sqrt(1 - b2^t) / (1 - b1^t) / (sqrt(v) + eps).
    (optax.scale_by_adam adds eps to the bias-corrected root instead: a different number while
    v is small.)"""

    def init(params):
        # Two trees, not one twice: built eagerly, one tree would be one buffer per leaf for
        # both moments, and donating the state would then give it twice.
        def zeros():
            return jax.tree.map(lambda p: jnp.zeros_like(p, jnp.float32), params)

        return _TFAdamState(count=jnp.zeros([], jnp.int32), mu=zeros(), nu=zeros())

    def update(grads, state, params=None):
        del params
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, grads)
        count = state.count + 1
        t = count.astype(jnp.float32)
        alpha = jnp.sqrt(1 - b2**t) / (1 - b1**t)
        updates = jax.tree.map(lambda m, v: alpha * m / (jnp.sqrt(v) + eps), mu, nu)
        return updates, _TFAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


class _DecayState(NamedTuple):
    count: jax.Array


def decoupled_weight_decay(rate: float, lr: optax.Schedule, mask) -> optax.GradientTransformation:
    """Adds -lr(count) * rate * param to the (already scaled) updates of the masked parameters:
    tf_keras' `variable -= variable * weight_decay * learning_rate`, which uses the schedule's
    rate, not the step an optimizer like Adafactor ends up taking."""

    def init(params):
        del params
        return _DecayState(count=jnp.zeros([], jnp.int32))

    def update(updates, state, params):
        step_rate = lr(state.count)
        decayed = jax.tree.map(lambda u, p: u - step_rate * rate * p, updates, params)
        return decayed, _DecayState(count=state.count + 1)

    return optax.masked(optax.GradientTransformation(init, update), mask)


class _ScaleState(NamedTuple):
    count: jax.Array


def scale_by_decayed_param_rms(min_scale: float, rate: float,
                               lr: optax.Schedule) -> optax.GradientTransformation:
    """Adafactor's relative step: scale each update by max(rms(param), min_scale), where tf_keras
    measures the parameter after this step's weight decay (it decays every variable before it
    applies any update): 0.5% apart at lr 0.05 and decay 0.1 otherwise."""

    def init(params):
        del params
        return _ScaleState(count=jnp.zeros([], jnp.int32))

    def update(updates, state, params):
        shrink = 1.0 - lr(state.count) * rate
        mask = decay_mask(params)
        scaled = jax.tree.map(
            lambda u, p, decayed: u * jnp.maximum(
                jnp.sqrt(jnp.mean(jnp.square(p * shrink if decayed else p))), min_scale),
            updates, params, mask)
        return scaled, _ScaleState(count=state.count + 1)

    return optax.GradientTransformation(init, update)


def build_optimizer(train_cfg) -> optax.GradientTransformation:
    """The run's optimizer: global-norm clipping, then AdamW or Adafactor on the TF engine's
    schedule, with decoupled weight decay off the `NO_DECAY` parameters."""
    base = schedule(train_cfg.learning_rate, train_cfg.warmup_steps, train_cfg.steps)
    clip = optax.clip_by_global_norm(train_cfg.max_grad_norm)
    if train_cfg.optimizer == "adafactor":
        direction = optax.chain(
            # tf_keras factors every matrix, whatever its size (optax by default only from 128).
            optax.scale_by_factored_rms(factored=True, decay_rate=ADAFACTOR_DECAY,
                                        step_offset=0, min_dim_size_to_factor=1,
                                        epsilon=ADAFACTOR_EPSILON_1),
            optax.clip_by_block_rms(ADAFACTOR_CLIP),
            scale_by_decayed_param_rms(ADAFACTOR_EPSILON_2, train_cfg.weight_decay, base),
        )
    else:
        direction = scale_by_tf_adam()
    parts = [clip, direction, optax.scale_by_learning_rate(learning_rate(train_cfg))]
    if train_cfg.weight_decay:
        parts.append(decoupled_weight_decay(train_cfg.weight_decay, base, decay_mask))
    return optax.chain(*parts)


def update_count(opt_state) -> jax.Array:
    """The number of updates applied: the step a checkpoint records and a resumed run starts
    from (the schedule's own counter)."""
    counts = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(opt_state)
              if path and isinstance(path[-1], jax.tree_util.GetAttrKey)
              and path[-1].name == "count"]
    return counts[0]

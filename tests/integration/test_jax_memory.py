"""Room for 1B models: train.remat rematerialises each layer without changing what the step
computes; the activation estimate orders the policies and is of XLA's own scale; the fit check
picks the least recomputation that fits a chip and refuses what cannot fit before any spend,
naming slices that exist (GPT-2 xl and T5 large on 16 GiB v5e chips)."""

import re

import numpy as np
import pytest

from payload.core.fit.memory import REMAT_ORDER, activation_bytes
from payload.core.fit.workload import Workload

GIB = 1 << 30


# --- the estimate ------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["gpt2", "bert", "t5"])
def test_the_estimate_of_keeping_everything_is_of_xlas_own_scale(family, tmp_path):
    """Against XLA's memory analysis of the compiled step (CPU, float32, no remat: XLA's CPU
    scheduler does not show what remat saves, an accelerator's does)."""
    pytest.importorskip("optax")
    import jax

    from payload.engines.jax import step as jax_step
    from tests.support.configs import training_run_config

    raw = architecture(family)
    program = jax_step.TrainProgram(raw, family=family, train_cfg=training_run_config(
        tmp_path, family, steps=4).train, mesh=one_device_mesh(), remat="none")
    batch, predicted, target = example_batch(family)
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                          program.global_batch(batch))
    compiled = program.train_step.lower(program.abstract_state(), shapes).compile()
    xla = compiled.memory_analysis().temp_size_in_bytes
    work = Workload(architecture=raw, batch_size=ROWS, seq_len=LENGTH, target_len=target,
                    predicted_len=predicted, bf16=False, remat="none", platform="cpu")
    assert 0.7 * xla <= activation_bytes(work, "none", rows=ROWS) <= 1.4 * xla


# --- remat in the step ---------------------------------------------------------------------------

ROWS, LENGTH = 16, 256


def architecture(family):
    from tests.support.jax import architecture as arch

    return arch(family, vocab_size=512, seq_len=LENGTH, hidden_size=64, num_layers=2,
                num_heads=4, intermediate_size=256, dropout=0.1)


def one_device_mesh():
    import jax

    from payload.core.fit.sharding import plan_sharding
    from payload.engines.jax import step as jax_step

    return jax_step.make_mesh(plan_sharding(1, num_devices=1,
                                                     hbm_bytes_per_chip=GIB),
                              devices=jax.devices()[:1])


def example_batch(family):
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 512, (ROWS, LENGTH)).astype(np.int32)
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    if family == "gpt2":
        return batch | {"labels": ids}, LENGTH - 1, None
    if family == "bert":
        k = 39
        return batch | {"masked_positions": rng.integers(0, LENGTH, (ROWS, k)).astype(np.int32),
                        "masked_ids": rng.integers(5, 512, (ROWS, k)).astype(np.int32),
                        "masked_weights": np.ones((ROWS, k), np.float32)}, k, None
    labels = ids[:, :64]
    return batch | {"decoder_input_ids": np.pad(labels[:, :-1], ((0, 0), (1, 0))),
                    "labels": labels}, 64, 64


@pytest.mark.parametrize("family", ["gpt2", "t5"])
def test_remat_recomputes_the_same_step_a_checkpoint_per_layer(family, tmp_path):
    pytest.importorskip("optax")
    import jax

    from payload.engines.jax import step as jax_step
    from tests.support.configs import training_run_config

    raw = architecture(family)
    train_cfg = training_run_config(tmp_path, family, steps=4).train
    batch = example_batch(family)[0]
    key = jax.random.key(1)  # dropout on: the recomputed masks must be the same masks
    layers = 2 * (2 if family == "t5" else 1)  # T5: both stacks
    results, checkpoints = {}, {}
    for policy in REMAT_ORDER:
        program = jax_step.TrainProgram(raw, family=family, train_cfg=train_cfg,
                                        mesh=one_device_mesh(), remat=policy)
        params = program.init_state(seed=0).params
        inputs = (params, program.global_batch(batch), key)
        (value, _), grads = jax.jit(jax.value_and_grad(program._loss, has_aux=True))(*inputs)
        results[policy] = float(value), jax.tree.leaves(grads)
        # jax.checkpoint's primitive: remat2 in jax 0.10's jaxprs, checkpoint in others.
        checkpoints[policy] = len(re.findall(r"\b(?:remat2|checkpoint)\[",
                                             str(jax.make_jaxpr(program._loss)(*inputs))))
    # The loss's chunks are checkpointed whatever the policy; each layer only under one.
    assert checkpoints["dots"] == checkpoints["full"] == checkpoints["none"] + layers
    for policy in ("dots", "full"):
        assert results[policy][0] == pytest.approx(results["none"][0], rel=1e-6)
        for a, b in zip(results[policy][1], results["none"][1], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


# --- the fit check: 1B models on 16 GiB v5e chips ---------------------------------------------


def v5e(chips: int) -> dict:
    return {"num_devices": chips, "hbm_bytes_per_chip": 16 * GIB,
            "where": f"v5litepod-{chips}"}



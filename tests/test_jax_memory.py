"""Room for 1B models: train.remat rematerialises each layer without changing what the step
computes; the activation estimate orders the policies and is of XLA's own scale; the fit check
picks the least recomputation that fits a chip and refuses what cannot fit before any spend,
naming slices that exist (GPT-2 xl and T5 large on 16 GiB v5e chips)."""

import re

import numpy as np
import pytest

from payload.config import ModelConfig
from payload.core.errors import UserError
from payload.core.sizes import parameter_count, transformers_config
from payload.engines import Workload
from payload.engines.jax.memory import REMAT_ORDER, activation_bytes
from payload.engines.jax.sharding import plan_sharding

GIB = 1 << 30


def workload(family, size, *, batch, seq_len, vocab, remat="auto", bf16=True,
             platform="tpu", generation="v5e", **model):
    from types import SimpleNamespace

    cfg = ModelConfig(family=family, size=size, **model)
    arch = transformers_config(cfg, vocab_size=vocab, seq_len=seq_len)
    train = SimpleNamespace(batch_size=batch, bf16=bf16, remat=remat)
    return parameter_count(arch), Workload.of(arch, model=cfg,
                                              data=SimpleNamespace(seq_len=seq_len),
                                              train=train, platform=platform,
                                              generation=generation)


# --- the estimate ------------------------------------------------------------------------------


@pytest.mark.parametrize("family,size,seq_len,vocab", [("gpt2", "xl", 1024, 50257),
                                                        ("bert", "large", 512, 30522),
                                                        ("t5", "large", 512, 32128)])
def test_more_recomputation_keeps_less_and_fused_attention_keeps_less(family, size, seq_len,
                                                                      vocab):
    _, work = workload(family, size, batch=8, seq_len=seq_len, vocab=vocab, dropout=0.0)
    kept = [activation_bytes(work, policy, rows=8) for policy in REMAT_ORDER]
    assert kept[0] > kept[1] > kept[2] > 0
    assert activation_bytes(work, "none", rows=16) > 1.9 * kept[0]  # linear in the rows
    on_cpu = Workload(**{**work.__dict__, "platform": "cpu", "bf16": False})
    assert activation_bytes(on_cpu, "full", rows=8) > kept[2]  # float32 on CPU
    if family != "t5":  # T5 takes the reference attention everywhere
        with_dropout = Workload(**{**work.__dict__, "architecture": {
            **work.architecture, "attention_probs_dropout_prob": 0.1, "attn_pdrop": 0.1}})
        assert activation_bytes(with_dropout, "none", rows=8) > kept[0]  # reference attention


@pytest.mark.parametrize("family", ["gpt2", "bert", "t5"])
def test_the_estimate_of_keeping_everything_is_of_xlas_own_scale(family, tmp_path):
    """Against XLA's memory analysis of the compiled step (CPU, float32, no remat: XLA's CPU
    scheduler does not show what remat saves, an accelerator's does)."""
    pytest.importorskip("optax")
    import jax

    from payload.engines.jax import step as jax_step
    from tests.train_helpers import run_config

    raw = architecture(family)
    program = jax_step.TrainProgram(raw, family=family, train_cfg=run_config(
        tmp_path, family, steps=4).train, mesh=one_device_mesh(), remat="none")
    batch, predicted, target = example_batch(family)
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                          program.global_batch(batch))
    compiled = program.train_step.lower(program.abstract_state(), shapes).compile()
    xla = compiled.memory_analysis().temp_size_in_bytes
    work = Workload(architecture=raw, batch_size=ROWS, seq_len=LENGTH, target_len=target,
                    predicted_len=predicted, bf16=False, remat="none", platform="cpu")
    assert 0.5 * xla <= activation_bytes(work, "none", rows=ROWS) <= 1.5 * xla


# --- remat in the step ---------------------------------------------------------------------------

ROWS, LENGTH = 16, 256


def architecture(family):
    from tests.test_jax_models import architecture as arch

    return arch(family, vocab_size=512, seq_len=LENGTH, hidden_size=64, num_layers=2,
                num_heads=4, intermediate_size=256, dropout=0.1)


def one_device_mesh():
    import jax

    from payload.engines.jax import step as jax_step

    return jax_step.make_mesh(jax_step.plan_sharding(1, num_devices=1,
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
    from tests.train_helpers import run_config

    raw = architecture(family)
    train_cfg = run_config(tmp_path, family, steps=4).train
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


def test_gpt2_xl_does_not_fit_one_v5e_chip_and_the_refusal_names_a_slice_it_fits():
    params, work = workload("gpt2", "xl", batch=64, seq_len=1024, vocab=50257, dropout=0.0)
    with pytest.raises(UserError) as caught:
        plan_sharding(params, **v5e(1), workload=work)
    message = str(caught.value)
    assert "23.2 GiB of training state" in message and "use v5litepod-4 or larger" in message
    plan = plan_sharding(params, **v5e(4), workload=work)
    assert (plan.fsdp, plan.remat) == (4, "full")  # 16 rows per chip only with full remat
    assert plan.total_bytes_per_chip <= 0.9 * 16 * GIB
    assert "train.remat full" in plan.describe()
    # Fewer rows per chip keep more: 8 chips, 8 rows each, need less recomputation or none.
    assert REMAT_ORDER.index(plan_sharding(params, **v5e(8), workload=work).remat) <= 2


def test_t5_large_fits_v5e_chips_in_fsdp_pairs():
    params, work = workload("t5", "large", batch=128, seq_len=512, vocab=32128, dropout=0.0)
    with pytest.raises(UserError, match="use v5litepod-4 or larger"):
        plan_sharding(params, **v5e(1), workload=work)
    plan = plan_sharding(params, **v5e(8), workload=work)
    assert plan.fsdp == 2 and plan.total_bytes_per_chip <= 0.9 * 16 * GIB
    # Adafactor's half-sized state alone fits one chip's share; with the activations beside
    # it, the least recomputation that fits comes first, FSDP taking up the room it needs.
    assert plan_sharding(params, **v5e(8), optimizer="adafactor").fsdp == 1
    lighter = plan_sharding(params, **v5e(8), optimizer="adafactor", workload=work)
    assert REMAT_ORDER.index(lighter.remat) <= REMAT_ORDER.index(plan.remat)
    assert lighter.total_bytes_per_chip <= 0.9 * 16 * GIB


def test_a_step_whose_activations_cannot_fit_is_refused_with_what_would():
    params, work = workload("gpt2", "xl", batch=256, seq_len=1024, vocab=50257, remat="none",
                            dropout=0.0)
    with pytest.raises(UserError) as caught:
        plan_sharding(params, **v5e(4), workload=work)
    message = str(caught.value)
    assert "64 rows per chip (train.batch_size 256 over 4 chips)" in message
    assert "with train.remat none" in message and "16 GiB (14.4 GiB usable)" in message
    assert "train.batch_size 8 or less" in message and "train.remat: full" in message
    from payload.cloud.accelerators import ACCELERATORS

    larger = message.split("; or ")[2].split(" ")[0]
    assert larger in ACCELERATORS and larger.startswith("v5litepod-")  # a slice that exists
    assert "\n" not in message


def test_auto_keeps_every_activation_where_they_fit():
    params, work = workload("gpt2", "small", batch=64, seq_len=1024, vocab=50257)
    plan = plan_sharding(params, num_devices=8, hbm_bytes_per_chip=32 * GIB, where="v6e-8",
                         workload=work)
    assert (plan.fsdp, plan.remat) == (1, "none")

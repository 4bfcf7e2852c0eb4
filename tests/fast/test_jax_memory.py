"""Room for 1B models: train.remat rematerialises each layer without changing what the step
computes; the activation estimate orders the policies and is of XLA's own scale; the fit check
picks the least recomputation that fits a chip and refuses what cannot fit before any spend,
naming slices that exist (GPT-2 xl and T5 large on 16 GiB v5e chips)."""


import pytest

from payload.config import ModelConfig
from payload.core.errors import UserError
from payload.core.fit.memory import REMAT_ORDER, activation_bytes
from payload.core.fit.sharding import plan_sharding
from payload.core.fit.workload import Workload
from payload.core.sizes import parameter_count, transformers_config

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


# --- remat in the step ---------------------------------------------------------------------------

ROWS, LENGTH = 16, 256


def architecture(family):
    from tests.support.jax import architecture as arch

    return arch(family, vocab_size=512, seq_len=LENGTH, hidden_size=64, num_layers=2,
                num_heads=4, intermediate_size=256, dropout=0.1)


# --- the fit check: 1B models on 16 GiB v5e chips ---------------------------------------------


def v5e(chips: int) -> dict:
    from payload.cloud.accelerators import larger_slices

    return {"num_devices": chips, "hbm_bytes_per_chip": 16 * GIB,
            "where": f"v5litepod-{chips}", "larger": larger_slices(f"v5litepod-{chips}")}


def test_gpt2_xl_does_not_fit_one_v5e_chip_and_the_refusal_names_a_slice_it_fits():
    params, work = workload("gpt2", "xl", batch=64, seq_len=1024, vocab=50257, dropout=0.0)
    with pytest.raises(UserError) as caught:
        plan_sharding(params, **v5e(1), workload=work)
    message = str(caught.value)
    assert "20.3 GiB of training state" in message and "use v5litepod-4 or larger" in message
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
    assert "64 rows per device (train.batch_size 256 over 4 devices)" in message
    assert "with train.remat none" in message and "16 GiB (16.0 GiB usable)" in message
    import re

    fitting = re.search(r"train.batch_size (\d+) or less", message)
    assert fitting and 0 < int(fitting.group(1)) < 256 and int(fitting.group(1)) % 4 == 0
    assert "train.remat: full" in message
    from payload.cloud.accelerators import ACCELERATORS

    larger = message.split("; or ")[2].split(" ")[0]
    assert larger in ACCELERATORS and larger.startswith("v5litepod-")  # a slice that exists
    assert "\n" not in message


def test_auto_keeps_every_activation_where_they_fit():
    params, work = workload("gpt2", "small", batch=64, seq_len=1024, vocab=50257)
    plan = plan_sharding(params, num_devices=8, hbm_bytes_per_chip=32 * GIB, where="v6e-8",
                         workload=work)
    assert (plan.fsdp, plan.remat) == (1, "none")


# --- the estimate as refitted against the TPU compiler (docs/jax-speed.md) ---------------------


def test_the_gradient_is_as_wide_as_the_products_that_make_it():
    from payload.core.fit.sharding import state_bytes

    params, on_tpu = workload("gpt2", "small", batch=8, seq_len=128, vocab=32000)
    _, in_float32 = workload("gpt2", "small", batch=8, seq_len=128, vocab=32000, bf16=False)
    _, on_cpu = workload("gpt2", "small", batch=8, seq_len=128, vocab=32000, platform="cpu",
                         generation=None)
    # Float32 weights and AdamW's two moments (12 bytes), and the gradient: bfloat16 where the
    # products are bfloat16, else float32.
    assert state_bytes(params, "adamw", on_tpu) == 14 * params
    assert state_bytes(params, "adamw", in_float32) == state_bytes(params, "adamw", on_cpu)
    assert state_bytes(params, "adamw", on_cpu) == 16 * params == state_bytes(params, "adamw")
    assert state_bytes(params, "adafactor", on_tpu) == 6 * params
    # Replicated, no bfloat16 copy of the weights is counted beside them (the cast fuses into
    # the product); split FSDP, a layer's gathered weights are.
    plan = plan_sharding(params, num_devices=1, hbm_bytes_per_chip=16 * GIB, workload=on_tpu)
    assert plan.activation_bytes_per_chip == activation_bytes(on_tpu, plan.remat, rows=8)


def test_only_a_post_norm_layer_keeps_its_norms_inputs_apart():
    # The same widths, a BERT layer (the norm after the residual sum) against a GPT-2 layer
    # (the norm reads the residual stream, kept already): two float32 widths a token apart.
    shape = {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "intermediate_size": 1024,
             "dropout": 0.0}
    _, bert = workload("bert", None, batch=8, seq_len=128, vocab=1000, **shape)
    _, gpt2 = workload("gpt2", None, batch=8, seq_len=128, vocab=1000, **shape)
    logits = 4 * 1000 * 8  # a chunk's float32 logits per position kept (the gradient in place)

    def body(work, policy):
        predicted = work.predicted_len
        return activation_bytes(work, policy, rows=8) - logits * predicted

    per_token = 8 * 128
    assert body(bert, "none") - body(gpt2, "none") == 5 * 2 * 4 * 256 * per_token
    assert body(bert, "full") - body(gpt2, "full") == 2 * 4 * 256 * per_token


def test_a_named_policy_may_fill_the_chip_auto_keeps_a_margin():
    from payload.core.fit.sharding import NAMED_POLICY_SHARE_OF_HBM, USABLE_SHARE_OF_HBM

    params, auto = workload("gpt2", "small", batch=16, seq_len=1024, vocab=32000, dropout=0.0)
    _, none = workload("gpt2", "small", batch=16, seq_len=1024, vocab=32000, dropout=0.0,
                       remat="none")
    need = plan_sharding(params, num_devices=1, hbm_bytes_per_chip=64 * GIB,
                         workload=none).total_bytes_per_chip
    # A chip the step fills to 95% by the estimate: over auto's 90%, within the whole chip.
    hbm = int(need / 0.95)
    assert USABLE_SHARE_OF_HBM < 0.95 < NAMED_POLICY_SHARE_OF_HBM
    assert plan_sharding(params, num_devices=1, hbm_bytes_per_chip=hbm, workload=auto).remat != "none"
    named = plan_sharding(params, num_devices=1, hbm_bytes_per_chip=hbm, workload=none)
    assert named.remat == "none" and named.named_policy
    assert f"{named.usable_bytes / GIB:.1f} GiB usable" in named.describe()


def test_the_compiler_is_asked_about_what_the_estimate_ruled_out_for_its_margin_alone():
    from dataclasses import replace

    from payload.core.fit.sharding import arrangement, compiler_trials

    params, auto = workload("gpt2", "small", batch=16, seq_len=1024, vocab=32000, dropout=0.0)

    def laid_out_on(hbm):
        return lambda policy: arrangement(params, num_devices=1, hbm_bytes_per_chip=hbm,
                                          workload=replace(auto, remat=policy))

    need = {policy: laid_out_on(64 * GIB)(policy).total_bytes_per_chip
            for policy in REMAT_ORDER}
    # none is estimated at 95% of the chip: ruled out by auto's margin; dots fits.
    hbm = int(need["none"] / 0.95)
    estimated = plan_sharding(params, num_devices=1, hbm_bytes_per_chip=hbm, workload=auto)
    assert estimated.remat == "dots"
    tried = compiler_trials(estimated, laid_out_on(hbm), estimated_fits=True)
    assert [plan.remat for plan in tried] == ["none"]
    # Estimated at 120% of the chip, the compiler is not asked about it.
    hbm = int(need["none"] / 1.2)
    estimated = plan_sharding(params, num_devices=1, hbm_bytes_per_chip=hbm, workload=auto)
    assert estimated.remat != "none"
    tried = compiler_trials(estimated, laid_out_on(hbm), estimated_fits=True)
    assert "none" not in [plan.remat for plan in tried]
    # Where the compiler finds the estimate's choice does not fit, the heavier ones, in order.
    tried = compiler_trials(replace(estimated, remat="none"), laid_out_on(hbm),
                            estimated_fits=False)
    assert [plan.remat for plan in tried] == ["dots", "full"]
    # A policy the estimate refuses still has its arrangement, for the compiler to judge.
    over = arrangement(params, num_devices=1, hbm_bytes_per_chip=3 * GIB,
                       workload=replace(auto, remat="none"))
    assert over.remat == "none" and over.total_bytes_per_chip > 3 * GIB

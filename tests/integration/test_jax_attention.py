"""The JAX engine's attention: one function picks the kernel (and says why) from the platform,
the shapes, the mask and the dropout; every fused path computes what the reference computes,
forward and gradients, with padding and causal masks: Pallas splash through its interpret mode,
cuDNN's exact arguments through `implementation="xla"`, on this CPU."""

import numpy as np
import pytest

pytest.importorskip("flax")

import jax
import jax.numpy as jnp

from payload.core.fit.attention import (
    CUDNN,
    REFERENCE,
    SPLASH,
    MaskKind,
    SplashBlocks,
    choose_attention,
    generation_of,
)
from payload.core.fit.sites import attention_plan
from payload.engines.jax import kernels

# --- the choice ------------------------------------------------------------------------------


def choose(**given):
    settings = dict(platform="tpu", generation="v5e", q_len=512, kv_len=512, head_dim=64,
                    mask=MaskKind.PADDING, dropout=0.0, dtype="bfloat16")
    return choose_attention(**{**settings, **given})


def test_each_platform_takes_its_fused_kernel_and_cpu_the_reference():
    tpu = choose()
    assert (tpu.kernel, tpu.blocks) == (SPLASH, SplashBlocks(512, 512))
    assert "TPU v5e: Pallas splash" in tpu.reason and "segment ids" in tpu.reason
    # v6e tiles twice as large; a length the largest block does not divide takes a smaller one.
    assert choose(generation="v6e", q_len=2048, kv_len=2048).blocks == SplashBlocks(1024, 1024)
    assert choose(generation="v6e", q_len=384, kv_len=384).blocks == SplashBlocks(128, 128)
    gpu = choose(platform="gpu", mask=MaskKind.CAUSAL)
    assert gpu.kernel == CUDNN and "causal mode" in gpu.reason and "sequence lengths" in gpu.reason
    cpu = choose(platform="cpu", dtype="float32")
    assert cpu.kernel == REFERENCE and cpu.reason.startswith("CPU: the reference")


def test_what_a_fused_kernel_cannot_do_takes_the_reference_and_says_why():
    dropout = choose(dropout=0.1)
    assert dropout.kernel == REFERENCE
    assert "attention dropout 0.1" in dropout.reason and "(splash)" in dropout.reason
    assert "model.attention_dropout: 0" in dropout.reason
    t5 = choose(mask=MaskKind.RELATIVE_BIAS)
    assert t5.kernel == REFERENCE and "relative-position bias" in t5.reason
    odd = choose(q_len=200, kv_len=200)
    assert odd.kernel == REFERENCE and "200 is not a multiple of 128" in odd.reason
    f32 = choose(platform="gpu", dtype="float32")
    assert f32.kernel == REFERENCE and "train.bf16: true" in f32.reason
    wide = choose(platform="gpu", head_dim=256)
    assert wide.kernel == REFERENCE and "256 wide" in wide.reason
    # On CPU there is no fused kernel to give up: dropout is not the reason there.
    assert "dropout" not in choose(platform="cpu", dtype="float32", dropout=0.1).reason


def test_device_kinds_name_the_accelerator_tables_generations():
    kinds = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5p": "v5p",
             "TPU v5": "v5p", "TPU v6 lite": "v6e", "TPU v6e": "v6e", "TPU7x": "tpu7x",
             "cpu": None, "NVIDIA H200": None}
    assert {kind: generation_of(kind) for kind in kinds} == kinds


def test_the_plan_names_each_attention_of_a_family():
    gpt2 = {"model_type": "gpt2", "vocab_size": 100, "n_embd": 768, "n_head": 12,
            "attn_pdrop": 0.0}
    [line] = attention_plan(gpt2, platform="tpu", generation="v6e", seq_len=1024, bf16=True)
    assert line.startswith("attention (causal self-attention): splash; TPU v6e: Pallas splash "
                           "attention, blocks of 1024 queries x 1024 keys, a causal block mask")
    t5 = {"model_type": "t5", "vocab_size": 100, "d_kv": 64, "dropout_rate": 0.0}
    lines = attention_plan(t5, platform="tpu", generation="v5e", seq_len=512, target_len=128,
                           bf16=True)
    assert [line.split(":")[0] for line in lines] == [
        "attention (encoder self-attention)", "attention (decoder self-attention)",
        "attention (cross-attention)"]
    assert "reference; T5's learned relative-position bias" in lines[0]
    assert lines[2].startswith("attention (cross-attention): splash")


# --- the kernels against the reference -------------------------------------------------------

B, T, H, D = 2, 256, 2, 32
LENGTHS = (T, 180)  # one full row, one right-padded


def inputs(q_len=T, kv_len=T, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(B, q_len, H, D)), dtype)
    k, v = (jnp.asarray(rng.normal(size=(B, kv_len, H, D)), dtype) for _ in range(2))
    cotangent = jnp.asarray(rng.normal(size=(B, q_len, H, D)), dtype)
    padding = jnp.asarray(np.arange(kv_len)[None] < np.array(LENGTHS)[:, None], jnp.int32)
    return q, k, v, cotangent, padding


def value_and_grads(attention, q, k, v, cotangent):
    out, vjp = jax.vjp(attention, q, k, v)
    return (out, *vjp(cotangent))


def assert_close(got, want, rtol, what):
    for name, a, b in zip(("output", "dq", "dk", "dv"), got, want, strict=True):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        scale = np.abs(b).max()
        assert np.abs(a - b).max() <= rtol * scale, (what, name, np.abs(a - b).max(), scale)


def reference(mask, q_len, scale):
    return lambda q, k, v: kernels.reference_attention(q, k, v, mask.additive(q_len),
                                                       scale=scale)


@pytest.mark.parametrize("causal", [False, True], ids=["padding", "causal"])
@pytest.mark.parametrize("dtype,rtol", [(jnp.float32, 1e-4), (jnp.bfloat16, 2e-2)],
                         ids=["float32", "bfloat16"])
def test_cudnns_arguments_compute_the_reference(causal, dtype, rtol):
    q, k, v, cotangent, padding = inputs(dtype=dtype)
    mask = kernels.Mask(padding=padding, causal=causal)
    fused = value_and_grads(lambda q, k, v: kernels.cudnn_attention(
        q, k, v, mask, scale=D**-0.5, implementation="xla"), q, k, v, cotangent)
    want = value_and_grads(reference(mask, T, D**-0.5), q, k, v, cotangent)
    assert_close(fused, want, rtol, "cudnn arguments")


@pytest.mark.parametrize("causal", [False, True], ids=["padding", "causal"])
@pytest.mark.parametrize("dtype,rtol", [(jnp.float32, 1e-4), (jnp.bfloat16, 2e-2)],
                         ids=["float32", "bfloat16"])
def test_splash_in_interpret_mode_computes_the_reference(causal, dtype, rtol):
    q, k, v, cotangent, padding = inputs(dtype=dtype)
    mask = kernels.Mask(padding=padding, causal=causal)
    fused = value_and_grads(lambda q, k, v: kernels.splash_attention(
        q, k, v, mask, scale=D**-0.5, blocks=SplashBlocks(128, 128), interpret=True),
        q, k, v, cotangent)
    want = value_and_grads(reference(mask, T, D**-0.5), q, k, v, cotangent)
    assert_close(fused, want, rtol, "splash")


def test_cross_attention_shapes_through_both_fused_paths():
    """Fewer queries than keys (T5's decoder over its encoder), padded keys, no scaling."""
    q, k, v, cotangent, padding = inputs(q_len=128, kv_len=256, seed=1)
    mask = kernels.Mask(padding=padding)
    want = value_and_grads(reference(mask, 128, 1.0), q, k, v, cotangent)
    for name, attention in (
        ("cudnn arguments", lambda q, k, v: kernels.cudnn_attention(
            q, k, v, mask, scale=1.0, implementation="xla")),
        ("splash", lambda q, k, v: kernels.splash_attention(
            q, k, v, mask, scale=1.0, blocks=SplashBlocks(128, 128), interpret=True)),
    ):
        assert_close(value_and_grads(attention, q, k, v, cotangent), want, 1e-4, name)


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_grouped_query_attention_on_each_fused_path_computes_the_reference(platform,
                                                                            monkeypatch):
    """Llama's grouped-query attention: 4 query heads over 2 key/value heads through `attend`
    on each fused kernel, against the reference with query head h reading key/value head
    h // 2, gradients into the shared heads included (multi-query: the whole-model test
    below)."""
    kv_heads = 2
    dtype, rtol = (jnp.bfloat16, 2e-2) if platform == "gpu" else (jnp.float32, 1e-4)
    kernel = "splash_attention" if platform == "tpu" else "cudnn_attention"
    calls = []
    original = getattr(kernels, kernel)
    monkeypatch.setattr(kernels, kernel, lambda *a, **k: calls.append(k) or original(*a, **k))
    rng = np.random.default_rng(5)
    q = jnp.asarray(rng.normal(size=(B, T, 4, D)), dtype)
    k, v = (jnp.asarray(rng.normal(size=(B, T, kv_heads, D)), dtype) for _ in range(2))
    cotangent = jnp.asarray(rng.normal(size=(B, T, 4, D)), dtype)
    padding = jnp.asarray(np.arange(T)[None] < np.array(LENGTHS)[:, None], jnp.int32)
    mask = kernels.Mask(padding=padding, causal=True)
    runtime = kernels.Runtime(platform=platform, generation="v5e", interpret=True)
    fused = value_and_grads(lambda q, k, v: kernels.attend(
        q, k, v, mask, scale=D**-0.5, noise=None, dropout=0.0, runtime=runtime),
        q, k, v, cotangent)
    assert len(calls) == 1
    shared = np.arange(4) // (4 // kv_heads)
    want = value_and_grads(lambda q, k, v: kernels.reference_attention(
        q, k[:, :, shared], v[:, :, shared], mask.additive(T), scale=D**-0.5),
        q, k, v, cotangent)
    assert fused[2].shape == k.shape
    assert_close(fused, want, rtol, f"{kernel} with {kv_heads} key/value heads")


def test_splash_under_a_mesh_maps_over_the_batch():
    """The step's mesh splits the batch over (data, fsdp): the kernel runs per device."""
    from jax.sharding import Mesh

    q, k, v, cotangent, padding = inputs()
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "fsdp"))
    mask = kernels.Mask(padding=padding, causal=True)
    fused = value_and_grads(jax.jit(lambda q, k, v: kernels.splash_attention(
        q, k, v, mask, scale=D**-0.5, blocks=SplashBlocks(128, 128), mesh=mesh,
        interpret=True)), q, k, v, cotangent)
    assert_close(fused, value_and_grads(reference(mask, T, D**-0.5), q, k, v, cotangent),
                 1e-4, "splash under shard_map")


# --- whole models: the same logits and gradients whichever kernel runs --------------------------


def tiny(family: str) -> dict:
    from tests.support.jax import architecture

    grouped = {"num_kv_heads": 1} if family == "llama" else {}  # multi-query
    return architecture(family, vocab_size=64, seq_len=128, hidden_size=64, num_layers=2,
                        num_heads=2, intermediate_size=128, dropout=0.0, **grouped)


def model_loss_and_grads(family, runtime, dtype):
    from flax import nnx

    from payload.engines.jax.models import build_model

    model = build_model(tiny(family), seed=0, dtype=dtype, runtime=runtime)
    graphdef, params = nnx.split(model, nnx.Param)
    rng = np.random.default_rng(3)
    ids = rng.integers(5, 64, (2, 128))
    mask = (np.arange(128)[None] < np.array([[128], [97]])).astype(np.int32)
    weights = jnp.asarray(mask[..., None] * rng.normal(size=(2, 128, 64)), jnp.float32)

    def loss(params):
        logits = nnx.merge(graphdef, params)(ids, mask)
        return jnp.sum(logits * weights)  # padded rows' outputs are nobody's business

    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    return float(value), jax.tree.leaves(grads)


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_a_model_on_a_fused_kernel_computes_what_it_computes_on_the_reference(
        family, platform, monkeypatch):
    # cuDNN takes bfloat16 only: the GPU side compares bfloat16 models (the matmuls too).
    dtype = jnp.bfloat16 if platform == "gpu" else jnp.float32
    kernel = "splash_attention" if platform == "tpu" else "cudnn_attention"
    calls = []
    original = getattr(kernels, kernel)
    monkeypatch.setattr(kernels, kernel, lambda *a, **k: calls.append(k) or original(*a, **k))
    fused = kernels.Runtime(platform=platform, generation="v5e", interpret=True)
    value, grads = model_loss_and_grads(family, fused, dtype)
    assert len(calls) == 2  # both layers' attention went through the fused kernel
    want_value, want_grads = model_loss_and_grads(family, kernels.Runtime(), dtype)
    rtol = 3e-2 if dtype == jnp.bfloat16 else 1e-4
    assert value == pytest.approx(want_value, rel=rtol, abs=rtol)
    # Against the largest gradient: some are zero up to rounding (a key's bias moves no softmax).
    scale = max(float(jnp.abs(want).max()) for want in want_grads)
    for got, want in zip(grads, want_grads, strict=True):
        assert float(jnp.abs(got - want).max()) <= rtol * scale

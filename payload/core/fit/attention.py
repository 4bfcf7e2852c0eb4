"""Which attention kernel the JAX engine runs, and why: one function, pure, no JAX imported.

    choice = choose_attention(platform="tpu", generation="v6e", q_len=512, kv_len=512,
                              head_dim=64, mask=MaskKind.PADDING, dropout=0.0, dtype="bfloat16")
    choice.kernel        # "splash"
    choice.reason        # "TPU v6e: Pallas splash attention, blocks of 512 queries x 512 keys ..."
    Site("causal self-attention", 1024, 1024, 12, 64, MaskKind.CAUSAL, 0.0)  # a family's call

The kernels themselves are payload.engines.jax.kernels; the models ask this function at every
attention call (shapes are static under jit), and the run plan asks it for the same shapes (each
family's module lists its model's calls as Sites; payload.core.fit.sites.attention_plan), so
what `tpuctl train --dry-run` prints is what the step runs.
- GPU: cuDNN's fused attention (`jax.nn.dot_product_attention(implementation="cudnn")`), padding
  given as sequence lengths and GPT-2's mask as its causal mode: never a [B, 1, 1, S] additive
  bias, which cuDNN refuses ("Bias must have same seq length as QKV").
- TPU: Pallas splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`, MaxText's
  kernel), padding as segment ids, causal as its block-sparse causal mask; block sizes per
  generation.
- CPU: the reference: two einsums and a float32 softmax (what every fused path is tested against).
- Attention dropout: the fused kernels have none. A run whose attention dropout is above zero
  (transformers' attention_probs_dropout_prob / attn_pdrop, model.attention_dropout) takes the
  reference attention on every platform, so one config trains one model everywhere, and the plan
  says what the fused kernel would give. Pretraining without it is common (T5 v1.1, MaxText).
- T5: its self-attentions add a learned relative-position bias ([1, H, T, T], trained): cuDNN's
  bias gradient is unproven here, and Pallas' flash kernel takes a bias only as a whole
  [B, H, T, T] array in memory, the very thing fusion avoids; so they take the reference, which
  XLA fuses. Its cross-attention has only padding and takes the fused kernel where shapes allow.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

REFERENCE, CUDNN, SPLASH = "reference", "cudnn", "splash"
KERNELS = (REFERENCE, CUDNN, SPLASH)

# cuDNN's fused attention (through jax.nn.dot_product_attention): half-precision inputs and
# heads up to 128 wide in multiples of 8 (the flash kernels' limits in cuDNN 9).
CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_MAX_HEAD_DIM = 128
# Splash tiles queries and keys in blocks of at least one vector register's 128 lanes. The
# largest block per generation: MaxText's default of 512 (its sa_block_* settings); v6e and
# TPU7x have twice the matrix unit and VMEM, so 1024. Starting points a first real run confirms
# (docs/jax-speed.md); a sequence the largest block does not divide takes the largest power of
# two from 128 that does.
SPLASH_MIN_BLOCK = 128
SPLASH_MAX_BLOCK = {"v4": 512, "v5e": 512, "v5p": 512, "v6e": 1024, "tpu7x": 1024}
DEFAULT_SPLASH_MAX_BLOCK = 512


class MaskKind(enum.Enum):
    """What an attention call masks: padded keys (BERT, RoBERTa, T5's cross-attention), padded
    keys and the future (GPT-2), or a learned bias on top (T5's self-attentions)."""

    PADDING = "padding"
    CAUSAL = "causal"
    RELATIVE_BIAS = "relative position bias"


@dataclass(frozen=True)
class SplashBlocks:
    """Splash attention's tiles: the same in the forward and both backward kernels."""

    q: int
    kv: int


@dataclass(frozen=True)
class Choice:
    kernel: str  # one of KERNELS
    reason: str  # one line: why this kernel, in the user's words
    blocks: SplashBlocks | None = None  # splash only


def generation_of(device_kind: str) -> str | None:
    """The TPU generation (the accelerator table's name) of a JAX device_kind such as
    "TPU v5 lite", "TPU v6e" or "TPU v4"; None for anything else."""
    kind = device_kind.lower().replace("tpu", "").strip()
    if kind.startswith("7"):
        return "tpu7x"
    for prefix, generation in (("v6", "v6e"), ("v5 lite", "v5e"), ("v5e", "v5e"),
                               ("v5p", "v5p"), ("v5", "v5p"), ("v4", "v4")):
        if kind.startswith(prefix):
            return generation
    return None


def _splash_block(length: int, largest: int) -> int | None:
    block = largest
    while block >= SPLASH_MIN_BLOCK:
        if length % block == 0:
            return block
        block //= 2
    return None


def _fused(*, platform: str, generation: str | None, q_len: int, kv_len: int, head_dim: int,
           mask: MaskKind, dtype: str) -> Choice:
    """The platform's fused kernel for these shapes, or the reference and why not."""
    if platform == "gpu":
        if dtype not in CUDNN_DTYPES:
            return Choice(REFERENCE, f"GPU, {dtype} inputs: cuDNN's fused attention takes "
                                     "bfloat16 or float16; set train.bf16: true for it")
        if head_dim > CUDNN_MAX_HEAD_DIM or head_dim % 8:
            return Choice(REFERENCE, f"GPU, heads {head_dim} wide: cuDNN's fused attention "
                                     f"takes heads up to {CUDNN_MAX_HEAD_DIM} wide in multiples "
                                     "of 8")
        how = "its causal mode with padding as sequence lengths" if mask is MaskKind.CAUSAL \
            else "padding as sequence lengths"
        return Choice(CUDNN, f"GPU: cuDNN fused attention (jax.nn.dot_product_attention, "
                             f"implementation cudnn), {how}")
    if platform == "tpu":
        largest = SPLASH_MAX_BLOCK.get(generation or "", DEFAULT_SPLASH_MAX_BLOCK)
        q_block, kv_block = _splash_block(q_len, largest), _splash_block(kv_len, largest)
        if q_block is None or kv_block is None:
            odd = q_len if q_block is None else kv_len
            return Choice(REFERENCE, f"TPU: a sequence of {odd} is not a multiple of "
                                     f"{SPLASH_MIN_BLOCK}, the smallest block Pallas splash "
                                     "attention tiles by")
        what = "a causal block mask, padding as segment ids" if mask is MaskKind.CAUSAL \
            else "padding as segment ids"
        name = f"TPU {generation}" if generation else "TPU"
        return Choice(SPLASH, f"{name}: Pallas splash attention, blocks of {q_block} queries x "
                              f"{kv_block} keys, {what}", SplashBlocks(q_block, kv_block))
    return Choice(REFERENCE, f"{platform.upper()}: the reference attention (einsums, float32 "
                             "softmax); the fused kernels are for GPU (cuDNN) and TPU (Pallas)")


def choose_attention(*, platform: str, q_len: int, kv_len: int, head_dim: int, mask: MaskKind,
                     dropout: float, dtype: str, generation: str | None = None) -> Choice:
    """The attention kernel for one call: `platform` is JAX's backend ("cpu", "gpu", "tpu"),
    `generation` the TPU's (v4, v5e, ...), `dropout` the attention dropout this call applies
    (0 at evaluation), `dtype` the name of the inputs' dtype."""
    if mask is MaskKind.RELATIVE_BIAS:
        return Choice(REFERENCE, "T5's learned relative-position bias: the reference attention "
                                 "(a fused kernel would need the bias and its gradient as whole "
                                 "[B, H, T, T] arrays in memory, the very thing it avoids)")
    fused = _fused(platform=platform, generation=generation, q_len=q_len, kv_len=kv_len,
                   head_dim=head_dim, mask=mask, dtype=dtype)
    if dropout > 0 and fused.kernel != REFERENCE:
        return Choice(REFERENCE, f"attention dropout {dropout:g}: the reference attention, as "
                                 f"the fused kernel ({fused.kernel}) has no dropout; "
                                 "model.attention_dropout: 0 lets this run use it")
    return fused


# --- the run plan --------------------------------------------------------------------------


@dataclass(frozen=True)
class Site:
    """One kind of attention call in a model, with the shapes a training step gives it."""

    name: str
    q_len: int
    kv_len: int
    heads: int
    head_dim: int
    mask: MaskKind
    dropout: float

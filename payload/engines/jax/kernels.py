"""The attention kernels and what a model needs to know to run them: the reference (einsums and
a float32 softmax), cuDNN's fused attention on GPU, Pallas splash attention on TPU.

    runtime = Runtime.here(mesh=mesh)                  # the platform, TPU generation and mesh
    mask = Mask(padding=attention_mask, causal=True)   # or bias=T5's relative-position bias
    out = attend(q, k, v, mask, scale=d ** -0.5, noise=noise, dropout=0.1, runtime=runtime)

`attend` asks payload.core.fit.attention.choose_attention which kernel fits the call and runs
it; q is [B, T, H, D] and so is the result, k and v [B, S, K, D] with K dividing H: grouped-query
attention (Llama; K = 1 is multi-query), query head h reading key/value head h // (H / K), as
transformers' repeat_kv lays them out. cuDNN takes the K heads as they are; the reference and
splash take them repeated to H before the kernel (splash's multi-head kernel has no groups: the
repeat costs the memory of full-width keys and values for that call, not their FLOPs). Every fused path computes what the reference
computes at every position (padded query rows included), up to the rounding of its dtype: the
parity tests run splash through Pallas' interpret mode and cuDNN's exact arguments through
`implementation="xla"` on CPU (`Runtime(interpret=True)` does the same for a whole model).
Rows are right-padded (payload.data.objectives: the mask is `ids != pad`, padding only at the
end), so a row's padding is its length.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from payload.core.fit.attention import (
    CUDNN,
    SPLASH,
    MaskKind,
    SplashBlocks,
    choose_attention,
    generation_of,
)
from payload.core.fit.memory import REMAT_ORDER

# The most negative float32, as transformers masks with: finite, so a fully masked row stays
# defined.
NEG_INF = float(np.finfo(np.float32).min)
# The mesh axes a batch is split over (payload.engines.jax.step.BATCH_AXES).
BATCH_AXES = ("data", "fsdp")


@dataclass(frozen=True)
class Runtime:
    """Where and how a model runs, beside what it is: the platform and TPU generation the
    attention kernel is chosen for, the mesh a TPU kernel maps over the batch with, the
    rematerialisation policy of its layers (train.remat, resolved: none | dots | full), and
    `interpret`: the fused kernels through their CPU stand-ins (tests, the bench's CPU mode)."""

    platform: str = "cpu"
    generation: str | None = None
    mesh: Mesh | None = None
    remat: str = "none"
    interpret: bool = False

    @classmethod
    def here(cls, *, mesh: Mesh | None = None, remat: str = "none") -> Runtime:
        device = jax.devices()[0]
        return cls(platform=jax.default_backend(), generation=generation_of(device.device_kind),
                   mesh=mesh, remat=remat)


# What a model runs on unless told otherwise: the reference attention, no remat.
CPU_REFERENCE = Runtime()


@partial(jax.tree_util.register_dataclass, data_fields=["padding", "bias"],
         meta_fields=["causal"])
@dataclass(frozen=True)
class Mask:
    """What one attention call masks: `padding` [B, S] (1 = token, 0 = padding), `causal`
    (a query sees itself and the keys before it), `bias` a learned float32 [1|B, H, T, S]."""

    padding: jax.Array | None = None
    causal: bool = False
    bias: jax.Array | None = None

    @property
    def kind(self) -> MaskKind:
        if self.bias is not None:
            return MaskKind.RELATIVE_BIAS
        return MaskKind.CAUSAL if self.causal else MaskKind.PADDING

    def additive(self, q_len: int) -> jax.Array | None:
        """The reference's additive bias: [B|1, 1|H, T, S], 0 where allowed, NEG_INF not."""
        return add_biases(self.bias, padding_bias(self.padding),
                          causal_bias(q_len) if self.causal else None)

    def lengths(self) -> jax.Array | None:
        """[B] int32 tokens per row (right-padded rows), None without padding."""
        if self.padding is None:
            return None
        return jnp.sum(self.padding > 0, axis=1, dtype=jnp.int32)


def padding_bias(mask: jax.Array | None) -> jax.Array | None:
    """[B, T_key] 1 = token, 0 = padding -> an additive bias [B, 1, 1, T_key]."""
    if mask is None:
        return None
    return jnp.where(mask[:, None, None, :] > 0, 0.0, NEG_INF).astype(jnp.float32)


def causal_bias(length: int) -> jax.Array:
    """[1, 1, T, T]: a position sees itself and what comes before it."""
    allowed = jnp.tril(jnp.ones((length, length), bool))
    return jnp.where(allowed, 0.0, NEG_INF)[None, None].astype(jnp.float32)


def add_biases(*biases: jax.Array | None) -> jax.Array | None:
    present = [b for b in biases if b is not None]
    if not present:
        return None
    total = present[0]
    for b in present[1:]:
        total = total + b
    # Two masks can both say "hidden": keep the sum finite so softmax stays defined.
    return jnp.maximum(total, NEG_INF)


# --- the kernels ---------------------------------------------------------------------------


def reference_attention(q, k, v, bias, *, scale: float, noise=None, dropout: float = 0.0):
    """Multi-head attention over [B, T, H, D] -> [B, T_q, H, D]: scores and softmax in float32,
    `noise(weights, dropout)` on the attention weights (payload.engines.jax.models.layers.Noise)."""
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
    if bias is not None:
        scores = scores + bias
    weights = jax.nn.softmax(scores, axis=-1)
    if noise is not None:
        weights = noise(weights, dropout)
    return jnp.einsum("bhqk,bkhd->bqhd", weights.astype(v.dtype), v)


def cudnn_attention(q, k, v, mask: Mask, *, scale: float, implementation: str = "cudnn"):
    """cuDNN's fused attention with padding as key lengths (every query row computed, as the
    reference does) and its causal mode; `implementation="xla"` runs the same arguments
    through XLA's reference implementation."""
    return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=mask.causal,
                                        key_value_seq_lengths=mask.lengths(),
                                        implementation=implementation)


@functools.lru_cache(maxsize=64)
def _splash_kernel(q_len: int, kv_len: int, heads: int, causal: bool, blocks: SplashBlocks,
                   interpret: bool):
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as splash,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as masks,
    )

    shape = (q_len, kv_len)
    head = masks.CausalMask(shape) if causal else masks.FullMask(shape)
    q, kv = blocks.q, blocks.kv
    sizes = splash.BlockSizes(block_q=q, block_kv=kv, block_kv_compute=kv, block_q_dkv=q,
                              block_kv_dkv=kv, block_kv_dkv_compute=kv, block_q_dq=q,
                              block_kv_dq=kv)
    # Made once per shape and kept (lru_cache) while a step is being traced: its mask arrays
    # must be values, not the trace's, or the next step traced with the same shape (the eval
    # step after the train step, another model) would find the first trace's tracers in it.
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha(masks.MultiHeadMask([head] * heads), block_sizes=sizes,
                                      head_shards=1, q_seq_shards=1, interpret=interpret)


def splash_attention(q, k, v, mask: Mask, *, scale: float, blocks: SplashBlocks,
                     mesh: Mesh | None = None, interpret: bool = False):
    """Pallas splash attention: queries all in segment 1, keys in 1 (token) or 0 (padding), so
    every query row sees the row's tokens as the reference's does; the causal mask is the
    kernel's own (it skips the blocks above the diagonal). Under a mesh the kernel runs per
    device over its rows of the batch (shard_map: a Pallas call is not split by XLA itself)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as splash,
    )

    batch, q_len, heads, _ = q.shape
    kv_len = k.shape[1]
    kernel = _splash_kernel(q_len, kv_len, heads, mask.causal, blocks, interpret)
    q_ids = jnp.ones((batch, q_len), jnp.int32)
    kv_ids = (jnp.ones((batch, kv_len), jnp.int32) if mask.padding is None
              else (mask.padding > 0).astype(jnp.int32))
    # The kernel takes [H, T, D] per row and does not scale the scores.
    q = (q * jnp.asarray(scale, q.dtype)) if scale != 1.0 else q

    def rows(q, k, v, q_ids, kv_ids):
        heads_first = [jnp.swapaxes(x, 1, 2) for x in (q, k, v)]
        out = jax.vmap(kernel)(*heads_first, segment_ids=splash.SegmentIds(q=q_ids, kv=kv_ids))
        return jnp.swapaxes(out, 1, 2)

    if mesh is not None:
        axes = tuple(a for a in BATCH_AXES if a in mesh.axis_names)
        rows = jax.shard_map(rows, mesh=mesh, in_specs=(P(axes),) * 5, out_specs=P(axes),
                             check_vma=False)
    return rows(q, k, v, q_ids, kv_ids)


def repeat_kv(x: jax.Array, heads: int) -> jax.Array:
    """[B, S, K, D] keys or values -> [B, S, heads, D], each of the K heads repeated for the
    heads / K query heads that share it (in order: transformers' repeat_kv)."""
    groups = heads // x.shape[2]
    return x if groups == 1 else jnp.repeat(x, groups, axis=2)


def attend(q, k, v, mask: Mask, *, scale: float, noise, dropout: float, runtime: Runtime):
    """Attention over q [B, T, H, D] and k, v [B, S, K, D] (K divides H: grouped-query) by the
    kernel choose_attention picks for this call. `noise` is the pass's dropout
    (payload.engines.jax.models.layers.Noise): off at evaluation, where the fused kernel may
    then run although training takes the reference."""
    heads = q.shape[2]
    if heads % k.shape[2]:
        raise ValueError(f"{k.shape[2]} key/value heads do not divide {heads} query heads")
    rate = dropout if noise is not None and noise.active else 0.0
    choice = choose_attention(platform=runtime.platform, generation=runtime.generation,
                              q_len=q.shape[1], kv_len=k.shape[1], head_dim=q.shape[-1],
                              mask=mask.kind, dropout=rate, dtype=jnp.dtype(q.dtype).name)
    if choice.kernel == CUDNN:
        return cudnn_attention(q, k, v, mask, scale=scale,
                               implementation="xla" if runtime.interpret else "cudnn")
    k, v = repeat_kv(k, heads), repeat_kv(v, heads)
    if choice.kernel == SPLASH:
        return splash_attention(q, k, v, mask, scale=scale, blocks=choice.blocks,
                                mesh=runtime.mesh, interpret=runtime.interpret)
    return reference_attention(q, k, v, mask.additive(q.shape[1]), scale=scale, noise=noise,
                               dropout=rate)


# --- rematerialisation -----------------------------------------------------------------------


def remat_policy(name: str):
    """train.remat's policies: dots keeps the outputs of products with weights (no batch
    dimension: not attention's) and recomputes the rest; full keeps nothing but each layer's
    input and recomputes the layer in the backward pass."""
    if name == "dots":
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    if name == "full":
        return jax.checkpoint_policies.nothing_saveable
    raise ValueError(f"no remat policy {name!r}; one of {', '.join(REMAT_ORDER)}")


def run_layer(layer, x, *args, remat: str):
    """`layer(x, *args)`, its activations rematerialised as `remat` says: a checkpoint around
    each layer, so the backward pass recomputes one layer at a time."""
    if remat == "none":
        return layer(x, *args)
    return jax.checkpoint(lambda h: layer(h, *args), policy=remat_policy(remat))(x)

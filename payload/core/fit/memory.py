"""What a JAX training step holds per chip besides its state: the activations the backward pass
needs, by rematerialisation policy (train.remat). Pure arithmetic, no JAX imported, so the run
plan and the config check refuse a step that cannot fit before any TPU hour.

    activation_bytes(workload, "none", rows=8)     # bytes per chip for 8 rows of the batch
    REMAT_ORDER                                    # ("none", "dots", "full"): least recompute first

An estimate of what XLA allocates, per token of each layer, in the model's compute dtype
(2 bytes in bf16, 4 in float32):
- none keeps every activation the backward pass reads: the layer's input, its normalised
  inputs (float32), the query, key and value, the attention output, each product's output, the
  feed-forward's inner activations and the dropout masks; the reference attention also keeps
  its softmax weights in the compute dtype (heads x keys per token) and their dropout mask,
  which the fused kernels do not (they keep one float32 log-sum-exp per head);
- dots keeps only the outputs of products with weights and the layer's input, and recomputes
  the rest (the attention among it) in the backward pass;
- full keeps each layer's input alone and recomputes the whole layer: about a third more
  compute (one more forward pass).
Whatever the policy, one layer's worth of full activations is live while its backward runs,
and the loss holds one chunk of float32 logits, their gradient in their place
(payload.engines.jax.loss).
The tests hold the order of the policies and the size of the estimate against XLA's own
memory analysis of a compiled step on CPU.
"""

from __future__ import annotations

from payload.core.families import attention_sites, family_of
from payload.core.fit.attention import REFERENCE, choose_attention

REMAT_ORDER = ("none", "dots", "full")
REMAT_CHOICES = ("auto", *REMAT_ORDER)
F32 = 4
# Float32 logits of one chunk of the loss (payload.engines.jax.loss), over the whole global
# batch (each device holds its share).
LOGITS_CHUNK_BYTES = 256 << 20
# Copies of the reference attention's weights a CPU step keeps (the weights, the scores and the
# exponentials); a TPU's program keeps one.
CPU_ATTENTION_COPIES = 3


def chunk_length(batch: int, length: int, vocab: int,
                 budget_bytes: int = LOGITS_CHUNK_BYTES) -> int:
    """Positions per chunk of the loss: as many as keep a chunk's float32 logits within the
    budget."""
    return max(1, min(length, budget_bytes // (batch * vocab * 4)))


def _attention_bytes(site, *, platform, generation, dtype: str, size: int) -> float:
    """Per query token: what the attention keeps beyond its inputs and output."""
    choice = choose_attention(platform=platform, generation=generation, q_len=site.q_len,
                              kv_len=site.kv_len, head_dim=site.head_dim, mask=site.mask,
                              dropout=site.dropout, dtype=dtype)
    heads = site.heads
    if choice.kernel != REFERENCE:
        return F32 * heads
    # The weights once, in the product's dtype (the float32 softmax fuses into its cast: the
    # compiler's T5 base on v5e at 512 x 64 and 1024 x 32 held about 3 bytes a weight with
    # dropout, not the 7 of float32 weights beside their cast), and the dropout mask.
    keep = size * heads * site.kv_len
    if platform == "cpu":
        # XLA:CPU fuses less: it keeps the float32 scores and the softmax's exponentials beside
        # the weights (the compiled tiny GPT-2, BERT and T5 steps held about twice this
        # estimate's activations with one copy counted, 0.91-1.14 of them with three, with and
        # without attention dropout).
        keep *= CPU_ATTENTION_COPIES
    if site.dropout > 0:
        keep += heads * site.kv_len  # the dropout mask, a byte each
    return keep


def _layer(*, width: int, inner: int, ff: int, gated: bool, size: int, attention: float,
           dropout: bool, policy: str, cross_inner: int = 0, post_norm: bool = False) -> float:
    """Bytes per token one layer keeps for the backward pass. `inner` is heads x head width,
    `ff` the feed-forward's width; `cross_inner` a decoder layer's cross-attention;
    `post_norm` the norms after the residual sums (their float32 inputs kept apart)."""
    products = 3 * inner + width + (2 if gated else 1) * ff + width  # q k v, out, ff in, ff out
    if cross_inner:
        products += cross_inner + width  # the cross-attention's query and output
    if policy == "full":
        return size * width
    if policy == "dots":
        return size * (width + products)
    kept = size * (width + products + inner + (2 if gated else 1) * ff + width)
    if post_norm:
        kept += F32 * width * (3 if cross_inner else 2)  # the norms' float32 inputs
    kept += attention
    if dropout:
        kept += 3 * width  # masks after attention, feed-forward, and on the residual
    return kept


def activation_bytes(workload, policy: str, *, rows: int) -> int:
    """Bytes one chip holds for `rows` rows of the batch under remat `policy` (a Workload:
    payload.core.fit.workload.Workload)."""
    arch = workload.architecture
    size = 2 if workload.bf16 and workload.platform != "cpu" else F32
    dtype = "bfloat16" if size == 2 else "float32"
    sites = attention_sites(arch, seq_len=workload.seq_len, target_len=workload.target_len)

    def attention(site) -> float:
        return _attention_bytes(site, platform=workload.platform,
                                generation=workload.generation, dtype=dtype, size=size)

    length, vocab = workload.seq_len, arch["vocab_size"]
    dims = family_of(arch).dims(arch)
    width, ff, gated, dropout = dims.width, dims.ff, dims.gated, dims.dropout
    inner, heads = dims.heads * dims.head_dim, dims.heads
    layers = dims.layers
    if not dims.decoder_layers:  # one stack (BERT, RoBERTa, GPT-2, Llama)
        per = {p: _layer(width=width, inner=inner, ff=ff, gated=gated, size=size,
                         attention=attention(sites[0]), dropout=dropout, policy=p,
                         post_norm=dims.post_norm)
               for p in REMAT_ORDER}
        tokens = rows * length
        body = tokens * (layers * per[policy] + per["none"] + F32 * width)
    else:
        decoder_layers = dims.decoder_layers
        encoder_site, decoder_site, cross_site = sites
        target = workload.target_len or length
        enc = {p: _layer(width=width, inner=inner, ff=ff, gated=gated, size=size,
                         attention=attention(encoder_site), dropout=dropout, policy=p,
                         post_norm=dims.post_norm)
               for p in REMAT_ORDER}
        dec = {p: _layer(width=width, inner=inner, ff=ff, gated=gated, size=size,
                         attention=attention(decoder_site) + attention(cross_site),
                         dropout=dropout, policy=p, cross_inner=inner,
                         post_norm=dims.post_norm)
               for p in REMAT_ORDER}
        # The encoder's output's keys and values in every decoder layer, per input token
        # (products: kept unless the whole layer is recomputed).
        memory_kv = 0 if policy == "full" else decoder_layers * 2 * inner * size
        body = (rows * length * (layers * enc[policy] + memory_kv + enc["none"] + F32 * width)
                + rows * target * (decoder_layers * dec[policy] + dec["none"] + F32 * width))
        # Each stack's relative-position bias [H, T, T] in float32 and its gradient.
        body += 2 * F32 * heads * (length * length + target * target)
    predicted = workload.predicted_len
    batch = workload.batch_size
    chunk = chunk_length(batch, predicted, vocab)
    # One chunk's float32 logits: their gradient takes their place (a 2-layer GPT-2 under a
    # 32,000-token loss at 1024 x 8 on v5e compiled 21% under an estimate that counted both).
    logits = F32 * vocab * min(chunk, predicted) * rows
    return int(body + logits)

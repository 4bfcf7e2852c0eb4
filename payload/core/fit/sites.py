"""The run plan's words on attention: each attention call of a family's model with the kernel
it takes and why.

    attention_plan(architecture, platform="cpu", seq_len=128, bf16=False)
    # ["attention (causal self-attention): reference; ..."]

The calls are the family's (payload.core.families: attention_sites), the choice
payload.core.fit.attention's, so what `tpuctl train --dry-run` prints is what the step runs.
"""

from __future__ import annotations

from payload.core.families import attention_sites
from payload.core.fit.attention import choose_attention

__all__ = ["attention_plan", "attention_sites"]


def attention_plan(architecture: dict, *, platform: str, seq_len: int, bf16: bool,
                   generation: str | None = None, target_len: int | None = None) -> list[str]:
    """The run plan's words on attention: the kernel of each kind of call and why."""
    dtype = "bfloat16" if bf16 and platform != "cpu" else "float32"
    lines = []
    for site in attention_sites(architecture, seq_len=seq_len, target_len=target_len):
        choice = choose_attention(platform=platform, generation=generation, q_len=site.q_len,
                                  kv_len=site.kv_len, head_dim=site.head_dim, mask=site.mask,
                                  dropout=site.dropout, dtype=dtype)
        lines.append(f"attention ({site.name}): {choice.kernel}; {choice.reason}")
    return lines

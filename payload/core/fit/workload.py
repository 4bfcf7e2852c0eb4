"""What one training step computes, described once for the fit check and the plan lines.

    work = Workload.of(architecture, model=config.model, data=config.data,
                       train=config.train, platform="tpu", generation="v5e")
    work.predicted_len      # positions the head predicts per row
"""

from __future__ import annotations

from dataclasses import dataclass

from payload.core.families import FAMILIES


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What one training step computes, for an engine's memory plan: the model (a transformers
    config dict), the global batch, the lengths (T5's target, the positions the head predicts
    per row), bf16, train.remat, and the platform and TPU generation it runs on."""

    architecture: dict
    batch_size: int
    seq_len: int
    target_len: int | None
    predicted_len: int
    bf16: bool
    remat: str
    platform: str
    generation: str | None = None

    @classmethod
    def of(cls, architecture: dict, *, model, data, train, platform: str,
           generation: str | None = None) -> Workload:
        """From a run config's model, data and train sections."""
        seq_len, family = data.seq_len, FAMILIES[model.family]
        target = family.target_len(model, seq_len)
        predicted = family.predicted_len(seq_len, mlm_probability=model.mlm_probability,
                                                   target_len=target)
        return cls(architecture=architecture, batch_size=train.batch_size, seq_len=seq_len,
                   target_len=target, predicted_len=predicted, bf16=train.bf16,
                   remat=train.remat, platform=platform,
                   generation=generation)

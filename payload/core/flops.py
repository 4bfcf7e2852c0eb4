"""Model FLOPs of training on one row, by family: the formulas the run plan, the meter and the
bench all count with.

    flops = FAMILIES["bert"].flops(architecture, 128, 20)   # a transformers config dict
    flops.total, flops.shares()

Each family's module (payload.core.families.<name>) holds its formula; all take
(architecture, row length, positions the head predicts) and give a StepFlops.
"""

from __future__ import annotations

from dataclasses import dataclass


def millions(n: float) -> str:
    return f"{n / 1e6:,.1f}M"


@dataclass(frozen=True, kw_only=True)
class StepFlops:
    """Model FLOPs of one training step (forward and backward) for one row, by term."""

    dense: float  # 6 x non-embedding parameters x tokens
    attention: float  # scores and weighted values
    vocabulary: float  # the output projection at the predicted positions
    formula: str  # the estimate in words, with the figures it used

    @property
    def total(self) -> float:
        return self.dense + self.attention + self.vocabulary

    def shares(self) -> tuple[tuple[str, float], ...]:
        terms = (("vocabulary projection", self.vocabulary), ("layers' matrices", self.dense),
                 ("attention", self.attention))
        total = self.total or 1.0
        return tuple(sorted(((name, value / total) for name, value in terms),
                            key=lambda term: -term[1]))

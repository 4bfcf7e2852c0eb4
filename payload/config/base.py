"""What every section of the run config shares: the frozen base, the bounds, the problem lists.

    raise_all(problems_of("cluster.zone", accelerators.check_zone, acc, zone))
    check_scheme("s3://bucket/x", "read")   # ValueError: tpuctl reads local paths and gs:// only
"""

from __future__ import annotations

import re
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo

from payload.core.engines import DEFAULT as DEFAULT_ENGINE
from payload.core.errors import UserError

MIN_SEQ_LEN = 16
# Local worker processes share this machine's cores; more than this is a typo.
MAX_LOCAL_WORKERS = 64
# Byte-level BPE starts from all 256 byte symbols before it learns any merge.
BYTE_ALPHABET = 256
# The smallest useful vocabulary for the other kinds, on top of the special tokens.
MIN_LEARNED_PIECES = 64
# Bounds past any real run: a value beyond them is a typo (1e30 steps would never end, and a
# learning rate over 1 sends AdamW and Adafactor to NaN within steps).
MAX_STEPS = 1_000_000_000
MAX_LEARNING_RATE = 1.0
# train.engine: payload.core.engines' names (a test holds this Literal to them).
EngineName = Literal["tensorflow", "jax"]


class Section(BaseModel):
    # Infinity and NaN are never a sensible setting (`learning_rate: .inf` would train to NaN).
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True,
                              allow_inf_nan=False)


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def check_scheme(value: str, what: str, *, quote: bool = True) -> str:
    """Local paths and gs:// only: another scheme (s3://) would become a relative local folder."""
    if value.startswith("gs:") and not value.startswith("gs://"):
        # gs:/x (one slash) would otherwise be read as a local folder named gs:.
        raise ValueError(f"'{value}' is not a gs:// URL; write gs://BUCKET/PATH")
    match = _SCHEME.match(value)
    if match and match.group(1) != "gs":
        shown = f"'{value}' uses" if quote else "uses"
        raise ValueError(f"{shown} {match.group(1)}://, which tpuctl cannot {what}; use a "
                         "local path or gs://BUCKET/PATH")
    return value


def engine_of(info: ValidationInfo) -> str:
    """The train.engine a section is validated for (parse_config's context); an engine that is
    not one is reported by the train section, and the default stands in for it here."""
    engine = (info.context or {}).get("engine")
    return engine if engine in get_args(EngineName) else DEFAULT_ENGINE


def problems_of(key: str, check, *args) -> list[str]:
    """Run an accelerator-table check: its one-line refusal, naming the key, or nothing."""
    try:
        check(*args)
    except UserError as exc:
        return [f"{key}: {exc}"]
    return []


class Problems(ValueError):
    """Several problems a validator found at once: parse_config shows each as a line of its
    own. Any other error is one problem, whatever its text holds (a value may end in a
    newline)."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = list(problems)


def raise_all(problems: list[str]) -> None:
    if problems:
        raise Problems(problems)

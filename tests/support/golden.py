"""Golden losses: the evaluation losses of a deterministic tiny run, recorded once per family and
engine (tests/golden/NAME.json) and compared within a tolerance. A learning test then trains a
few dozen steps and still proves two things: the loss fell (the recorded curve falls, and so must
this one), and training computes what it computed when the curve was recorded (a change to the
model, the objective, the schedule or the input order moves the curve past the tolerance).

    evals = json.loads((out / "metrics.json").read_text())["evals"]
    assert_golden("gpt2-tensorflow", evals)

After a deliberate change to what training computes, record the curves again and commit them:

    TPUCTL_RECORD_GOLDEN=1 make test-all     # or pytest -k the learning tests
"""

from __future__ import annotations

import json
import os

from tests.support.paths import REPO

GOLDEN = REPO / "tests" / "golden"
RECORD_ENV = "TPUCTL_RECORD_GOLDEN"
# Relative tolerance per recorded loss. The runs are bit-identical run to run on one machine;
# another CPU (instruction set, thread count) moves a tiny model's loss by far less than this,
# while a real change to training moves it by more within a few steps.
TOLERANCE = 0.01


def assert_golden(name: str, evals: list[dict], *, tolerance: float = TOLERANCE) -> None:
    """The (step, loss) pairs of `evals` (metrics.json's) are the recorded ones, within
    `tolerance`; and the recorded curve fell. With TPUCTL_RECORD_GOLDEN=1, record them."""
    path = GOLDEN / f"{name}.json"
    got = [[e["step"], round(e["loss"], 6)] for e in evals]
    if os.environ.get(RECORD_ENV):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps({"evals": got}, indent=1) + "\n")
    assert path.exists(), f"no golden losses for {name}: record them with {RECORD_ENV}=1"
    want = json.loads(path.read_text())["evals"]
    assert [s for s, _ in got] == [s for s, _ in want], (got, want)
    assert want[-1][1] < want[0][1], f"the recorded curve of {name} does not fall: {want}"
    off = [(s, g, w) for (s, g), (_, w) in zip(got, want, strict=True)
           if abs(g - w) > tolerance * abs(w)]
    assert not off, (f"{name}: losses moved from the recorded curve by more than "
                     f"{tolerance:.0%} (step, now, recorded): {off}; if training was changed on "
                     f"purpose, record again with {RECORD_ENV}=1")

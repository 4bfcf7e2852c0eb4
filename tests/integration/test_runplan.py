"""The run plan: FLOPs, time and cost against a hand calculation; the batch refusal and the
mis-sizing warnings, through `tpuctl train --dry-run` as a user runs it."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import REPO


def test_the_sharding_plan_is_worked_out_without_jax():
    out = subprocess.run([sys.executable, "-c", (
        "import sys; import payload.core.fit.sharding, payload.training.runplan, "
        "payload.config; from payload.core.engines import engine_spec; "
        "engine_spec('jax').plan_sharding(10**9, num_devices=8, hbm_bytes_per_chip=16 << 30, "
        "optimizer='adamw'); print(sorted(m for m in ('jax', 'flax', 'tensorflow') "
        "if m in sys.modules))")], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"



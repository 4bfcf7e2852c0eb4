"""What the run plan and the config say of the JAX engine's speed settings, before anything runs
and without importing JAX: the attention kernel of each attention call and why (a v6e slice, a
GPU-less local run), train.remat and the activations beside the state, model.attention_dropout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.jax_plans import V6E, config
from tests.support.paths import REPO


def test_the_plan_with_activations_imports_no_framework():
    out = subprocess.run([sys.executable, "-c", (
        "import sys\n"
        "from payload.config import parse_config\n"
        "from payload.training import runplan\n"
        "from payload.training.strategy import Hardware\n"
        f"raw = {config(Path('/tmp/x'), cluster=V6E, train={'bf16': True})!r}\n"
        "del raw['output_dir']\n"
        "plan = runplan.run_plan(parse_config(raw), hardware=Hardware.tpu('v6e-8', 'x'),"
        " num_workers=1)\n"
        "assert 'activations about' in plan.sharding and plan.engine_lines\n"
        "print(sorted(m for m in ('jax', 'flax', 'optax', 'tensorflow') if m in sys.modules))\n"
    )], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

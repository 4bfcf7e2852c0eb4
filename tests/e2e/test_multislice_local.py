"""Multislice on this CPU, for real: `tpuctl train --local --workers 4` with `cluster.slices: 2`
runs the JAX engine as two "slices" of two worker processes each (the mesh's data axis split
over the slices outermost, gloo between every process, the MEGASCALE variables on every
worker), and its loss curve is the one slice's: one process over four CPU devices, fed the
same global batches (tests/support/scripts/jax_reference.py); its export loads in PyTorch."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("optax")
pytest.importorskip("tensorflow")

from typer.testing import CliRunner

from launcher.cli import app
from tests.support.configs import tiny_config
from tests.support.jax import (
    JAX_REFERENCE,
    assert_export_gives_the_checkpoints_logits_in_pytorch,
    worker_env,
)

STEPS = 6
WORKERS = 4


def config(folder: Path, out: Path, *, workers: int, slices: int) -> Path:
    corpus = folder / "corpus.txt"
    folder.mkdir(parents=True, exist_ok=True)
    corpus.write_text("".join(f"sentence {i} about rivers and light {i % 13}\n"
                              for i in range(400)))
    return tiny_config(folder, name="slices", corpus=str(corpus), output_dir=str(out),
                       cluster={"provider": "local", "workers": workers, "slices": slices},
                       train={"engine": "jax", "steps": STEPS, "batch_size": 8,
                              "learning_rate": 5e-3, "checkpoint_every": STEPS,
                              "eval_every": STEPS, "eval_batches": 1})


@pytest.mark.slow  # two runs, four workers and the reference: ~6 min on a loaded 2-core machine
def test_four_local_workers_as_two_slices_train_the_one_slice_loss_curve(tmp_path,
                                                                          tpuctl_home):
    out = tmp_path / "out"
    run = config(tmp_path / "run", out, workers=WORKERS, slices=2)
    result = CliRunner().invoke(app, ["train", "-c", str(run), "--local",
                                      "--stages", "tokenizer,prepare,train"])
    assert result.exit_code == 0, result.output
    assert "data parallel over 2 slices" in result.output, result.output
    multi = json.loads((out / "metrics.json").read_text())
    assert multi["replicas"] == WORKERS

    # The same run as one slice: the same shards, one process over four devices.
    ref = tmp_path / "ref"
    shutil.copytree(out, ref, ignore=shutil.ignore_patterns("checkpoints", "metrics.json",
                                                            "logs", "model"))
    ref_config = config(tmp_path / "ref-run", ref, workers=1, slices=1)
    single = subprocess.run([sys.executable, str(JAX_REFERENCE), "--config", str(ref_config)],
                            env=worker_env(WORKERS),
                            capture_output=True, text=True, timeout=900)
    assert single.returncode == 0, single.stdout[-2000:] + single.stderr[-3000:]
    one = json.loads((ref / "metrics.json").read_text())
    for key in ("train", "evals"):
        assert [r["step"] for r in multi[key]] == [r["step"] for r in one[key]]
        np.testing.assert_allclose([r["loss"] for r in multi[key]],
                                   [r["loss"] for r in one[key]], rtol=0.01)
    assert multi["evals"][-1]["loss"] < multi["evals"][0]["loss"]  # it trained
    # What the slices trained exports as the one model PyTorch loads.
    exported = CliRunner().invoke(app, ["train", "-c", str(run), "--local", "--stages",
                                        "export"])
    assert exported.exit_code == 0, exported.output
    assert_export_gives_the_checkpoints_logits_in_pytorch(run, out, tmp_path / "torch",
                                                          steps=STEPS)

"""Multi-process JAX through the launcher, for real: `tpuctl train --local --workers 2` with
`train.engine: jax` runs the tokenizer, prepare and train stages, both workers train as one JAX
program (gloo collectives, the coordinator on worker 0's per-job port), and the run computes
what one process over two CPU devices computes from the same global batches."""

import json
import re
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
from tests.helpers import tiny_config
from tests.test_jax_multiprocess import worker_env
from tests.test_jax_train import checkpoint_variables

REFERENCE = Path(__file__).resolve().parent / "jax_reference.py"
STEPS = 20


def corpus(folder: Path) -> Path:
    path = folder / "corpus.txt"
    path.write_text("".join(f"sentence {i} about {' '.join(['rivers', 'stones'][i % 2:])} "
                            f"and light {i % 13}\n" for i in range(800)))
    return path


def jax_config(folder: Path, out: Path, workers: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return tiny_config(folder, name="jax-local", corpus=str(corpus(folder)), output_dir=str(out),
                       cluster={"provider": "local", "workers": workers},
                       model={"family": "gpt2", "dropout": 0.1},
                       train={"engine": "jax", "steps": STEPS, "batch_size": 8,
                              "learning_rate": 5e-3, "checkpoint_every": 10, "eval_every": 10,
                              "eval_batches": 2})


@pytest.mark.slow  # the whole pipeline on two workers, then the reference: ~90 s here
def test_two_local_jax_workers_compute_what_one_process_over_two_devices_computes(
        tmp_path, tpuctl_home):
    out = tmp_path / "out"
    config = jax_config(tmp_path / "run", out, workers=2)
    result = CliRunner().invoke(app, ["train", "-c", str(config), "--local", "--stages",
                                      "tokenizer,prepare,train"])
    assert result.exit_code == 0, result.output
    # Every worker trained (one program over both processes) and ended with the same weights.
    hashes = re.findall(r"worker-(\d) \| .*finished at step 20; weights sha256 (\w+)",
                        result.output)
    assert sorted(w for w, _ in hashes) == ["0", "1"], result.output
    assert hashes[0][1] == hashes[1][1]
    multi = json.loads((out / "metrics.json").read_text())
    assert multi["engine"] == "jax" and multi["strategy"] == "cpu-multi-worker"
    assert multi["replicas"] == 2

    # The reference: the same shards and tokenizer, one process over two CPU devices, fed the
    # two workers' pipelines side by side.
    ref = tmp_path / "ref"
    shutil.copytree(out, ref, ignore=shutil.ignore_patterns("checkpoints", "metrics.json",
                                                            "logs", "model"))
    ref_config = jax_config(tmp_path / "ref-run", ref, workers=1)
    single = subprocess.run([sys.executable, str(REFERENCE), "--config", str(ref_config),
                             "--pipelines", "2"], env=worker_env(2),
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stdout[-2000:] + single.stderr[-3000:]
    assert "JAX on 2 cpu device(s) in 1 process(es)" in single.stdout, single.stdout[-2000:]
    one = json.loads((ref / "metrics.json").read_text())
    assert one["replicas"] == 2 and one["strategy"] == "cpu"
    for key in ("train", "evals"):
        assert [r["step"] for r in multi[key]] == [r["step"] for r in one[key]]
        np.testing.assert_allclose([r["loss"] for r in multi[key]],
                                   [r["loss"] for r in one[key]], rtol=0, atol=1e-5)
    assert one["evals"][-1]["loss"] < one["evals"][0]["loss"]  # it trained, dropout on
    wanted = checkpoint_variables(ref / "checkpoints" / str(STEPS))
    got = checkpoint_variables(out / "checkpoints" / str(STEPS))
    assert sorted(got) == sorted(wanted)
    for name, value in wanted.items():
        np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-5, err_msg=name)


"""The bench's accelerator section runs end to end on this CPU with tiny shapes, both sides in
their own Pythons (JAX here, PyTorch in .venv-torch), so it cannot rot before a GPU or TPU run
uses it; its figures are not speed claims and nothing here asserts a time."""

import json
import math
import subprocess
import sys

import pytest

from tests.support.paths import REPO

TORCH_PYTHON = REPO / ".venv-torch" / "bin" / "python"
TORCH_READY = REPO / ".venv-torch" / ".installed"


@pytest.mark.torch
@pytest.mark.slow  # the bench's own smoke run (both sides, two families): `make bench` territory
def test_the_tiny_accelerator_bench_runs_both_sides_and_prints_its_table(tmp_path):
    if not TORCH_READY.exists():
        pytest.skip("no transformers 5.x environment (.venv-torch; `make setup-torch`)")
    out = tmp_path / "accel.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.accel_bench", "--tiny", "--torch-python",
         str(TORCH_PYTHON), "--json", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=900, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["tiny"] and figures["matmul"]["flops_per_s"] > 0
    assert sorted(figures["cases"]) == ["bert", "gpt2"]
    for name, case in figures["cases"].items():
        sides = case["sides"]
        assert sorted(sides) == ["jax cached", "jax cold", "torch eager"], (name, sides)
        for side, got in sides.items():
            assert "error" not in got, (name, side, got)
            assert got["tokens_per_s"] > 0 and math.isfinite(got["loss"])
            assert got["first_step_since_start_s"] >= got["first_step_s"] > 0
            assert got["mfu_measured"] > 0 and got["mfu_spec"] is None  # a CPU has no spec
        # The second JAX process loads the step the first one compiled.
        assert (sides["jax cold"]["cache"], sides["jax cached"]["cache"]) == ("miss", "hit")
        assert sides["jax cold"]["attention"][0].split(":")[1].strip().startswith("reference")
        assert sides["torch eager"]["versions"]["transformers"].startswith("5.")
        # Both sides start from a fresh model on the same random tokens: a loss near ln(vocab).
        for side in sides.values():
            assert abs(side["loss"] - math.log(1000)) < 1.5, (name, side["loss"])
    table = result.stdout
    assert "accelerator bench on cpu (tiny shapes: no speed figures)" in table
    assert table.count("jax cold") == 2 and table.count("torch eager") == 2


def test_the_jax_side_imports_no_tensorflow_and_no_pydantic(tmp_path):
    """What the lent GPU machine lacks: the bench's JAX half must not need it."""
    from bench.accel_bench import TINY, case_file

    path, _ = case_file("gpt2", TINY["gpt2"], folder=tmp_path, steps=1, warmup=0, bf16=False,
                        dropout=0.0)
    code = ("import runpy, sys\n"
            f"sys.argv = ['accel_jax', 'step', {str(path)!r}]\n"
            "runpy.run_module('bench.accel_jax', run_name='__main__')\n"
            "print(sorted(m for m in ('tensorflow', 'tf_keras', 'pydantic', 'torch')"
            " if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"

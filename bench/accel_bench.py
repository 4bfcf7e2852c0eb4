"""The accelerator bench: the JAX engine's training step against what a user would pick instead,
Hugging Face PyTorch (eager and torch.compile, bf16 autocast, fused AdamW on CUDA), on BERT-base
(seq 512, batch 64) and GPT-2 small (seq 1024, batch 32), random tokens.

    python -m bench.accel_bench [--tiny | --full] [--torch-python PATH] [--jax-python PATH]
    python -m bench --only accel --torch-python .venv-torch/bin/python      # as `make bench` does

Figures, each side in processes of its own: tokens/s over timed steps after a warm-up; MFU,
model FLOPs by the project's formula (payload.training.runplan.step_flops, the same count for
both sides) over the chip's spec peak (dense bf16) and over a measured matrix product (bf16
8192^3 on an accelerator); time to the first step from the process's start (imports, weights,
compile, the step), for JAX cold (an empty compilation cache) and from the cache (a second
process over the cache the first filled). Needs JAX and PyTorch, not TensorFlow: the sides may
live in different Pythons (here JAX in .venv, PyTorch in .venv-torch). With no accelerator
(`--tiny`, the default on CPU) the same code runs on tiny shapes, so it cannot rot; its
figures say nothing about speed. bench/gpu_bench.sh is the one command for a lent GPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from bench import runner

# The issue's shapes, and tiny ones for a CPU: the same families, objectives and code paths.
CASES = {
    "bert": {"family": "bert", "size": "base", "seq_len": 512, "batch": 64, "vocab": 30522},
    "gpt2": {"family": "gpt2", "size": "small", "seq_len": 1024, "batch": 32, "vocab": 50257},
}
TINY_SHAPE = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 256}
TINY = {
    "bert": {"family": "bert", "shape": TINY_SHAPE, "seq_len": 128, "batch": 8, "vocab": 1000},
    "gpt2": {"family": "gpt2", "shape": TINY_SHAPE, "seq_len": 128, "batch": 8, "vocab": 1000},
}
# Dense bf16 peak per chip from the vendors' spec sheets (GPUs); TPUs from the accelerator table.
GPU_PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "B200": 2250e12}
TIMEOUT_S = 900


def architecture(spec: dict, dropout: float) -> dict:
    """The transformers config the project builds for this family and size."""
    from payload.core.sizes import SHAPE_DEFAULTS, transformers_config

    shape = spec.get("shape") or {k: None for k in SHAPE_DEFAULTS}
    model = SimpleNamespace(family=spec["family"], size=spec.get("size"), dropout=dropout,
                            attention_dropout=None, **shape)
    arch = transformers_config(model, vocab_size=spec["vocab"], seq_len=spec["seq_len"])
    arch["pad_token_id"] = 0
    return arch


def case_file(name: str, spec: dict, *, folder: Path, steps: int, warmup: int, bf16: bool,
              dropout: float) -> tuple[Path, dict]:
    from payload.core.families import max_predictions
    from payload.training.runplan import step_flops

    arch = architecture(spec, dropout)
    predicted = (max_predictions(spec["seq_len"], 0.15) if spec["family"] == "bert"
                 else spec["seq_len"] - 1)
    case = {"name": name, "family": spec["family"], "architecture": arch,
            "seq_len": spec["seq_len"], "batch": spec["batch"], "predicted": predicted,
            "steps": steps, "warmup": warmup, "bf16": bf16,
            "cache_dir": str(folder / f"jax-cache-{name}"),
            "flops_per_step": step_flops(arch, seq_len=spec["seq_len"]).total * spec["batch"]}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(case))
    return path, case


def measured(python: str, args: list[str]) -> dict:
    """The JSON line a side printed last, or {"error": its stderr's tail}."""
    proc = subprocess.run([python, *args], capture_output=True, text=True, env=runner.env(),
                          cwd=runner.REPO, timeout=TIMEOUT_S, check=False)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def spec_peak(device: str, platform: str) -> float | None:
    """The chip's dense bf16 peak: the accelerator table's for a TPU, a spec sheet's for a GPU."""
    if platform == "tpu":
        from payload.cloud.accelerators import GENERATIONS
        from payload.core.fit.attention import generation_of

        generation = GENERATIONS.get(generation_of(device) or "")
        return generation.peak_bf16_flops_per_chip if generation else None
    return next((peak for name, peak in GPU_PEAK_BF16.items() if name in device), None)


def bench(names: list[str], *, tiny: bool, jax_python: str, torch_python: str | None,
          compile_torch: bool, steps: int, warmup: int, dropout: float, say=print) -> dict:
    """Every side of every case, each row said as soon as it is measured (a run stopped by its
    time limit still shows what it had)."""
    folder = Path(tempfile.mkdtemp(prefix="tpuctl-accel-"))
    probe = (["matmul", "1024", "float32"] if tiny else ["matmul", "8192", "bfloat16"])
    matmul = measured(jax_python, ["-m", "bench.accel_jax", *probe])
    figures = {"tiny": tiny, "steps": steps, "warmup": warmup, "dropout": dropout,
               "matmul": matmul, "cases": {}}
    say("\n".join(header(figures)))
    for name in names:
        path, case = case_file(name, (TINY if tiny else CASES)[name], folder=folder,
                               steps=steps, warmup=warmup, bf16=not tiny, dropout=dropout)
        runs = [("jax cold", jax_python, ["-m", "bench.accel_jax", "step", str(path)]),
                ("jax cached", jax_python, ["-m", "bench.accel_jax", "step", str(path)])]
        if torch_python:
            runs += [(f"torch {mode}", torch_python, ["-m", "bench.accel_torch", mode, str(path)])
                     for mode in (("eager", "compile") if compile_torch else ("eager",))]
        sides: dict[str, dict] = {}
        figures["cases"][name] = {"shape": {k: case[k] for k in ("seq_len", "batch")},
                                  "flops_per_step": case["flops_per_step"], "sides": sides}
        for label, python, args in runs:
            side = sides[label] = measured(python, args)
            if "steps_per_s" in side:
                side["tokens_per_s"] = side["steps_per_s"] * case["batch"] * case["seq_len"]
                model_flops = side["steps_per_s"] * case["flops_per_step"]
                peak = spec_peak(side.get("device", ""), side.get("platform", ""))
                side["mfu_spec"] = model_flops / peak if peak else None
                side["mfu_measured"] = (model_flops / matmul["flops_per_s"]
                                        if matmul.get("flops_per_s") else None)
            say(row(name, label, side))
    say("\n".join(footer(figures)))
    return figures


def _cell(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def header(figures: dict) -> list[str]:
    matmul = figures["matmul"]
    size = "tiny shapes: no speed figures" if figures["tiny"] else "the issue's shapes"
    peak = matmul.get("flops_per_s")
    return [f"\naccelerator bench on {matmul.get('device', '?')} ({size}), "
            f"{figures['steps']} timed steps after {figures['warmup']}, dropout "
            f"{figures['dropout']:g}; measured {matmul.get('dtype', '?')} "
            f"{matmul.get('size', '?')}^3 product: {_cell(peak and peak / 1e12, '.1f')} TFLOP/s",
            f"{'case':8}{'side':14}{'tokens/s':>12}{'MFU spec':>10}{'MFU meas.':>10}"
            f"{'first step s':>14}{'compile s':>11}  cache"]


def row(name: str, label: str, side: dict) -> str:
    if "error" in side:
        return f"{name:8}{label:14}  failed: {' '.join(side['error'])}"
    return (f"{name:8}{label:14}{side['tokens_per_s']:>12,.0f}"
            f"{_cell(side['mfu_spec'], '.1%'):>10}{_cell(side['mfu_measured'], '.1%'):>10}"
            f"{side['first_step_since_start_s']:>14.1f}"
            f"{_cell(side.get('compile_s'), '.1f'):>11}  {side.get('cache', '')}")


def footer(figures: dict) -> list[str]:
    versions = {}
    for case in figures["cases"].values():
        for side in case["sides"].values():
            versions.update(side.get("versions", {}))
    return ["versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())),
            "first step: seconds from the process's start to the end of the first step "
            "(imports, weights, compile or cache, the step); MFU: the project's model FLOPs "
            "per step x steps/s over the spec's dense bf16 peak and over the measured product"]


def run(results: dict, quick: bool = False, torch_python: str | None = None,
        jax_python: str | None = None, tiny: bool | None = None,
        compile_torch: bool | None = None, cases: list[str] | None = None) -> dict:
    """`make bench`'s accelerator section: tiny shapes when JAX sees no accelerator."""
    jax_python = jax_python or sys.executable
    if tiny is None:
        backend = subprocess.run([jax_python, "-c", "import jax; print(jax.default_backend())"],
                                 capture_output=True, text=True, env=runner.env(),
                                 timeout=300, check=False).stdout.strip()
        tiny = backend in ("cpu", "")
    steps, warmup = (3, 1) if tiny else ((10, 3) if quick else (30, 5))
    figures = bench(cases or list(CASES), tiny=tiny, jax_python=jax_python,
                    say=lambda text: print(text, flush=True),
                    torch_python=torch_python or sys.executable,
                    compile_torch=not tiny if compile_torch is None else compile_torch,
                    steps=steps, warmup=warmup, dropout=0.0)
    results["accel"] = figures
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.accel_bench")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--tiny", action="store_true", help="tiny shapes (any CPU)")
    size.add_argument("--full", action="store_true", help="the issue's shapes")
    parser.add_argument("--torch-python", help="the Python with torch and transformers "
                        "(default: this one)")
    parser.add_argument("--jax-python", help="the Python with JAX (default: this one)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--quick", action="store_true", help="fewer timed steps")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"which of {', '.join(CASES)} (default: all)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    tiny = True if args.tiny else (False if args.full else None)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        parser.error(f"--cases: choose from {', '.join(CASES)}")
    results: dict = {}
    run(results, quick=args.quick, torch_python=args.torch_python, jax_python=args.jax_python,
        tiny=tiny, compile_torch=False if args.no_compile else None, cases=cases)
    if args.json:
        Path(args.json).write_text(json.dumps(results["accel"], indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Benchmark of training on CPU: the two engines side by side, and our train stage against the
reference approach of Hugging Face's TF `run_mlm.py`; same shards, same tiny RoBERTa, same batch.

    python -m bench --only train [--quick]

Figures (all measured in this run, the sides alternating, best of 3 each):
- the engines: `python -m payload train` with `train.engine` tensorflow and jax on the same
  config and shards: steady steps/s and tokens/s, the first step (compiling included), model
  FLOPs utilisation against the matmul probe each run makes at its start and against one peak
  (the best probe of the bench), and the evaluation loss at the start and the end;
- training steps/s: ours (TensorFlow, the MLM head only at the masked positions) against the
  reference (parse_single_example -> batch -> collator masking -> `model.fit` with
  `create_optimizer`); target >= 2x;
- input pipeline examples/s with no model: ours (batch first, then parse and mask the batch)
  against the reference pipeline; target >= 4x;
- how many times faster our pipeline produces examples than our training step consumes them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import yaml

from bench import runner
from bench.corpora import WORK
from payload.training import progress

REPO = runner.REPO
CORPUS = REPO / "payload" / "data" / "corpus.txt.gz"
SEQ_LEN = 128
BATCH = 32
VOCAB = 25_000  # what the reference measurement used; BPE on the bundled 2 MB stops lower
# Loss is compared over the same steps of the same schedule: ours logs a mean per window.
LOSS_WINDOW = 20
MODEL = {
    "family": "roberta",
    "hidden_size": 128,
    "num_layers": 2,
    "num_heads": 2,
    "intermediate_size": 512,
    "dropout": 0.1,
}
ENGINES = ("tensorflow", "jax")
OUT = WORK / "train"  # one output_dir: one tokenizer and one set of shards for every side
ROUNDS = 3


def _config(out: Path, steps: int, engine: str) -> Path:
    config = {
        "name": "train-bench",
        "output_dir": str(out),
        "cluster": {"provider": "local", "workers": 1},
        "data": {
            "corpus": [str(CORPUS)],
            "document_split": "blank_line",
            "seq_len": SEQ_LEN,
            "validation_fraction": 0.02,
            "records_per_shard": 1000,
        },
        "tokenizer": {"kind": "bpe", "vocab_size": VOCAB, "sample_mb": None},
        "model": MODEL,
        "train": {
            "engine": engine,
            "steps": steps,
            "batch_size": BATCH,
            "learning_rate": 5e-4,
            "warmup_steps": 5,
            "checkpoint_every": steps,
            "eval_every": LOSS_WINDOW,
            "eval_batches": 2,
            "seed": 0,
        },
    }
    # Beside output_dir, not in it: tpuctl refuses a folder holding files it did not write.
    path = out.parent / f"{out.name}-{engine}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def _prepared(steps: int) -> dict[str, Path]:
    """A config per engine over one output folder: the same tokenizer and shards for both."""
    configs = {engine: _config(OUT, steps, engine) for engine in ENGINES}
    if not (OUT / "data" / "manifest.json").exists():
        for stage in ("tokenizer", "prepare"):
            runner.run_python(["-m", "payload", stage, "--config", str(configs["tensorflow"])])
    return configs


def _ours_fit(config: Path) -> dict:
    """One `python -m payload train` run: its figures from metrics.json and the progress
    records it printed (the first step's time is told only there)."""
    out = OUT
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    started = time.perf_counter()
    printed = runner.run_python(["-m", "payload", "train", "--config", str(config), "--overwrite"])
    wall = time.perf_counter() - started
    records = [r for r in map(progress.parse, printed.splitlines()) if r]
    first_step_s = next((r["first_step_s"] for r in records if r.get("first_step_s") is not None),
                        None)
    metrics = json.loads((out / "metrics.json").read_text())
    final = metrics["final"]
    train = metrics["train"]
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    evals = metrics["evals"]
    return {
        "engine": metrics["engine"],
        "steps_per_s": final["steps_per_s"],
        "tokens_per_s": final["tokens_per_s"],
        "first_step_s": first_step_s,
        "wall_s": wall,
        "window_losses": {t["step"]: t["loss"] for t in train},
        "eval_loss_start": evals[0]["loss"],
        "eval_loss_end": evals[-1]["loss"],
        "eval_accuracy_start": evals[0]["accuracy"],
        "eval_accuracy_end": evals[-1]["accuracy"],
        # Model FLOPs utilisation against the CPU probe the train stage ran at its start.
        "mfu": final.get("mfu"),
        "model_flops_per_s": final.get("model_flops_per_s"),
        "peak_flops": metrics.get("utilisation", {}).get("peak_flops_per_device"),
        "flops_per_step": metrics.get("utilisation", {}).get("flops_per_step"),
    }


def _engines(runs: dict[str, list[dict]]) -> dict:
    """Each engine's best run (by steady steps/s; the first step: the quickest seen), its MFU
    also against one peak for both: the best probe any run of the bench measured. Both engines'
    train stages run the same probe (payload.engines.tensorflow.trainer.cpu_peak_flops: float32
    1024x1024 products in TensorFlow, in the training process, before training) and count the
    same model FLOPs per step, but each probe sees the machine's load of its moment; against
    one peak the MFU ratio is the steps/s ratio."""
    peak = max(r["peak_flops"] for rs in runs.values() for r in rs if r.get("peak_flops"))
    best = {}
    for engine, rs in runs.items():
        top = dict(max(rs, key=lambda r: r["steps_per_s"]))
        top["first_step_s"] = min(r["first_step_s"] for r in rs if r["first_step_s"] is not None)
        top["mfu_one_peak"] = top["model_flops_per_s"] / peak
        top["runs"] = [{k: r[k] for k in ("steps_per_s", "first_step_s", "mfu", "peak_flops")}
                       for r in rs]
        best[engine] = top
    tf, jax = best["tensorflow"], best["jax"]
    return {
        "one_peak_flops": peak,
        "tensorflow": tf,
        "jax": jax,
        "ratios_jax_over_tf": {
            "steps_per_s": jax["steps_per_s"] / tf["steps_per_s"],
            "tokens_per_s": jax["tokens_per_s"] / tf["tokens_per_s"],
            "first_step_s": jax["first_step_s"] / tf["first_step_s"],
            "mfu": jax["mfu"] / tf["mfu"],
            "mfu_one_peak": jax["mfu_one_peak"] / tf["mfu_one_peak"],
        },
    }


def run(results: dict, quick: bool = False) -> dict:
    steps_ours, steps_ref, batches = (40, 20, 100) if quick else (80, 40, 400)
    configs = _prepared(steps_ours)
    config = configs["tensorflow"]  # the reference and the pipelines: the TF engine's side
    manifest = json.loads((OUT / "data" / "manifest.json").read_text())
    figures: dict = {
        "seq_len": SEQ_LEN,
        "batch_size": BATCH,
        "steps": steps_ours,
        "vocab": manifest["vocab_size"],
        "model": MODEL,
        "cores": os.cpu_count(),
        "train_records": manifest["splits"]["train"]["records"],
    }
    # Shared, noisy machine: the sides alternate (the engines' order too), best of three each.
    engine_runs: dict[str, list[dict]] = {engine: [] for engine in ENGINES}
    ref_fit, ours_pipe, ref_pipe = [], [], []
    for round_ in range(1 if quick else ROUNDS):
        for engine in ENGINES if round_ % 2 == 0 else reversed(ENGINES):
            engine_runs[engine].append(_ours_fit(configs[engine]))
        ref_fit.append(
            runner.json_run(["-m", "bench.train_measure", "fit-reference", str(config), str(steps_ref)])
        )
        ours_pipe.append(
            runner.json_run(["-m", "bench.train_measure", "pipeline-ours", str(config), str(batches)])
        )
        ref_pipe.append(
            runner.json_run(
                ["-m", "bench.train_measure", "pipeline-reference", str(config), str(batches)]
            )
        )
    figures["engines"] = _engines(engine_runs)
    figures["ours_fit"] = figures["engines"]["tensorflow"]
    figures["reference_fit"] = max(ref_fit, key=lambda r: r["steps_per_s"])
    figures["ours_pipeline"] = max(ours_pipe, key=lambda r: r["examples_per_s"])
    figures["reference_pipeline"] = max(ref_pipe, key=lambda r: r["examples_per_s"])
    figures["steps_speedup"] = (
        figures["ours_fit"]["steps_per_s"] / figures["reference_fit"]["steps_per_s"]
    )
    figures["pipeline_speedup"] = (
        figures["ours_pipeline"]["examples_per_s"] / figures["reference_pipeline"]["examples_per_s"]
    )
    figures["pipeline_vs_consumption"] = figures["ours_pipeline"]["examples_per_s"] / (
        figures["ours_fit"]["steps_per_s"] * BATCH
    )
    # Mean training loss over the last window both sides ran (same steps of one schedule).
    ref_losses = figures["reference_fit"]["losses"]
    end = len(ref_losses) // LOSS_WINDOW * LOSS_WINDOW
    figures["loss_window"] = [end - LOSS_WINDOW + 1, end]
    figures["loss_ours"] = _window_loss(figures["ours_fit"], end)
    figures["loss_jax"] = _window_loss(figures["engines"]["jax"], end)
    figures["loss_reference"] = sum(ref_losses[end - LOSS_WINDOW : end]) / LOSS_WINDOW
    results["train"] = figures
    _print(figures)
    return figures


def _window_loss(fit: dict, end: int) -> float | None:
    windows = fit["window_losses"]
    return windows.get(str(end)) or windows.get(end)


def _print(f: dict) -> None:
    model = f["model"]
    print(
        f"\ntraining on CPU ({f['cores']} cores): RoBERTa {model['num_layers']}x"
        f"{model['hidden_size']}, vocab {f['vocab']:,}, batch {f['batch_size']} x seq_len "
        f"{f['seq_len']}"
    )
    _print_engines(f)
    rows = [
        (
            "train steps/s",
            f"{f['ours_fit']['steps_per_s']:.2f}",
            f"{f['reference_fit']['steps_per_s']:.2f}",
            f"{f['steps_speedup']:.2f}x",
            ">= 2x",
        ),
        (
            "pipeline examples/s",
            f"{f['ours_pipeline']['examples_per_s']:,.0f}",
            f"{f['reference_pipeline']['examples_per_s']:,.0f}",
            f"{f['pipeline_speedup']:.2f}x",
            ">= 4x",
        ),
    ]
    print("\nours (the tensorflow engine) against the reference approach")
    print(f"{'':22}{'ours':>12}{'reference':>12}{'ratio':>10}{'target':>10}")
    for name, ours, ref, ratio, target in rows:
        print(f"{name:22}{ours:>12}{ref:>12}{ratio:>10}{target:>10}")
    print(f"pipeline rate / training consumption: {f['pipeline_vs_consumption']:.1f}x")
    ours, ref = f["ours_fit"], f["reference_fit"]
    if ours.get("mfu") is not None and ref.get("mfu") is not None:
        print(
            "CPU utilisation (model FLOPs / float32 matmul probe of the same process): ours "
            f"{ours['mfu']:.1%} of {ours['peak_flops'] / 1e9:,.1f} GFLOP/s, reference "
            f"{ref['mfu']:.1%} of {ref['peak_flops'] / 1e9:,.1f} GFLOP/s (its MLM head at every "
            "position: more FLOPs per step)"
        )
    first, last = f["loss_window"]
    print(
        f"mean training loss, steps {first}-{last} of the same schedule: ours "
        f"{f['loss_ours']:.3f}, reference {f['loss_reference']:.3f}"
    )


def _print_engines(f: dict) -> None:
    e = f["engines"]
    tf, jax, ratio = e["tensorflow"], e["jax"], e["ratios_jax_over_tf"]
    peak = e["one_peak_flops"] / 1e9
    print(f"\nthe engines, `python -m payload train`, {f['steps']} steps, same config and shards "
          f"(best of {len(tf['runs'])}, alternating)")
    rows = [
        ("train steps/s", f"{tf['steps_per_s']:.2f}", f"{jax['steps_per_s']:.2f}",
         f"{ratio['steps_per_s']:.2f}x"),
        ("tokens/s", f"{tf['tokens_per_s']:,.0f}", f"{jax['tokens_per_s']:,.0f}",
         f"{ratio['tokens_per_s']:.2f}x"),
        ("first step s (compiling)", f"{tf['first_step_s']:.2f}", f"{jax['first_step_s']:.2f}",
         f"{ratio['first_step_s']:.2f}x"),
        ("MFU, own probe", f"{tf['mfu']:.1%}", f"{jax['mfu']:.1%}", f"{ratio['mfu']:.2f}x"),
        ("  own probe GFLOP/s", f"{tf['peak_flops'] / 1e9:,.1f}", f"{jax['peak_flops'] / 1e9:,.1f}",
         ""),
        (f"MFU, one peak {peak:,.1f} GFLOP/s", f"{tf['mfu_one_peak']:.1%}",
         f"{jax['mfu_one_peak']:.1%}", f"{ratio['mfu_one_peak']:.2f}x"),
        ("eval loss start", f"{tf['eval_loss_start']:.3f}", f"{jax['eval_loss_start']:.3f}", ""),
        ("eval loss end", f"{tf['eval_loss_end']:.3f}", f"{jax['eval_loss_end']:.3f}", ""),
    ]
    if f.get("loss_jax") is not None:
        first, last = f["loss_window"]
        rows.append((f"mean train loss {first}-{last}", f"{f['loss_ours']:.3f}",
                     f"{f['loss_jax']:.3f}", ""))
    print(f"{'':34}{'tensorflow':>12}{'jax':>12}{'jax/tf':>10}")
    for name, a, b, r in rows:
        print(f"{name:34}{a:>12}{b:>12}{r:>10}")
    print("MFU: model FLOPs per step (the same estimate for both) x steps/s, over the float32 "
          "matmul probe each run made at its start (TensorFlow, the same code for both engines), "
          "and over one peak: the best probe of the bench, so the ratio is the steps/s ratio")

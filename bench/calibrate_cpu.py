"""Measure what the CPU time estimate reads, on this machine, and write its table.

    python -m bench.calibrate_cpu --corpus my-text.txt           # every engine and family
    python -m bench.calibrate_cpu --corpus my-text.txt --engines jax --families gpt2
    python -m bench.calibrate_cpu --check --corpus my-text.txt   # estimate vs measured, no writing
    python -m bench.calibrate_cpu --corpus my-text.txt --from-runs calibration.log  # table only

For each engine and family it runs the real pipeline (`tpuctl train --local --workers 2`,
every stage) at the calibration shapes (`SHAPES`: vocabulary 4,000, hidden 128, 2 layers,
seq_len 128, batch 32, 300 steps) on the corpus given, each family with the tokenizer a user of
it would pick (GPT-2 byte-level BPE, BERT WordPiece, T5 SentencePiece), and reads back what each
stage took (the agents' `done in` lines, the stages' own timings, metrics.json's steady rate).
The training speed is stored as the model FLOP/s the run kept up on average (metrics.json's
steady rate); a matrix-product probe taken before each run is recorded beside it to show how
busy the machine was (on a shared machine a one-second probe ranged over 5x from one run to the
next while training's speed held, so the estimate does not scale by one). The unigram tokenizer is timed on its own
(`python -m payload tokenizer`). The result replaces launcher/cpu_times.json, the one place the
estimate's figures live (launcher.estimate); `--check` instead prints, per run, the estimate
the dry run gives next to what the run took.

Each run takes minutes (about 40 in all for both engines here); on a shared machine run it when
the machine is otherwise quiet, and more than once if figures jump.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "launcher" / "cpu_times.json"
WORKERS = 2
SHAPES = {"vocab_size": 4000, "hidden_size": 128, "num_layers": 2, "num_heads": 2,
          "intermediate_size": 512, "seq_len": 128, "batch_size": 32, "steps": 300,
          "eval_every": 100, "checkpoint_every": 100}
TOKENIZER_OF = {"gpt2": "bpe", "bert": "wordpiece", "t5": "sentencepiece"}
ENGINES = ("jax", "tensorflow")
FAMILIES = ("gpt2", "bert", "t5")

_DONE = re.compile(r"^worker-(\d) \| == tpuctl: (\w+) done on worker-\d in ([\d.]+)s ==\Z")
_TOKENIZER = re.compile(r"tokenizer: \d+ tokens from ([\d.]+) MB in ([\d.]+)s")
_PREPARE = re.compile(r"worker (\d+): \d+ documents, (\d+) tokens in ([\d.]+)s")


def run_config(folder: Path, corpus: Path, engine: str, family: str) -> Path:
    s = SHAPES
    raw = {
        "name": f"calibrate-{family}-{engine}",
        "output_dir": str(folder / "out"),
        "cluster": {"provider": "local", "workers": WORKERS},
        "data": {"corpus": str(corpus), "seq_len": s["seq_len"]},
        "tokenizer": {"kind": TOKENIZER_OF[family], "vocab_size": s["vocab_size"]},
        "model": {"family": family, "hidden_size": s["hidden_size"],
                  "num_layers": s["num_layers"], "num_heads": s["num_heads"],
                  "intermediate_size": s["intermediate_size"]},
        "train": {"engine": engine, "steps": s["steps"], "batch_size": s["batch_size"],
                  "learning_rate": 1e-3, "warmup_steps": 30,
                  "eval_every": s["eval_every"], "checkpoint_every": s["checkpoint_every"]},
    }
    path = folder / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _env(home: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TPUCTL_HOME": str(home),
           "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TPUCTL_DEBUG", None)
    return env


def measure_run(folder: Path, corpus: Path, engine: str, family: str) -> dict:
    """One real pipeline run: what each stage took, and the figures to calibrate from."""
    from payload.config import load_config
    from payload.training.runplan import row_flops, run_architecture
    from payload.training.utilisation import matmul_probe_flops

    config_path = run_config(folder, corpus, engine, family)
    probe = matmul_probe_flops()
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "train", "-c", str(config_path),
                           "--local", "--workers", str(WORKERS)], capture_output=True, text=True,
                          env=_env(folder / "home"), cwd=REPO, timeout=3600)
    wall = time.monotonic() - began
    if proc.returncode != 0:
        raise SystemExit(f"{engine} {family} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    stages: dict[str, float] = {}
    for line in proc.stdout.splitlines():
        found = _DONE.match(line)
        if found:
            stages[found.group(2)] = max(stages.get(found.group(2), 0.0), float(found.group(3)))
    tokenizer = _TOKENIZER.search(proc.stdout)
    prepared = [(int(t), float(s)) for _, t, s in _PREPARE.findall(proc.stdout)]
    config = load_config(config_path)
    metrics = json.loads((Path(config.output_dir) / "metrics.json").read_text())
    speed = metrics["final"]["model_flops_per_s"]
    per_row = row_flops(config, run_architecture(config)).total
    evals = len(metrics["evals"])
    work = per_row * config.train.batch_size * (
        config.train.steps + evals * config.train.eval_batches / 3)
    return {
        "engine": engine, "family": family, "probe_flops_per_s": probe, "wall_s": wall,
        "stages_s": stages, "model_flops_per_s": speed,
        "train_start_s": stages["train"] - work / speed,
        "tokenizer_mb": float(tokenizer.group(1)), "tokenizer_train_s": float(tokenizer.group(2)),
        "prepare_tokens": sum(t for t, _ in prepared),
        "prepare_work_s": max(s for _, s in prepared),
    }


def time_tokenizer(folder: Path, corpus: Path, kind: str) -> tuple[float, float]:
    """(MB, seconds) the tokenizer stage alone trains `kind` in, in one process."""
    config = run_config(folder, corpus, "tensorflow", "bert")
    raw = yaml.safe_load(config.read_text())
    raw["tokenizer"]["kind"] = kind
    config.write_text(yaml.safe_dump(raw))
    proc = subprocess.run([sys.executable, "-m", "payload", "tokenizer", "--config", str(config)],
                          capture_output=True, text=True, env=_env(folder / "home"), cwd=REPO,
                          timeout=3600)
    found = _TOKENIZER.search(proc.stdout)
    if proc.returncode != 0 or not found:
        raise SystemExit(f"tokenizer {kind} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return float(found.group(1)), float(found.group(2))


def table_of(runs: list[dict], unigram: tuple[float, float] | None, corpus_mb: float,
             previous: dict | None = None) -> dict:
    """The estimate's table from the runs (launcher.estimate reads it); the engines and
    families not measured this time keep their `previous` figures."""
    by_kind = {TOKENIZER_OF[r["family"]]: r for r in runs}
    tokenizer = {kind: round(r["tokenizer_train_s"] / r["tokenizer_mb"], 3)
                 for kind, r in by_kind.items()}
    if unigram:
        tokenizer["unigram"] = round(unigram[1] / unigram[0], 3)
    start = [r["stages_s"]["tokenizer"] - r["tokenizer_train_s"] for r in runs]
    prepare_start = [r["stages_s"]["prepare"] - r["prepare_work_s"] for r in runs]
    # A worker's share of the corpus, per second of its tokenizing (the workers share the cores).
    prepare = [r["prepare_work_s"] / (corpus_mb / WORKERS) for r in runs]
    previous = previous or {}
    tokenizer = {**previous.get("tokenizer", {}).get("s_per_mb", {}), **tokenizer}
    train: dict = json.loads(json.dumps(previous.get("train", {})))
    export: dict = json.loads(json.dumps(previous.get("export_s", {})))
    for r in runs:
        train.setdefault(r["engine"], {})[r["family"]] = {
            "start_s": round(max(r["train_start_s"], 0.0), 1),
            "model_flops_per_s": round(r["model_flops_per_s"], -6)}
        export.setdefault(r["engine"], {})[r["family"]] = round(r["stages_s"]["export"], 1)
    return {
        "measured": time.strftime("%Y-%m-%d"),
        "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]},
        "workers": WORKERS, "corpus_mb": round(corpus_mb, 1), "shapes": SHAPES,
        "tokenizer": {"start_s": round(_median(start), 1), "s_per_mb": tokenizer},
        "prepare": {"start_s": round(_median(prepare_start), 1),
                    "s_per_mb_per_worker": round(_median(prepare), 3)},
        "train": train, "export_s": export,
        "runs": runs,
    }


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def estimated_s(config_path: Path) -> float | None:
    """What the dry run estimates for every stage, in seconds (launcher.estimate, in-process)."""
    from launcher import estimate
    from launcher.launch import TrainOptions, plan_train
    from payload.training import runplan

    launch = plan_train(config_path, TrainOptions(local=True, num_workers=WORKERS, dry_run=True))
    speed = estimate.cpu_speed(launch, read_remote=False)
    plan = runplan.run_plan(launch.config, hardware=launch.fleet.hardware,
                            num_workers=len(launch.fleet.workers), cpu_speed=speed)
    return plan.cpu_total_s


def check_run(folder: Path, corpus: Path, engine: str, family: str) -> str:
    """The dry run's estimate next to what the run took."""
    config_path = run_config(folder, corpus, engine, family)
    os.environ["TPUCTL_HOME"] = str(folder / "home")
    estimate = estimated_s(config_path)
    dry = subprocess.run([sys.executable, "-m", "launcher.cli", "train", "-c", str(config_path),
                          "--local", "--workers", str(WORKERS), "--dry-run"], capture_output=True,
                         text=True, env=_env(folder / "home"), cwd=REPO, timeout=600)
    lines = dry.stdout.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith("  time:")), None)
    said = ["no estimate"] if at is None else [lines[at].strip()] + [
        line.strip() for line in lines[at + 1:] if line.startswith("    ")]
    run = measure_run(folder, corpus, engine, family)
    stages = ", ".join(f"{k} {v:.0f}s" for k, v in run["stages_s"].items())
    ratio = f"{run['wall_s'] / estimate:.2f}x the estimate" if estimate else "no estimate"
    return (f"{engine} {family}: took {run['wall_s']:.0f}s ({stages}), {ratio} of "
            f"{estimate or 0:.0f}s; the dry run said:\n  " + "\n  ".join(said))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.calibrate_cpu",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True, help="a text file of several MB")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--out", type=Path, default=TABLE)
    parser.add_argument("--check", action="store_true",
                        help="print the dry run's estimate beside each measured run instead")
    parser.add_argument("--from-runs", type=Path, metavar="LOG",
                        help="rebuild the table from the run lines an earlier calibration "
                        "printed (its output), without running anything")
    args = parser.parse_args(argv)
    corpus = args.corpus.resolve()
    corpus_mb = corpus.stat().st_size / 1e6
    previous = json.loads(args.out.read_text()) if args.out.exists() else None
    if args.from_runs:
        runs = [json.loads(line) for line in args.from_runs.read_text().splitlines()
                if line.startswith("{")]
        args.out.write_text(json.dumps(table_of(runs, None, corpus_mb, previous), indent=1) + "\n")
        print(f"wrote {args.out} from {len(runs)} runs")
        return
    work = Path(tempfile.mkdtemp(prefix="calibrate-"))
    try:
        runs = []
        for engine in args.engines.split(","):
            for family in args.families.split(","):
                folder = work / f"{engine}-{family}"
                folder.mkdir()
                if args.check:
                    print(check_run(folder, corpus, engine, family), flush=True)
                    continue
                runs.append(measure_run(folder, corpus, engine, family))
                print(json.dumps(runs[-1]), flush=True)
        if args.check:
            return
        folder = work / "unigram"
        folder.mkdir()
        unigram = time_tokenizer(folder, corpus, "unigram")
        table = table_of(runs, unigram, corpus_mb, previous)
        args.out.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {args.out}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

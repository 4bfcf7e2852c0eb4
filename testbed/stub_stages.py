"""A stand-in for `python -m payload STAGE`, for launcher tests: same arguments, tiny outputs.

    python stub_stages.py prepare --config run.yaml --worker-index 1 --num-workers 2

What it does wrong on purpose comes from `stub_stages.json` next to it:
{"fail": {"prepare": 1}} exits 3 in prepare on worker 1; {"raise": {"train": 1}} ends it with a
Python traceback there; {"print": {"train": ["line", ...]}} prints those lines first on every
worker; {"hang": {"train": 1}} then waits there until stopped; {"steps": {"train": 200}} makes
the train stage print that many steps, 0.1 s apart, and worker 0 a progress record
(payload.training.progress) for each; {"checkpoint_every": 10} makes worker 0 write
checkpoints/checkpoint (TensorFlow's index) every 10 steps, and `--resume` start from it.
{"report_env": ["NAME"]} makes every stage print its value of $NAME; {"ignore_term": ["train"]}
makes that stage ignore SIGTERM and start a child that ignores it too (the agent kills the stage
it started after its own wait; the child, a stage's helper process, lives on until the stop
command's SIGKILL to the job's group).
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import yaml

from payload.core import folders, ledger
from payload.data import shards as shard_format
from payload.training import progress


def _stub_manifest(workers: int):
    """The manifest of the stand-in shards (one of 10 bytes per worker, "x" * 10): what a later
    job's pre-flight reads before a train-only run."""
    import hashlib

    entries = [shard_format.ShardEntry(name=f"train/shard-{i:05d}-of-{workers:05d}.tfrecord",
                                 records=1, tokens=8, bytes=10,
                                 sha256=hashlib.sha256(b"x" * 10).hexdigest())
               for i in range(workers)]
    return shard_format.Manifest(
        format=shard_format.FORMAT, seq_len=8, record_len=8, dtype="uint16", family="gpt2",
        vocab_size=100, tokenizer_fingerprint="stand-in", data_fingerprint="stand-in",
        num_workers=workers, documents=workers, invalid_utf8_lines=0,
        splits={"train": shard_format.SplitSummary(shards=entries, records=workers,
                                             tokens=8 * workers),
                "validation": shard_format.SplitSummary()})


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("stage")
    parser.add_argument("--config", required=True)
    parser.add_argument("--worker-index", type=int, default=0)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--hardware", default="cpu")
    parser.add_argument("--stages", default="")
    args = parser.parse_args()
    behaviour_file = Path(__file__).with_suffix(".json")
    behaviour = json.loads(behaviour_file.read_text()) if behaviour_file.exists() else {}
    config = yaml.safe_load(Path(args.config).read_text())
    out = Path(config["output_dir"])
    me, n = args.worker_index, args.num_workers
    print(f"{args.stage} {me}/{n} on {os.uname().nodename} tf_config={os.environ.get('TF_CONFIG', '')}",
          flush=True)
    for line in behaviour.get("print", {}).get(args.stage, []):
        print(line, flush=True)
    if args.stage in behaviour.get("ignore_term", []):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        import subprocess  # an ignored signal stays ignored across exec

        subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
    for name in behaviour.get("report_env", []):
        print(f"{args.stage} sees {name}={os.environ.get(name, '(unset)')}", flush=True)
    if behaviour.get("hang", {}).get(args.stage) == me:
        time.sleep(3600)
    if behaviour.get("fail", {}).get(args.stage) == me:
        print(f"boom: {args.stage} cannot go on", flush=True)
        return 3
    if behaviour.get("raise", {}).get(args.stage) == me:
        raise RuntimeError(f"the stub's {args.stage} broke on worker {me}")
    if args.stage == "check":  # the launcher's pre-flight: it writes nothing
        return 0
    # Like every real stage, take output_dir first (payload.core.ownership.claim_output_dir).
    if not (out / ".tpuctl" / "owner").exists():
        _write(out / ".tpuctl" / "owner", "{}")
    if args.stage == "tokenizer":
        _write(out / "tokenizer" / "tokenizer.json", "{}")
    elif args.stage == "prepare":
        if not (out / "tokenizer" / "tokenizer.json").exists():
            print("no tokenizer", file=sys.stderr)
            return 1
        _write(out / "data" / "train" / f"shard-{me:05d}-of-{n:05d}.tfrecord", "x" * 10)
        if me == 0:  # a manifest of every worker's shard, as the real prepare's worker 0 writes
            _write(Path(shard_format.manifest_path(str(out))), _stub_manifest(n).to_json())
    elif args.stage == "train":
        shards = sorted((out / "data" / "train").glob("shard-*"))
        print(f"training on {len(shards)} shards", flush=True)
        every = behaviour.get("checkpoint_every")  # checkpoint as TensorFlow's index names it
        index = out / "checkpoints" / "checkpoint"
        start = 0
        if args.resume and index.exists():
            start = int(index.read_text().split("ckpt-")[1].split('"')[0])
            print(f"resuming from step {start}", flush=True)
        total = behaviour.get("steps", {}).get("train", 3)
        say = progress.emit if me == 0 else (lambda kind, fields: None)
        # The chief's events in the run's ledger, as the real train stage notes them.
        pen = ledger.Writer(str(out) if me == 0 else None, source=ledger.CHIEF,
                            job=os.environ.get(ledger.JOB_ENV))
        pen.note("devices_ready")
        if args.resume and start:
            pen.note("restore_start")
            pen.note("restore_end", step=start)
        say("start", {"step": start, "steps": total})
        pen.note("compile_start", step=start)
        for step in range(start + 1, total + 1):
            print(f"step {step} loss {1.0 / step:.3f}", flush=True)
            say("train", {"step": step, "steps": total, "loss": 1.0 / step,
                          "learning_rate": 1e-3, "tokens_per_s": 1000.0, "elapsed_s": step / 10,
                          "eta_s": (total - step) / 10})
            if step == start + 1:
                pen.note("compile_end", step=step)
            pen.note("step", step=step)
            if every and step % every == 0 and me == 0:
                pen.note("checkpoint_save_start", step=step)
                _write(index, f'model_checkpoint_path: "ckpt-{step}"\n')
                pen.note("checkpoint_save_end", step=step)
            time.sleep(0.1)
        pen.note("train_end", step=total)
        say("eval", {"step": total, "loss": 0.5, "accuracy": 0.25})
        say("final", {"family": "gpt2", "step": total, "eval": {"step": total, "loss": 0.5,
                                                               "accuracy": 0.25},
                      "stopped": None})
        _write(out / "checkpoints" / f"ckpt-{me}", "w")
        if me == 0:
            _write(out / "metrics.json", json.dumps({"shards": len(shards)}))
            # The last step's checkpoint as TensorFlow's CheckpointManager leaves it (its files
            # and the index naming it) in a folder the train stage marked whole: what the
            # launcher's pre-flight of a later export-only job looks for.
            for name in (f"ckpt-{total}.index", f"ckpt-{total}.data-00000-of-00001"):
                _write(out / "checkpoints" / name, "w")
            _write(index, f'model_checkpoint_path: "ckpt-{total}"\n')
            folders.mark_complete(str(out / "checkpoints"), {"stage": "train"})
    elif args.stage == "export":
        _write(out / "model" / "config.json", "{}")
        folders.mark_complete(str(out / "model"), {"stage": "export (stand-in)"})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The real pipeline stages with `output_dir: gs://...` and a gs:// corpus, inside the Cloud
Storage sandbox (TensorFlow's own gs:// for checkpoints and events, google-cloud-storage for the
rest), against the same run on a local disk: the same shards, the same training, the same model.

    tokenizer -> prepare (2 workers) -> train 4 steps -> train --resume to 6 steps -> export
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.support.paths import REPO
from tests.support.runners import payload_env

pytest.importorskip("tensorflow")
pytestmark = pytest.mark.slow  # ~90 s: two pipelines, five TensorFlow processes each

BUCKET = "pipeline"
GS_OUT = f"gs://{BUCKET}/run"
DIGEST = re.compile(r"finished at step (\d+); weights sha256 (\w+)")


def _config(output_dir: str, corpus: str, steps: int) -> dict:
    return {
        "name": "gcs",
        "output_dir": output_dir,
        "cluster": {"provider": "local", "workers": 2},
        "data": {"corpus": corpus, "seq_len": 32, "validation_fraction": 0.1,
                 "records_per_shard": 200},
        "tokenizer": {"kind": "bpe", "vocab_size": 400},
        "model": {"family": "gpt2", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                  "intermediate_size": 64},
        "train": {"steps": steps, "batch_size": 8, "learning_rate": 1e-3, "checkpoint_every": 2,
                  "eval_every": 2, "eval_batches": 1, "keep_checkpoints": 2},
    }


class Pipeline:
    """One run of every stage, through `launch` (a plain subprocess or one in the sandbox)."""

    def __init__(self, name: str, folder: Path, output_dir: str, corpus: str, launch):
        self.name, self.folder, self.output_dir = name, folder, output_dir
        self.corpus, self.launch = corpus, launch
        self.config = folder / f"{name}.yaml"
        self.times: dict[str, float] = {}
        self.stdout: dict[str, str] = {}
        self.error: BaseException | None = None

    def stage(self, label: str, *args: str, parallel: int = 1) -> None:
        began = time.monotonic()
        argvs = [[sys.executable, "-m", "payload", *args, "--config", str(self.config)]]
        if parallel > 1:
            argvs = [[*argvs[0], "--worker-index", str(i), "--num-workers", str(parallel)]
                     for i in range(parallel)]
        procs = [self.launch(argv) for argv in argvs]
        outs = [p.communicate(timeout=300) for p in procs]
        for proc, (out, err) in zip(procs, outs, strict=True):
            if proc.returncode != 0:
                raise AssertionError(f"{self.name}: {label} failed ({proc.returncode}):\n"
                                     f"{out[-2000:]}\n{err[-4000:]}")
        self.stdout[label] = "".join(out for out, _ in outs)
        self.times[label] = time.monotonic() - began

    def run(self) -> None:
        try:
            self.config.write_text(yaml.safe_dump(_config(self.output_dir, self.corpus, 4)))
            self.stage("tokenizer", "tokenizer")
            self.stage("prepare", "prepare", parallel=2)
            # A rerun finds its work done, from what the first run left (stamp, parts).
            self.stage("tokenizer again", "tokenizer")
            self.stage("prepare again", "prepare", parallel=2)
            self.stage("train", "train")
            self.config.write_text(yaml.safe_dump(_config(self.output_dir, self.corpus, 6)))
            self.stage("resume", "train", "--resume")
            self.stage("export", "export")
        except BaseException as exc:
            self.error = exc


@pytest.fixture(scope="module")
def runs(gcs_sandbox, tmp_path_factory, documents):
    """(gs:// pipeline, local pipeline), both run to the end, side by side."""
    sandbox = gcs_sandbox
    sandbox.make_bucket(BUCKET)
    work = tmp_path_factory.mktemp("pipeline")
    lines = [" ".join(d.split()) for d in documents[:400]]
    texts = ["\n".join(lines[:200]) + "\n", "\n".join(lines[200:]) + "\n"]
    (work / "corpus").mkdir()
    for i, text in enumerate(texts):
        (work / "corpus" / f"part-{i}.txt").write_text(text)
        sandbox.write_bytes(f"gs://{BUCKET}/corpus/part-{i}.txt", text.encode())
    env = payload_env()

    def in_sandbox(argv):
        return sandbox.popen(argv, env=env, cwd=str(REPO), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)

    def local(argv):
        return subprocess.Popen(argv, env=env, cwd=str(REPO), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    gs = Pipeline("gs", work, GS_OUT, f"gs://{BUCKET}/corpus/*.txt", in_sandbox)
    disk = Pipeline("local", work, str(work / "local"), str(work / "corpus" / "*.txt"), local)
    threads = [threading.Thread(target=p.run) for p in (gs, disk)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in (gs, disk):
        if p.error:
            raise p.error
        print(f"{p.name}: " + ", ".join(f"{k} {v:.1f}s" for k, v in p.times.items()))
    return gs, disk


def _gs_files(sandbox, prefix: str) -> dict[str, str]:
    """relative name -> sha256 of every object under a gs:// prefix."""
    return {name[len(prefix) + 1:]: hashlib.sha256(sandbox.read_bytes(name)).hexdigest()
            for name in sandbox.list(prefix + "/")}


def _local_files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_same_tokenizer_and_shards(runs, gcs_sandbox):
    """tokenizer and 2-worker prepare on gs:// write what they write on a local disk."""
    _, disk = runs
    local_out = Path(disk.output_dir)
    gs_manifest = json.loads(gcs_sandbox.read_bytes(f"{GS_OUT}/data/manifest.json"))
    local_manifest = json.loads((local_out / "data" / "manifest.json").read_text())
    for manifest in (gs_manifest, local_manifest):
        manifest.pop("data_fingerprint")  # it names the corpus files, which differ
    assert gs_manifest == local_manifest  # shard names, record counts, sha256, tokenizer
    for p in runs:
        assert "tokenizer already trained with these settings" in p.stdout["tokenizer again"]
        assert p.stdout["prepare again"].count("already prepared its share") == 2
    assert gs_manifest["num_workers"] == 2 and gs_manifest["splits"]["train"]["records"] > 0
    assert len(gs_manifest["splits"]["train"]["shards"]) >= 4
    gs_data = _gs_files(gcs_sandbox, f"{GS_OUT}/data")
    local_data = _local_files(local_out / "data")
    shards = {k: v for k, v in local_data.items() if k.endswith(".tfrecord")}
    assert shards and {k: gs_data.get(k) for k in shards} == shards
    assert set(gs_data) == set(local_data)  # receipts and parts too, no temporaries left
    gs_tok = _gs_files(gcs_sandbox, f"{GS_OUT}/tokenizer")
    local_tok = _local_files(local_out / "tokenizer")
    assert set(gs_tok) == set(local_tok)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert gs_tok[name] == local_tok[name], name  # (training.json names the corpus files)


def test_same_training_checkpoints_and_metrics(runs, gcs_sandbox):
    """train, then train --resume from gs:// checkpoints, end where the local run does."""
    gs, disk = runs
    local_out = Path(disk.output_dir)
    assert f"resuming from {GS_OUT}/checkpoints/ckpt-4 at step 4 of 6" in gs.stdout["resume"]
    # (Not the same weights as the local run: training does not seed its initial weights.)
    for p in runs:
        steps = [step for step, _ in DIGEST.findall(p.stdout["train"] + p.stdout["resume"])]
        assert steps == ["4", "6"], p.name
    names = sorted(n.rsplit("/", 1)[1] for n in gcs_sandbox.list(f"{GS_OUT}/checkpoints/"))
    local_names = sorted(p.name for p in (local_out / "checkpoints").iterdir())
    assert names == local_names  # max_to_keep=2 deleted ckpt-2 on gs:// as well
    assert "ckpt-4.index" in names and "ckpt-6.index" in names and "ckpt-2.index" not in names
    gs_metrics = json.loads(gcs_sandbox.read_bytes(f"{GS_OUT}/metrics.json"))
    local_metrics = json.loads((local_out / "metrics.json").read_text())
    assert gs_metrics["step"] == local_metrics["step"] == 6
    assert [e["step"] for e in gs_metrics["evals"]] == [e["step"] for e in local_metrics["evals"]]
    events = gcs_sandbox.list(f"{GS_OUT}/logs/tensorboard/events.out.tfevents.")
    assert len(events) == 2  # one per train process


def test_exported_model_loads_from_a_copy(runs, gcs_sandbox, tmp_path):
    """model/ copied down from gs:// loads with transformers and holds the trained weights."""
    import numpy as np
    from transformers import AutoTokenizer, TFAutoModelForCausalLM

    gs, disk = runs
    local_model = Path(disk.output_dir) / "model"
    copy = tmp_path / "model"
    copy.mkdir()
    for name in gcs_sandbox.list(f"{GS_OUT}/model/"):
        (copy / name.rsplit("/", 1)[1]).write_bytes(gcs_sandbox.read_bytes(name))
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in local_model.iterdir())
    for name in ("config.json", "tokenizer.json"):
        assert (copy / name).read_bytes() == (local_model / name).read_bytes(), name
    note = json.loads((copy / "tpuctl_export.json").read_text())
    assert note["checkpoint"] == "checkpoints/ckpt-6"  # relative: no bucket in model/
    # The copy holds the weights the resumed training on gs:// finished with.
    from payload.engines.tensorflow.export import pytorch_state_dict
    from payload.training.trainer import weights_digest

    model = TFAutoModelForCausalLM.from_pretrained(str(copy), use_safetensors=False)
    assert weights_digest(pytorch_state_dict(model)) == DIGEST.findall(gs.stdout["resume"])[-1][1]
    tokenizer = AutoTokenizer.from_pretrained(copy)
    ids = np.array([tokenizer("The interpreter reads the module.")["input_ids"]])
    logits = model(ids).logits.numpy()
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size) and np.isfinite(logits).all()


def test_killed_training_resumes_from_gs_checkpoints(runs, gcs_sandbox):
    """Training on gs:// killed (SIGKILL) just after a checkpoint lands: --resume continues from
    the newest checkpoint the index names, losing at most checkpoint_every steps. Runs last:
    it goes on from the gs:// run's step 6."""
    gs, _ = runs
    index = f"{GS_OUT}/checkpoints/checkpoint"

    def newest() -> int:
        text = gcs_sandbox.read_bytes(index).decode()
        return int(re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', text, re.M).group(1))

    gs.config.write_text(yaml.safe_dump(_config(GS_OUT, gs.corpus, 400)))
    proc = gs.launch([sys.executable, "-m", "payload", "train", "--resume",
                      "--config", str(gs.config)])
    try:
        deadline = time.monotonic() + 240
        while newest() < 10:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint past step 8 in time"
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.communicate()
    killed_at = newest()
    assert 10 <= killed_at < 400
    gs.config.write_text(yaml.safe_dump(_config(GS_OUT, gs.corpus, killed_at + 2)))
    gs.stage("after kill", "train", "--resume")
    out = gs.stdout["after kill"]
    assert f"resuming from {GS_OUT}/checkpoints/ckpt-{killed_at} at step {killed_at}" in out
    assert DIGEST.findall(out)[-1][0] == str(killed_at + 2)
    assert json.loads(gcs_sandbox.read_bytes(f"{GS_OUT}/metrics.json"))["step"] == killed_at + 2


def test_the_launcher_runs_the_whole_pipeline_on_gs(gcs_sandbox, tmp_path):
    """`tpuctl train --local --workers 2` with output_dir and corpus on gs://, inside the
    sandbox: the launcher's gs:// paths too (the shared-output check, the run lock, the
    workers' barriers and heartbeats, the log copies), then `--resume` and `--download`."""
    bucket = "launched"
    gcs_sandbox.make_bucket(bucket)
    text = "".join(f"document {i} about tpus, shards and checkpoints on cloud storage\n"
                   for i in range(400))
    gcs_sandbox.write_bytes(f"gs://{bucket}/texts/corpus.txt", text.encode())
    raw = _config(f"gs://{bucket}/run", f"gs://{bucket}/texts/corpus.txt", steps=4)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    env = {**payload_env(), "TPUCTL_HOME": str(tmp_path / "home")}

    def tpuctl(*args: str) -> subprocess.CompletedProcess:
        return gcs_sandbox.run([sys.executable, "-m", "launcher.cli", *args, "-c", str(config)],
                               env=env, cwd=str(REPO), timeout=900)

    first = tpuctl("train", "--local", "--workers", "2")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "finished on 2 workers" in first.stdout
    objects = {p.removeprefix(f"gs://{bucket}/") for p in gcs_sandbox.list(f"gs://{bucket}/run/")}
    for expected in ("run/data/manifest.json", "run/metrics.json", "run/logs/worker-0.log",
                     "run/logs/worker-1.log", "run/model/config.json",
                     "run/model/.tpuctl-complete", "run/checkpoints/checkpoint"):
        assert expected in objects, sorted(objects)[:50]
    assert not any(name.startswith("run/.tpuctl/run.lock") for name in objects)  # released
    raw["train"]["steps"] = 6
    config.write_text(yaml.safe_dump(raw))
    target = tmp_path / "model"
    resumed = tpuctl("train", "--local", "--workers", "2", "--resume", "--stages", "train,export",
                     "--download", str(target))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout
    metrics = json.loads(gcs_sandbox.read_bytes(f"gs://{bucket}/run/metrics.json"))
    assert metrics["final"]["step"] == 6
    assert (target / "config.json").exists() and (target / "model.safetensors").exists()


def test_the_jax_engine_trains_resumes_and_exports_on_gs(gcs_sandbox, tmp_path):
    """Issue 19 on gs://: `tpuctl train --local --workers 2` with `train.engine: jax` inside the
    sandbox: two JAX processes write Orbax checkpoints through tensorstore's GCS driver, a
    `--resume` continues from the gs:// step folder, and export reads it back into model/."""
    bucket = "jaxrun"
    gcs_sandbox.make_bucket(bucket)
    text = "".join(f"sentence {i} about {['rivers', 'stones', 'light'][i % 3]} and tpus "
                   f"{i % 13}\n" for i in range(800))
    gcs_sandbox.write_bytes(f"gs://{bucket}/texts/corpus.txt", text.encode())
    out = f"gs://{bucket}/run"
    raw = _config(out, f"gs://{bucket}/texts/corpus.txt", steps=20)
    raw["train"].update(engine="jax", learning_rate=5e-3, checkpoint_every=10, eval_every=10)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    env = {**payload_env(), "TPUCTL_HOME": str(tmp_path / "home")}

    def tpuctl(*args: str) -> subprocess.CompletedProcess:
        return gcs_sandbox.run([sys.executable, "-m", "launcher.cli", *args, "-c", str(config)],
                               env=env, cwd=str(REPO), timeout=900)

    first = tpuctl("train", "--local", "--workers", "2", "--stages", "tokenizer,prepare,train")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    steps = {n.rsplit("/", 2)[1] for n in gcs_sandbox.list(f"{out}/checkpoints/")
             if n.endswith("/commit_success.txt") and n.count("/") == 6}
    assert steps == {"10", "20"}, steps
    raw["train"]["steps"] = 30
    config.write_text(yaml.safe_dump(raw))
    resumed = tpuctl("train", "--local", "--workers", "2", "--resume", "--stages",
                     "train,export")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resuming from {out}/checkpoints" in resumed.stdout
    metrics = json.loads(gcs_sandbox.read_bytes(f"{out}/metrics.json"))
    assert metrics["engine"] == "jax" and metrics["final"]["step"] == 30
    evals = metrics["evals"]
    assert [e["step"] for e in evals] == [0, 10, 20, 30]
    assert evals[-1]["loss"] < 0.85 * evals[0]["loss"], evals
    note = json.loads(gcs_sandbox.read_bytes(f"{out}/model/tpuctl_export.json"))
    assert note["checkpoint"] == "checkpoints/30"  # relative: no bucket in model/
    model = {n.rsplit("/", 1)[1] for n in gcs_sandbox.list(f"{out}/model/")}
    assert {"config.json", "model.safetensors", "tokenizer.json", ".tpuctl-complete"} <= model

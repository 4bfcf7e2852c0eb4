"""Crash consistency (issue 8): prepare, train and export are SIGKILLed at seeded points, rerun,
and must end with exactly the outputs of an uninterrupted run, touching nothing outside
output_dir.

The kill points are the stage's own changes to storage: `TPUCTL_TEST_KILL_AT=N` makes
payload.core.storage SIGKILL the process just before its N-th write, rename or removal (and before
each TensorFlow checkpoint save). An uninterrupted reference run with `TPUCTL_TEST_WRITE_LOG`
counts them; a seeded sample of 1..count is killed. The rerun is what a user would type: the
same command (train: `--resume`, or a fresh start when it says there is no checkpoint yet).

What "exactly" means per stage:
- prepare: every file under data/ (shards, receipts, parts, manifest) byte-identical, and the
  same file names everywhere in output_dir (config.yaml and .tpuctl/ hold paths and hosts).
- train: the final step in the checkpoint index and metrics.json, the same checkpoint files
  (no leftovers), the same evaluation steps, and the same values of every checkpointed
  variable (weights and optimizer state; a resumed run sees the batches an uninterrupted one
  would). logs/tensorboard is left out: a resumed run adds an events file, which TensorBoard
  merges. The same for the JAX engine, whose checkpoints are Orbax step folders (the same
  folders and arrays; Orbax names its data files by content hashes and stamps its metadata).
- export: while killed, model/ is the old model or the new one (never neither); after the
  rerun, the same files with byte-identical weights as the uninterrupted export, and it loads
  with transformers.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.configs import base_config
from tests.support.runners import payload_env

pytestmark = pytest.mark.slow

SEED = 20240508
POINTS = {"prepare": 12, "train": 5, "export": 6, "jax-train": 5}
TRAIN = {"steps": 4, "batch_size": 8, "learning_rate": 1e-3, "checkpoint_every": 2,
         "eval_every": 2, "eval_batches": 1}
# Paths and hosts differ between runs; everything else must match.
VARYING = {"config.yaml", ".tpuctl/owner"}


class World:
    """A tmp folder with the corpus, configs, TMPDIR, TPUCTL_HOME (where the stages keep their
    temporary files) and every run's output_dir under it."""

    def __init__(self, root: Path, documents: list[str]):
        self.root = root
        self.tmp = root / "tmp"
        self.tmp.mkdir()
        corpus = root / "corpus" / "texts.txt"
        corpus.parent.mkdir()
        corpus.write_text("\n".join(" ".join(d.split()) for d in documents[:600]) + "\n")
        self.corpus = corpus
        (root / "configs").mkdir()
        (root / "runs").mkdir()
        self.changes: dict[str, int] = {}

    def config(self, name: str) -> Path:
        """The run's config; a run whose name starts with `jax` trains on the JAX engine."""
        engine = "jax" if name.startswith("jax") else "tensorflow"
        raw = base_config(self.root / "runs" / name, self.corpus,
                          data={"records_per_shard": 60},
                          model={"family": "gpt2", "hidden_size": 32, "num_layers": 1,
                                 "num_heads": 2, "intermediate_size": 64, "dropout": 0.0},
                          train={**TRAIN, "engine": engine})
        path = self.root / "configs" / f"{name}.yaml"
        path.write_text(yaml.safe_dump(raw))
        return path

    def out(self, name: str) -> Path:
        return self.root / "runs" / name

    def run(self, stage: str, name: str, *flags: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "payload", stage, "--config", str(self.config(name)), *flags],
            env=payload_env(TMPDIR=str(self.tmp), TPUCTL_HOME=str(self.root / "home"), **env),
            capture_output=True, text=True,
            timeout=300)

    def ok(self, stage: str, name: str, *flags: str, **env: str) -> subprocess.CompletedProcess:
        proc = self.run(stage, name, *flags, **env)
        assert proc.returncode == 0, f"{stage} {name}: {proc.stderr[-3000:]}"
        return proc

    def copy(self, source: str, name: str) -> Path:
        target = self.out(name)
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(self.out(source), target, symlinks=True)
        self.config(name)
        return target

    def count_changes(self, stage: str, name: str, *flags: str) -> tuple[int, str]:
        log = self.root / f"{name}.changes"
        proc = self.ok(stage, name, *flags, TPUCTL_TEST_WRITE_LOG=str(log))
        count = len(log.read_text().splitlines())
        log.unlink()
        return count, proc.stdout

    def outside(self, name: str) -> dict[str, str]:
        """Every file and folder under the tmp folder except this run's output_dir."""
        skip = self.out(name)
        found = {}
        for path in sorted(self.root.rglob("*")):
            if path == skip or skip in path.parents:
                continue
            found[str(path.relative_to(self.root))] = (
                hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir")
        return found


def tree(folder: Path, out: Path | None = None) -> dict[str, str]:
    """File -> sha256; the output_dir's own path (recorded in a few files) reads as OUT."""
    def digest(path: Path) -> str:
        body = path.read_bytes().replace(str(out or folder).encode(), b"OUT")
        return hashlib.sha256(body).hexdigest()

    return {str(p.relative_to(folder)): digest(p) for p in sorted(folder.rglob("*"))
            if p.is_file()}


def points(stage: str, count: int) -> list[int]:
    rng = random.Random(f"{SEED}-{stage}")
    return sorted(rng.sample(range(1, count + 1), min(POINTS[stage], count)))


def kill(world: World, stage: str, name: str, point: int, *flags: str) -> None:
    proc = world.run(stage, name, *flags, TPUCTL_TEST_KILL_AT=str(point))
    assert proc.returncode == -9, (f"{stage} at change {point} was not killed "
                                   f"(exit {proc.returncode}): {proc.stderr[-2000:]}")


def weights(log: str) -> str:
    found = re.findall(r"finished at step (\d+); weights sha256 (\w+)", log)
    return found[-1][1] if found else ""


@pytest.fixture(scope="module")
def world(tmp_path_factory, documents):
    """Uninterrupted reference runs of every stage, and the states each killed stage starts
    from: `tok` (tokenizer done), `prep` (shards done), `trained` (checkpoints done) and
    `exported-old` (the model of step 2 in model/, to be replaced by step 4's)."""
    started = time.monotonic()
    w = World(tmp_path_factory.mktemp("crash"), documents)
    w.ok("tokenizer", "tok")
    w.copy("tok", "prep")
    w.changes["prepare"], _ = w.count_changes("prepare", "prep")
    w.copy("prep", "trained")
    w.changes["train"], log = w.count_changes("train", "trained")
    w.trained_weights = weights(log)
    # The old model: export from a copy whose checkpoint index points at step 2.
    w.copy("trained", "at-step-2")
    index = w.out("at-step-2") / "checkpoints" / "checkpoint"
    index.write_text(index.read_text().replace('model_checkpoint_path: "ckpt-4"',
                                               'model_checkpoint_path: "ckpt-2"'))
    w.ok("export", "at-step-2")
    w.copy("trained", "exported-old")
    shutil.copytree(w.out("at-step-2") / "model", w.out("exported-old") / "model")
    w.copy("exported-old", "exported")  # the uninterrupted replacement of the old model
    w.changes["export"], _ = w.count_changes("export", "exported")
    print(f"references: {time.monotonic() - started:.0f}s")
    return w


def test_prepare_killed_at_seeded_points_reruns_to_the_same_shards(world):
    reference = world.out("prep")
    wanted = {k: v for k, v in tree(reference).items() if k.startswith("data/")}
    assert len([k for k in wanted if k.endswith(".tfrecord")]) >= 20
    chosen = points("prepare", world.changes["prepare"])
    for point in chosen:
        out = world.copy("tok", "victim")
        before = world.outside("victim")
        kill(world, "prepare", "victim", point)
        world.ok("prepare", "victim")
        got = tree(out)
        assert {k: v for k, v in got.items() if k.startswith("data/")} == wanted, point
        assert set(got) == set(tree(reference)), (point, set(got) ^ set(tree(reference)))
        assert world.outside("victim") == before, point
    print(f"prepare: killed at {chosen} of {world.changes['prepare']} changes")


def _variables(out: Path) -> dict:
    """Every variable of the newest checkpoint (the save counter aside: it counts saves)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(out / "checkpoints"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if not name.startswith("save_counter") and name != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def _final_step(out: Path) -> tuple[int, int]:
    index = (out / "checkpoints" / "checkpoint").read_text()
    latest = int(re.search(r'model_checkpoint_path: "ckpt-(\d+)"', index).group(1))
    return latest, json.loads((out / "metrics.json").read_text())["final"]["step"]


def test_train_killed_at_seeded_points_reruns_to_the_final_step(world):
    reference = world.out("trained")
    ckpt_files = set(tree(reference / "checkpoints"))
    evals = [e["step"] for e in json.loads((reference / "metrics.json").read_text())["evals"]]
    assert _final_step(reference) == (4, 4)
    pytest.importorskip("tensorflow")
    import numpy as np

    wanted = _variables(reference)
    chosen = points("train", world.changes["train"])
    for point in chosen:
        out = world.copy("prep", "victim")
        before = world.outside("victim")
        kill(world, "train", "victim", point)
        proc = world.run("train", "victim", "--resume")
        resumed = proc.returncode == 0
        if not resumed:  # killed before its first checkpoint: the user starts it again
            assert proc.returncode == 2 and "no checkpoint" in proc.stderr, (point, proc.stderr)
            proc = world.ok("train", "victim")
            assert weights(proc.stdout) == world.trained_weights, point
        assert _final_step(out) == (4, 4), point
        got = _variables(out)
        assert sorted(got) == sorted(wanted), point
        for name, value in wanted.items():
            np.testing.assert_array_equal(got[name], value, err_msg=f"{name} at {point}")
        assert set(tree(out / "checkpoints")) == ckpt_files, point
        assert [e["step"] for e in json.loads((out / "metrics.json").read_text())["evals"]] \
            == evals, point
        assert world.outside("victim") == before, point
    print(f"train: killed at {chosen} of {world.changes['train']} changes")


def _orbax_variables(out: Path) -> dict:
    """Every array of the newest Orbax step folder (weights, optimizer state, step count)."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    newest = max(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    tree = ocp.StandardCheckpointer().restore(out / "checkpoints" / str(newest) / "default")
    return {jax.tree_util.keystr(k): np.asarray(v)
            for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_jax_train_killed_at_seeded_points_reruns_to_the_final_step(world):
    pytest.importorskip("orbax.checkpoint")
    import numpy as np

    from payload.core.engines import engine_spec

    world.copy("prep", "jax-trained")
    changes, log = world.count_changes("train", "jax-trained")
    reference = world.out("jax-trained")
    reference_weights = weights(log)
    folders = sorted(p.name for p in (reference / "checkpoints").iterdir())
    evals = [e["step"] for e in json.loads((reference / "metrics.json").read_text())["evals"]]
    assert engine_spec("jax").newest_step(str(reference)) == 4 and "4" in folders
    wanted = _orbax_variables(reference)
    chosen = points("jax-train", changes)
    for point in chosen:
        out = world.copy("prep", "jax-victim")
        before = world.outside("jax-victim")
        kill(world, "train", "jax-victim", point)
        proc = world.run("train", "jax-victim", "--resume")
        if proc.returncode != 0:  # killed before its first checkpoint: the user starts it again
            assert proc.returncode == 2 and "no checkpoint" in proc.stderr, (point, proc.stderr)
            proc = world.ok("train", "jax-victim")
            assert weights(proc.stdout) == reference_weights, point
        assert engine_spec("jax").newest_step(str(out)) == 4, point
        assert json.loads((out / "metrics.json").read_text())["final"]["step"] == 4, point
        assert sorted(p.name for p in (out / "checkpoints").iterdir()) == folders, point
        got = _orbax_variables(out)
        assert sorted(got) == sorted(wanted), point
        for name, value in wanted.items():
            np.testing.assert_array_equal(got[name], value, err_msg=f"{name} at {point}")
        assert [e["step"] for e in json.loads((out / "metrics.json").read_text())["evals"]] \
            == evals, point
        assert world.outside("jax-victim") == before, point
    print(f"jax train: killed at {chosen} of {changes} changes")


def test_export_killed_at_seeded_points_leaves_a_model_and_reruns_to_the_same(world):
    from payload.core import folders, layout

    new = world.out("exported") / "model"
    old = world.out("exported-old") / "model"
    assert (new / "model.safetensors").read_bytes() != (old / "model.safetensors").read_bytes()
    wanted = {k: v for k, v in tree(new, new.parent).items() if k != layout.COMPLETE}
    chosen = points("export", world.changes["export"])
    for point in chosen:
        out = world.copy("exported-old", "victim")
        before = world.outside("victim")
        kill(world, "export", "victim", point)
        model = out / "model"
        assert folders.is_complete(str(model)), point  # the old or the new, never neither
        assert (model / "model.safetensors").read_bytes() in (
            (old / "model.safetensors").read_bytes(), (new / "model.safetensors").read_bytes())
        world.ok("export", "victim")
        assert {k: v for k, v in tree(model, out).items() if k != layout.COMPLETE} == wanted, \
            point
        assert sorted(p.name for p in out.iterdir() if "model" in p.name) == ["model"], point
        assert world.outside("victim") == before, point
    print(f"export: killed at {chosen} of {world.changes['export']} changes")
    pytest.importorskip("tensorflow")
    import numpy as np
    import transformers

    loaded = transformers.TFAutoModelForCausalLM.from_pretrained(str(out / "model"),
                                                                 use_safetensors=False)
    reference = transformers.TFAutoModelForCausalLM.from_pretrained(str(new),
                                                                    use_safetensors=False)
    for a, b in zip(loaded.weights, reference.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())

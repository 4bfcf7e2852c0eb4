"""The real payload stages through the launcher: SSH workers and local workers, same outputs."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from tests.support.configs import tiny_config

runner = CliRunner()


def _outputs(out: Path) -> dict:
    manifest = json.loads((out / "data/manifest.json").read_text())
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*")
                   if p.is_file() and p.parts[len(out.parts)] in ("data", "tokenizer"))
    return {"files": files, "manifest": manifest}


def test_real_stages_on_ssh_and_local_workers_match(fleet, tmp_path, tpuctl_home):
    shared = fleet.shared / "real-stages"
    corpus = shared / "corpus.txt"
    shared.mkdir()
    corpus.write_text("".join(f"document {i} says {' '.join(['words'] * (i % 7 + 3))} here\n"
                              for i in range(600)))
    ssh_config = tiny_config(shared, name="real", corpus=str(corpus),
                             output_dir=str(shared / "out"), cluster={
                                 "provider": "ssh", "hosts": fleet.hosts, "user": "root",
                                 "identity_file": fleet.identity_file,
                                 "known_hosts": fleet.known_hosts, "port": fleet.port,
                                 "python": sys.executable})
    over_ssh = runner.invoke(app, ["train", "-c", str(ssh_config), "--stages",
                                   "tokenizer,prepare"])
    assert over_ssh.exit_code == 0, over_ssh.output
    assert "worker-2 | " in over_ssh.output and "prepare" in over_ssh.output
    local_config = tiny_config(tmp_path / "local", name="real", corpus=str(corpus),
                               output_dir=str(tmp_path / "local-out"),
                               cluster={"provider": "local", "workers": 3})
    locally = runner.invoke(app, ["train", "-c", str(local_config), "--local", "--stages",
                                  "tokenizer,prepare"])
    assert locally.exit_code == 0, locally.output
    remote, local = _outputs(shared / "out"), _outputs(tmp_path / "local-out")
    assert remote["files"] == local["files"]
    assert len([f for f in remote["files"] if f.startswith("data/train/")]) >= 3
    assert remote["manifest"] == local["manifest"]
    for i in range(3):
        assert (shared / f"out/logs/worker-{i}.log").exists()
        assert (tmp_path / f"local-out/logs/worker-{i}.log").exists()


needs_training = pytest.mark.skipif(
    importlib.util.find_spec("payload.stages.train") is None
    or importlib.util.find_spec("payload.stages.export") is None,
    reason="the train and export stages are not in this checkout yet")


def _model_config(tmp_path, **cluster):
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        corpus.write_text("".join(f"sentence {i} about {' '.join(['rivers', 'stones'][i % 2:])} "
                                  f"and light {i % 13}\n" for i in range(800)))
    return corpus


@needs_training
def test_full_pipeline_on_two_ssh_workers(fleet, tpuctl_home):
    shared = fleet.shared / "full-pipeline"
    shared.mkdir()
    corpus = _model_config(shared)
    config = tiny_config(shared, name="full", corpus=str(corpus), output_dir=str(shared / "out"),
                         model={"family": "roberta"}, cluster={
                             "provider": "ssh", "hosts": fleet.hosts[:2], "user": "root",
                             "identity_file": fleet.identity_file,
                             "known_hosts": fleet.known_hosts, "port": fleet.port,
                             "python": sys.executable})
    result = runner.invoke(app, ["train", "-c", str(config)])
    assert result.exit_code == 0, result.output
    out = shared / "out"
    assert (out / "model/config.json").exists() and (out / "metrics.json").exists()
    # Both workers trained in sync on their own hosts and ended with the same weights.
    hashes = re.findall(r"worker-\d \| .*finished at step \d+; weights sha256 (\w+)", result.output)
    assert len(hashes) == 2 and hashes[0] == hashes[1], result.output


@needs_training
def test_full_pipeline_on_two_local_workers(tmp_path, tpuctl_home):
    corpus = _model_config(tmp_path)
    config = tiny_config(tmp_path / "run", name="full", corpus=str(corpus),
                         output_dir=str(tmp_path / "out"), model={"family": "roberta"},
                         cluster={"provider": "local", "workers": 2})
    result = runner.invoke(app, ["train", "-c", str(config), "--local"])
    assert result.exit_code == 0, result.output
    for part in ("tokenizer/tokenizer.json", "data/manifest.json", "model/config.json",
                 "metrics.json", "logs/worker-0.log", "logs/worker-1.log"):
        assert (tmp_path / "out" / part).exists(), part
    # Issue 37: where the run's wall time went, from its ledger, as one JSON object.
    assert "goodput: " in result.output  # the summary at the end of the run
    report = runner.invoke(app, ["goodput", "-c", str(config), "--format", "json"])
    assert report.exit_code == 0, report.output
    found = json.loads(report.output)
    buckets = found["buckets"]
    assert sum(b["seconds"] for b in buckets.values()) == pytest.approx(found["wall_s"], rel=0.01)
    for name in ("compile", "checkpoint_save", "productive", "environment_setup",
                 "data_preparation", "export"):
        assert buckets[name]["seconds"] > 0, (name, buckets)
    assert all(b["dollars"] is None for b in buckets.values())  # local workers bill nothing
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["goodput"]["seconds"]["productive"] > 0 and metrics["goodput"]["goodput"] > 0



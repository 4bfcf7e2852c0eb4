"""The real payload stages through the launcher: SSH workers and local workers, same outputs."""

import json
import sys
from pathlib import Path

from typer.testing import CliRunner

from launcher.cli import app
from tests.helpers import tiny_config

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

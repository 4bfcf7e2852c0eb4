"""Publishing to the Hub: the token check before anything starts, the publish step in the plan,
the token's way to worker 0 (in memory only), and a whole local run pushed to a stand-in Hub
(testbed/fakes/hub.py) by the real huggingface_hub client: repository creation, preupload, the
LFS batch, basic and multipart uploads, the commit; Xet never negotiated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher.executors import _script_for_stdin
from testbed.fakes.hub import FakeHub
from tests.support.configs import tiny_config
from tests.support.paths import REPO

TOKEN = "hf_tpuctlTestToken9f3b7c21d5e8a0"  # unique: grep-able in every file a run wrote


@pytest.fixture
def hub(monkeypatch):
    with FakeHub() as fake:
        fake.add_token(TOKEN, user="alice", orgs={"lab": "write", "readers": "read"})
        fake.add_token("hf_readonly", user="bob", role="read")
        fake.add_token("hf_fine", user="carol", role="fineGrained", orgs={"lab": "write"},
                       scoped=[{"entity": {"type": "user", "name": "carol"},
                                "permissions": ["repo.content.read", "repo.write"]}])
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        yield fake


def test_secrets_reach_the_ssh_shell_as_variables_not_arguments():
    script = _script_for_stdin('echo "got $TPUCTL_SECRETS"; cat /proc/$$/cmdline | tr "\\0" " "',
                               {"TPUCTL_SECRETS": json.dumps({"HF_TOKEN": "it's $secret"})})
    done = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True,
                          timeout=10)
    got, cmdline = done.stdout.splitlines()
    assert got == 'got {"HF_TOKEN": "it\'s $secret"}'
    assert "secret" not in cmdline


def _run(args, env, cwd, timeout=900):
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=timeout)


def _user_env(tmp_path: Path, hub: FakeHub, **extra) -> dict:
    """A user's environment: the token only in the login file `hf auth login` writes."""
    home = tmp_path / "user"
    (home / "hf").mkdir(parents=True, exist_ok=True)
    (home / "hf" / "token").write_text(TOKEN)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TPUCTL_"))}
    env.update(HOME=str(home), HF_HOME=str(home / "hf"), HF_ENDPOINT=hub.url,
               TPUCTL_HOME=str(tmp_path / "tpuctl-home"), XDG_CACHE_HOME=str(home / "cache"),
               PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", **extra)
    return env


def test_a_token_that_cannot_write_stops_the_run_before_it_starts(tmp_path, hub):
    config = tiny_config(tmp_path, output_dir=str(tmp_path / "out"),
                         cluster={"provider": "local", "workers": 2})
    env = _user_env(tmp_path, hub)
    refused = _run(["train", "-c", str(config), "--push-to-hub", "readers/model"], env,
                   tmp_path, timeout=120)
    assert refused.returncode == 2, refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cannot publish to readers/model" in errors[0]
    assert not (tmp_path / "tpuctl-home").exists() and not (tmp_path / "out").exists()
    # A dry run needs no token at all and says when it will be checked.
    env.pop("HF_HOME")
    dry = _run(["train", "-c", str(config), "--push-to-hub", "lab/model", "--dry-run"],
               {**env, "HF_HOME": str(tmp_path / "empty")}, tmp_path, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "publish: model/ to lab/model (public if created) after export; the token is " \
        "checked when the run starts" in dry.stdout
    assert "step 5: publish on workers 0" in dry.stdout
    assert [r.path for r in hub.requests] == ["/api/whoami-v2"]


def test_a_local_run_publishes_its_model_and_the_token_is_in_no_file(tmp_path):
    # Weights above 256 KiB go up in 128 KiB parts: the multipart path real weights take.
    with FakeHub(multipart_threshold=256 << 10, multipart_chunk=128 << 10) as hub:
        hub.add_token(TOKEN, user="alice", orgs={"lab": "write"})
        corpus = tmp_path / "corpus.txt"
        corpus.write_text("".join(f"sentence {i} about {'rivers' if i % 2 else 'stones'} and "
                                  f"light {i % 13}\n" for i in range(800)))
        config = tiny_config(tmp_path / "run", name="pub", corpus=str(corpus),
                             output_dir=str(tmp_path / "out"), model={"family": "roberta"},
                             cluster={"provider": "local", "workers": 2},
                             hub={"private": True})
        env = _user_env(tmp_path, hub)
        done = _run(["train", "-c", str(config), "--local", "--push-to-hub", "lab/tiny-roberta"],
                    env, tmp_path)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "publish: model/ to lab/tiny-roberta (private if created) after export, as " \
            "alice" in done.stdout
        assert "published to " in done.stdout

        repo = hub.repos["lab/tiny-roberta"]
        assert repo.private and len(repo.commits) == 1
        model = tmp_path / "out" / "model"
        local = {p.name: p.read_bytes() for p in model.iterdir()
                 if p.is_file() and not p.name.startswith(".")}
        assert {"config.json", "model.safetensors", "tf_model.h5", "tokenizer.json"} <= set(local)
        assert {k: v for k, v in repo.files.items() if k != "README.md"} == local
        # Weights went through LFS, at least one of them in parts; Xet was offered by the
        # client (hf_xet is installed) and never chosen, and no Xet route was asked for.
        assert {"model.safetensors", "tf_model.h5"} <= repo.lfs_files
        assert any("/part/" in r.path for r in hub.requests)
        assert hub.offered_transfers and all("xet" in t for t in hub.offered_transfers)
        assert not [r.path for r in hub.requests if "xet" in r.path.lower()]
        writes = [r for r in hub.requests if r.path.startswith(("/api/repos", "/api/models"))]
        assert writes and all(r.token == TOKEN for r in writes)

        card = repo.files["README.md"].decode()
        metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
        final_loss = metrics["final"]["eval"]["loss"]
        for needle in ("pipeline_tag: fill-mask", "# tiny-roberta", "roberta (1 layers, hidden 32",
                       "- corpus: `corpus.txt`", "bpe, trained on the corpus",
                       "steps: 4 of 4", f"loss {final_loss:.4f}", "```yaml",
                       'from_pretrained("lab/tiny-roberta")'):
            assert needle in card, needle
        assert yaml.safe_load(card.split("```yaml\n", 1)[1].split("```", 1)[0])["train"] == (
            yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())["train"])

        # The token reached worker 0's publish stage only in memory: no file anything wrote
        # holds it (the user's own login file aside), nor does any job plan or record.
        login = tmp_path / "user" / "hf" / "token"
        holders = [str(p) for p in tmp_path.rglob("*") if p.is_file() and p != login
                   and TOKEN.encode() in p.read_bytes()]
        assert holders == []
        assert TOKEN not in done.stdout + done.stderr
        agents = {p.parent.name: json.loads(p.read_text())
                  for p in (tmp_path / "tpuctl-home").rglob("worker-*/agent.json")}
        assert set(agents) == {"worker-0", "worker-1"}
        assert agents["worker-0"]["secrets_on_stdin"] and not agents["worker-1"]["secrets_on_stdin"]
        assert agents["worker-0"]["steps"][-1]["command"]["secrets"] == ["HF_TOKEN"]
        # The run plan was printed once, by the launcher, before the job started.
        assert done.stdout.count("run plan: roberta") == 1



"""Publishing to the Hub: the token check before anything starts, the publish step in the plan,
the token's way to worker 0 (in memory only), and a whole local run pushed to a stand-in Hub
(testbed/fakes/hub.py) by the real huggingface_hub client: repository creation, preupload, the
LFS batch, basic and multipart uploads, the commit; Xet never negotiated."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher import hub as launcher_hub
from launcher.environment import plan_environment
from launcher.executors import _script_for_stdin
from launcher.plan import Stage, Worker, build_plan, parse_stages, render_plan
from payload.config import parse_config
from payload.core.errors import UserError
from payload.training.strategy import CPU
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


def test_the_token_is_checked_for_write_access(hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    access = launcher_hub.check_access("lab/model")
    assert (access.user, access.repo, access.endpoint) == ("alice", "lab/model", hub.url)
    assert TOKEN not in repr(access) and access.secrets() == {"HF_TOKEN": TOKEN}
    assert launcher_hub.check_access("alice/model").user == "alice"
    refusals = [
        (TOKEN, "readers/m", "alice has the role 'read' in readers, which cannot write"),
        (TOKEN, "strangers/m", "alice is not a member of strangers"),
        ("hf_readonly", "bob/m", "the token of bob is read-only"),
        ("hf_fine", "lab/m", "the fine-grained token of carol has no repo.write on lab"),
        ("hf_unknown", "lab/m", "token was refused by"),
    ]
    for token, repo, needle in refusals:
        monkeypatch.setenv("HF_TOKEN", token)
        with pytest.raises(UserError, match=needle):
            launcher_hub.check_access(repo)
    monkeypatch.setenv("HF_TOKEN", "hf_fine")
    assert launcher_hub.check_access("carol/m").user == "carol"
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_HOME", "/nonexistent-hf-home")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_TOKEN_PATH", "/nonexistent-hf-home/token")
    with pytest.raises(UserError, match="needs a Hugging Face token"):
        launcher_hub.check_access("lab/m")
    # Only whoami was asked: nothing was created.
    assert {r.path for r in hub.requests} == {"/api/whoami-v2"} and not hub.repos


def _config(tmp_path: Path, **hub_section):
    raw = yaml.safe_load(tiny_config(tmp_path, output_dir=str(tmp_path / "out"),
                                     cluster={"provider": "local", "workers": 2}).read_text())
    if hub_section:
        raw["hub"] = hub_section
    return parse_config(raw)


def _plan(config, stages=tuple(Stage)):
    workers = tuple(Worker(index=i, host="localhost", address="127.0.0.1",
                           coordination_port=20000 + i, base_dir=f"/w{i}") for i in range(2))
    return build_plan(config, workers, job_id="j", payload_digest="d",
                      environment=plan_environment(python="/usr/bin/python3",
                                                   wheelhouse_digest=None, requirements=(),
                                                   tpu=False),
                      hardware=CPU, stages=stages, hub_env=(("HF_ENDPOINT", "http://h"),))


def test_the_plan_publishes_on_worker_0_after_export_with_the_token_by_name(tmp_path):
    plan = _plan(_config(tmp_path, repo="lab/model", private=True))
    assert [s.name for s in plan.steps][-2:] == ["export", "publish"]
    publish = plan.steps[-1]
    assert publish.workers == (0,) and publish.commands[0].secrets == ("HF_TOKEN",)
    assert ("HF_ENDPOINT", "http://h") in publish.commands[0].env
    assert plan.agent_plan(0)["secrets_on_stdin"] and not plan.agent_plan(1)["secrets_on_stdin"]
    assert plan.agent_plan(0)["steps"][-1]["command"]["secrets"] == ["HF_TOKEN"]
    assert "[+ HF_TOKEN: in memory, from the launcher]" in render_plan(plan)
    assert "HF_TOKEN=" not in plan.to_json()
    # No repository: no publish step; asking for it alone says what is missing.
    assert "publish" not in [s.name for s in _plan(_config(tmp_path)).steps]
    with pytest.raises(UserError, match="no Hub repository to publish to"):
        _plan(_config(tmp_path), stages=parse_stages("publish"))
    with pytest.raises(UserError, match=r"hub\.repo: 'not a repo' is not a Hub repository id"):
        _config(tmp_path, repo="not a repo")


def test_secrets_reach_the_ssh_shell_as_variables_not_arguments():
    script = _script_for_stdin('echo "got $TPUCTL_SECRETS"; cat /proc/$$/cmdline | tr "\\0" " "',
                               {"TPUCTL_SECRETS": json.dumps({"HF_TOKEN": "it's $secret"})})
    done = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True,
                          timeout=10)
    got, cmdline = done.stdout.splitlines()
    assert got == 'got {"HF_TOKEN": "it\'s $secret"}'
    assert "secret" not in cmdline


def test_the_model_card_shows_the_model_not_the_infrastructure(tmp_path):
    from markdown_it import MarkdownIt

    from payload.training.publish import model_card

    corpus = "/home/alice/data/we`ird *name* <b>.txt"
    raw = yaml.safe_load(tiny_config(tmp_path, output_dir="gs://alice-private-bucket/run",
                                     corpus=corpus, cluster={}).read_text())
    raw["cluster"] = {"provider": "gcp", "project": "secret-project-4711",
                      "zone": "us-central2-b", "accelerator_type": "v4-8",
                      "ssh_source_ranges": ["203.0.113.7/32"], "bucket": "alice-private-bucket",
                      "identity_file": "/home/alice/.ssh/tpu_key"}
    raw["hub"] = {"repo": "lab/model"}
    card = model_card(parse_config(raw), {"final": {"step": 4, "stopped": "max_hours <b>"}}, {})
    for private in ("secret-project-4711", "203.0.113.7", "alice-private-bucket", "tpu_key",
                    "/home/alice", "cluster", "output_dir"):
        assert private not in card, private
    tokens = [t for block in MarkdownIt().parse(card) if block.children
              for t in block.children]
    # The corpus is one code span holding its name whole: the backtick did not end it.
    assert [t.content for t in tokens if t.type == "code_inline" and "ird" in t.content] == [
        "we`ird *name* <b>.txt"]
    assert not [t for t in tokens if t.type in ("html_inline", "em_open")]
    settings = yaml.safe_load(card.split("```yaml\n", 1)[1].split("\n```", 1)[0])
    assert list(settings) == ["data", "tokenizer", "model", "train"]
    assert settings["data"]["corpus"] == ["we`ird *name* <b>.txt"]


def test_publish_reads_only_a_complete_export(tmp_path, hub, monkeypatch):
    from payload.core import storage
    from payload.training import publish

    config = _config(tmp_path, repo="lab/model")
    (tmp_path / "out" / "model").mkdir(parents=True)
    (tmp_path / "out" / "model" / "config.json").write_text("{}")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(storage, "is_complete", lambda folder: False, raising=False)
    with pytest.raises(UserError, match="is not a complete export"):
        publish.run_publish(config)
    assert hub.requests == []


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


def test_module_has_no_shell_quoting_surprises():
    # The start command stays one shell line when secrets are handed over.
    from launcher.jobs import start_command
    from launcher.plan import job_paths

    line = start_command(job_paths("j", "d", 0), "/usr/bin/python3", secrets=True)
    assert shlex.split(line)  # parses
    assert '"$TPUCTL_SECRETS"' in line and "env -u TPUCTL_SECRETS" in line

"""Publishing to the Hub: the token check before anything starts, the publish step in the plan,
the token's way to worker 0 (in memory only), and a whole local run pushed to a stand-in Hub
(testbed/fakes/hub.py) by the real huggingface_hub client: repository creation, preupload, the
LFS batch, basic and multipart uploads, the commit; Xet never negotiated."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from launcher import hub as launcher_hub
from launcher.plan import Stage, Worker, build_plan, parse_stages, render_plan
from launcher.worker_python import plan_environment
from payload.config import parse_config
from payload.core.errors import UserError
from payload.training.strategy import CPU
from testbed.fakes.hub import FakeHub
from tests.support.configs import tiny_config

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


def test_the_model_card_shows_the_model_not_the_infrastructure(tmp_path):
    from markdown_it import MarkdownIt

    from payload.stages.publish import model_card

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
    from payload.core import folders
    from payload.stages import publish

    config = _config(tmp_path, repo="lab/model")
    (tmp_path / "out" / "model").mkdir(parents=True)
    (tmp_path / "out" / "model" / "config.json").write_text("{}")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(folders, "is_complete", lambda folder: False)
    with pytest.raises(UserError, match="is not a complete export"):
        publish.run_publish(config)
    assert hub.requests == []


def test_module_has_no_shell_quoting_surprises():
    # The start command stays one shell line when secrets are handed over.
    from launcher.job_shell import start_command
    from launcher.plan import job_paths

    line = start_command(job_paths("j", "d", 0), "/usr/bin/python3", secrets=True)
    assert shlex.split(line)  # parses
    assert '"$TPUCTL_SECRETS"' in line and "env -u TPUCTL_SECRETS" in line


@pytest.mark.parametrize(("name", "value"), [("HF_HUB_OFFLINE", "1"), ("HF_HUB_OFFLINE", "true"),
                                             ("TRANSFORMERS_OFFLINE", "YES")])
def test_publishing_offline_is_refused_naming_the_switch(hub, monkeypatch, name, value):
    """Issue 38, item 9: with huggingface_hub switched offline, the launcher's check and the
    publish stage say which variable does it, instead of failing to connect; nothing is asked."""
    from payload.stages.publish import check_online

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv(name, value)
    with pytest.raises(UserError) as info:
        launcher_hub.check_access("lab/model")
    assert f"{name}={value} keeps huggingface_hub offline" in str(info.value)
    assert f"unset {name}" in info.value.hint and not hub.requests
    with pytest.raises(UserError, match=name):
        check_online({name: value})
    check_online({name: "0"})
    check_online({})

"""`tpuctl train --local` and friends, driven through the CLI with stand-in stages."""


import pytest
from typer.testing import CliRunner

from launcher.cli import app
from tests.support.configs import tiny_config
from tests.support.paths import REPO
from tests.support.runners import tpuctl

runner = CliRunner()


def test_dry_run_prints_the_plan_and_touches_nothing(local_run, tpuctl_home, tmp_path):
    config = local_run()
    result = runner.invoke(app, ["train", "-c", str(config), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "step 2: prepare on workers 0, 1" in result.output
    assert "--worker-index 1 --num-workers 2" in result.output
    assert not tpuctl_home.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--local", "--workers", "0"], "--workers 0: need at least 1 worker"),
    (["--local", "--stages", "train,bogus"], "unknown stage 'bogus'"),
])
def test_bad_arguments_are_one_line(local_run, args, message):
    config = local_run()
    result = tpuctl("train", "-c", config, *args, cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def test_a_missing_corpus_is_refused_before_anything_starts(local_run, tmp_path):
    config = local_run(corpus=str(tmp_path / "nothere" / "*.txt"))
    result = tpuctl("train", "-c", config, "--local", cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "no file matches" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists(), "nothing is written"


def test_gcp_provider_without_credentials_is_one_line(tmp_path, tpuctl_home, monkeypatch):
    monkeypatch.delenv("TPUCTL_TPU_API_ENDPOINT", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    config = tiny_config(tmp_path, output_dir="gs://b/run", cluster={
        "provider": "gcp", "project": "my-project", "zone": "us-central2-b",
        "accelerator_type": "v4-8", "runtime_version": "tpu-ubuntu2204-base"})
    result = runner.invoke(app, ["train", "-c", str(config)])
    assert result.exit_code != 0
    assert "credentials" in str(result.exception), result.output
    assert not tpuctl_home.exists(), "nothing is written before the cloud answers"


def test_logs_without_a_job_is_a_user_error(local_run):
    config = local_run()
    result = runner.invoke(app, ["logs", "-c", str(config)])
    assert result.exit_code != 0 and "no job of run 't'" in str(result.exception)




@pytest.mark.parametrize(("stages", "extra", "needle"), [
    ("export", [], "nothing to export: no checkpoint in"),
    ("train,export", [], "no shard manifest at"),
    ("prepare", [], "no tokenizer at"),
    ("publish", ["--push-to-hub", "me/m", "--dry-run"], "is not a complete export"),
])
def test_a_stage_whose_input_an_earlier_stage_makes_is_refused_before_a_job(
        local_run, tpuctl_home, tmp_path, stages, extra, needle):
    """Issue 38 item 5: `--stages export` on an empty output_dir starts no job: one line for
    the first stage whose input is missing, exit 2, nothing written (no .tpuctl/, no logs/)."""
    config = local_run()
    result = tpuctl("train", "-c", config, "--local", "--stages", stages, *extra, cwd=REPO)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and needle in result.stderr, result.stderr
    assert not (tmp_path / "out").exists() and not tpuctl_home.exists(), "nothing is written"

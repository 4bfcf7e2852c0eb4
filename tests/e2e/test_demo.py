"""`make demo` as a user runs it: examples/demo.yaml, every real stage, two local workers."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from launcher.cli import app
from tests.support.paths import REPO

runner = CliRunner()


@pytest.mark.slow  # the whole pipeline: about a minute on 2 idle cores, minutes on busy ones
def test_the_demo_shows_learning_and_warns_of_nothing(tmp_path, tpuctl_home):
    pytest.importorskip("tensorflow")
    raw = yaml.safe_load((REPO / "examples" / "demo.yaml").read_text())
    raw["output_dir"] = str(tmp_path / "out")
    raw["data"]["corpus"] = str(REPO / "payload" / "data" / "corpus.txt.gz")
    config = tmp_path / "demo.yaml"
    config.write_text(yaml.safe_dump(raw))
    result = runner.invoke(app, ["train", "--local", "--overwrite", "-c", str(config)])
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output, result.output
    # A real run says its estimate too (worked out before its workers started).
    assert "  time: about " in result.output and "not estimated" not in result.output
    evals = json.loads((tmp_path / "out" / "metrics.json").read_text())["evals"]
    accuracy = [e["accuracy"] for e in evals]
    # A person watching sees it rise well past the first evaluation's (the demo used to sit
    # at one figure, 0.0289, from step 50 to the end: the most frequent token, every time).
    assert accuracy[-1] >= 1.5 * accuracy[1] and len(set(accuracy[1:])) > 2, accuracy
    # The steps read at most one epoch, so a second `make demo` (the manifest there) warns of
    # nothing either.
    train = raw["train"]
    manifest = json.loads((tmp_path / "out" / "data" / "manifest.json").read_text())
    assert train["steps"] * train["batch_size"] <= manifest["splits"]["train"]["records"]
    dry = runner.invoke(app, ["train", "--local", "--overwrite", "--dry-run", "-c", str(config)])
    assert dry.exit_code == 0 and "warning" not in dry.output, dry.output
    # The next plan times the run by what this one measured.
    assert f"of model FLOPs the last gpt2 run in {tmp_path / 'out'} measured" in dry.output

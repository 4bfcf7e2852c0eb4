"""The train stage's progress records (payload.training.progress): from the first step whatever
eval_every is, one record per report that metrics.json keeps as it is, a final one that says why
training stopped early."""

import json

import pytest

pytest.importorskip("tensorflow")

from payload.stages.train import run_train
from payload.training import loop as train_loop
from payload.training import progress
from tests.support.configs import training_run_config
from tests.support.runs import prepared_run


def said(capsys) -> list[dict]:
    return [r for r in map(progress.parse, capsys.readouterr().out.splitlines()) if r]


def test_records_from_the_first_step_and_metrics_json_keeps_the_reports(tmp_path, capsys,
                                                                        monkeypatch):
    monkeypatch.setattr(train_loop, "PROGRESS_EVERY_S", 0.0)  # a record after every step
    out = prepared_run(tmp_path, "gpt2")
    run_train(training_run_config(out, "gpt2", steps=24, eval_every=1000, checkpoint_every=12))
    records = said(capsys)
    assert [r["kind"] for r in records[:3]] == ["start", "eval", "train"]
    assert records[0] == {"kind": "start", "step": 0, "steps": 24}
    trains = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in trains] == list(range(1, 25))
    first = trains[0]
    assert first["first_step_s"] > 0 and first["tokens_per_s"] is None and first["eta_s"] is None
    assert all(r["tokens_per_s"] > 0 and r["eta_s"] is not None for r in trains[1:])
    assert trains[-1]["eta_s"] == 0 and all("first_step_s" not in r for r in trains[1:])
    metrics = json.loads((out / "metrics.json").read_text())
    # Reports are every checkpoint (12 steps here); metrics.json holds those records as said.
    assert metrics["train"] == [{k: v for k, v in r.items() if k != "kind"}
                                for r in trains if r["step"] in (12, 24)]
    assert [{k: v for k, v in r.items() if k != "kind"} for r in records
            if r["kind"] == "eval"] == metrics["evals"]
    assert records[-1] == {"kind": "final", "family": "gpt2", **metrics["final"]}
    assert "perplexity" in metrics["final"]["eval"]


def test_the_final_record_says_why_training_stopped_early(tmp_path, capsys):
    out = prepared_run(tmp_path, "roberta")
    config = training_run_config(out, "roberta", steps=400)
    config = config.model_copy(update={"train": config.train.model_copy(
        update={"max_hours": 1e-9, "checkpoint_every": 1000, "eval_every": 1000})})
    run_train(config)
    final = said(capsys)[-1]
    assert final["kind"] == "final" and final["stopped"].startswith("train.max_hours")
    from launcher.view import summary

    lines = summary(final=final, family="roberta", output_dir=str(out), exported=True)
    assert lines[1].startswith(f"training stopped at step {final['step']}, before train.steps: "
                               "train.max_hours")

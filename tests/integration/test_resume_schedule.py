"""Raising (or lowering) train.steps on --resume changes the learning-rate schedule: the run
says so in one line, with the old and new totals and what the rate does."""

import logging
import re

import pytest

pytest.importorskip("tensorflow")

from payload.engines.tensorflow.optimization import warmup_linear_decay
from payload.stages.train import run_train
from payload.training.schedule import learning_rate_at, schedule_change
from tests.support.configs import training_run_config
from tests.support.runs import prepared_run


def test_the_plain_rate_is_the_schedule_the_optimizer_uses():
    schedule = warmup_linear_decay(1e-3, 10, 100)
    for done in (0, 4, 9, 10, 11, 50, 98, 99, 100, 120):
        assert learning_rate_at(1e-3, 10, 100, done) == pytest.approx(float(schedule(done)))


def test_the_note_names_both_totals_and_the_rate_before_and_after():
    class Train:
        steps, warmup_steps, learning_rate = 600, 0, 1.2e-4

    note = schedule_change({"steps": 300, "warmup_steps": 0, "learning_rate": 1.2e-4}, Train, 297)
    assert note.startswith("train.steps changed from 300 to 600")
    assert "stretched" in note and "at step 600" in note
    # 3 of 300 steps left: 1.2e-6; 303 of 600 left: 6.06e-05.
    assert "goes back up from 1.2e-06 (the old schedule) to 6.06e-05" in note
    lowered = schedule_change({"steps": 1000}, Train, 297)
    assert "squeezed" in lowered and "drops" in lowered
    assert schedule_change({"steps": 600}, Train, 297) is None
    assert schedule_change(None, Train, 297) is None


def test_a_resume_with_more_steps_says_the_schedule_is_stretched(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    out = prepared_run(tmp_path, "gpt2")
    run_train(training_run_config(out, "gpt2", steps=4, warmup_steps=0, checkpoint_every=4, eval_every=4))
    assert "schedule" not in caplog.text
    run_train(training_run_config(out, "gpt2", steps=8, warmup_steps=0, checkpoint_every=4, eval_every=4),
              resume=True)
    lines = [r.getMessage() for r in caplog.records if "schedule" in r.getMessage()]
    assert len(lines) == 1, lines
    assert re.search(r"train\.steps changed from 4 to 8 .* stretched .* at step 4 the rate "
                     r"goes back up from 0 \(the old schedule\) to 0\.0015", lines[0]), lines[0]
    caplog.clear()
    run_train(training_run_config(out, "gpt2", steps=12, warmup_steps=0, checkpoint_every=4, eval_every=4),
              resume=True)
    assert "changed from 8 to 12" in caplog.text

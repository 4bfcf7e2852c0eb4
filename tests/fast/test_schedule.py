"""The learning rate a run reports is the one its optimizer applies (issue 25): the schedule
for AdamW, and for Adafactor the schedule capped at 1/sqrt(t), as tf_keras' Adafactor and the
JAX engine apply it. The TensorFlow engine used to report the uncapped schedule."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from payload.training import schedule


def _train(optimizer: str, learning_rate: float = 0.5, warmup_steps: int = 4,
           steps: int = 100) -> SimpleNamespace:
    return SimpleNamespace(optimizer=optimizer, learning_rate=learning_rate,
                           warmup_steps=warmup_steps, steps=steps)


@pytest.mark.parametrize("step", [1, 2, 4, 5, 16, 50, 100])
def test_adamw_reports_the_schedule_itself(step):
    train = _train("adamw")
    assert schedule.applied_rate(train, step) == pytest.approx(
        schedule.learning_rate_at(0.5, 4, 100, step - 1))


@pytest.mark.parametrize("step", [1, 2, 4, 5, 16, 50, 100])
def test_adafactor_reports_the_schedule_capped_at_one_over_sqrt_t(step):
    train = _train("adafactor")
    scheduled = schedule.learning_rate_at(0.5, 4, 100, step - 1)
    applied = schedule.applied_rate(train, step)
    assert applied == pytest.approx(min(scheduled, 1 / math.sqrt(step)))
    assert applied <= scheduled


def test_the_cap_binds_where_the_schedule_is_above_it():
    # Peak 0.5 after 4 warm-up steps: at step 16 the schedule is near 0.43, the cap 0.25.
    train = _train("adafactor")
    assert schedule.applied_rate(train, 16) == pytest.approx(0.25)
    assert schedule.learning_rate_at(0.5, 4, 100, 15) > 0.4

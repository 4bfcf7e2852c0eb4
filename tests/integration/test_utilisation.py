"""Utilisation in the metrics: tokens/s per device and MFU against the device's peak, in the
progress records, TensorBoard and metrics.json; a CPU run measures its own peak."""

from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("tensorflow")

from payload.engines.tensorflow.trainer import cpu_peak_flops
from payload.training import progress, runplan
from payload.training.strategy import CPU, Hardware
from payload.training.utilisation import Meter, meter_for
from tests.support.configs import training_run_config
from tests.support.runs import prepared_run


def test_fields_are_the_arithmetic_they_claim():
    meter = Meter(flops_per_step=4e12, tokens_per_step=8192, devices=4, device="chip",
                  peak_flops_per_device=275e12, peak_source="table")
    fields = meter.fields(steps_per_s=10.0)
    assert fields["tokens_per_s_per_device"] == 8192 * 10 / 4
    assert fields["model_flops_per_s"] == 4e13
    assert fields["mfu"] == pytest.approx(4e13 / (4 * 275e12))
    assert meter.words(fields) == "tokens/s/chip 20,480  MFU 3.6%"
    assert meter.words(meter.fields(steps_per_s=0.01)).endswith("MFU 0.0036%")
    assert set(meter.scalars(fields)) == {"train/tokens_per_s_per_chip",
                                          "train/model_flops_per_s", "train/mfu"}


def test_cpu_probe_measures_a_plausible_peak():
    peak = cpu_peak_flops(size=256, rounds=2, products=4)
    # Any CPU that runs TensorFlow does more than 0.1 GFLOP/s and less than 100 TFLOP/s.
    assert 1e8 < peak < 1e14


def test_tpu_hardware_without_a_tpu_strategy_is_measured_as_cpu(tmp_path):
    out = prepared_run(tmp_path, "gpt2")
    config = training_run_config(out, "gpt2")
    from payload.training.inputs import check_inputs
    from payload.training.model import model_config

    inputs = check_inputs(config)
    # A TPU fleet whose engine fell back to the CPU (the TPU API stand-in) measures the CPU.
    meter = meter_for(config, inputs.hf_config, Hardware.tpu("v4-8", "stand-in"), devices=1,
                      drives_tpu=False, cpu_peak=lambda: cpu_peak_flops(size=256, rounds=1))
    assert meter.device == "process" and meter.devices == 1
    assert meter.peak_source.startswith("CPU probe")
    # The FLOPs are the run plan's for the model the stage built.
    hf = model_config(config.model, vocab=inputs.vocab, seq_len=config.data.seq_len)
    assert meter.flops_per_step == runplan.row_flops(config, hf.to_dict()).total * 16
    assert meter_for(config, inputs.hf_config, CPU, devices=1, drives_tpu=False,
                     cpu_peak=lambda: 1e9).device == "process"


def test_a_cpu_run_reports_utilisation_everywhere(tmp_path, caplog, capsys):
    from payload.stages.train import run_train

    out = prepared_run(tmp_path, "roberta")
    with caplog.at_level(logging.INFO, logger="payload.training"):
        run_train(training_run_config(out, "roberta", steps=40))
    metrics = json.loads((out / "metrics.json").read_text())
    header = metrics["utilisation"]
    assert header["device"] == "process" and header["devices"] == 1
    assert header["peak_source"].startswith("CPU probe: float32 1024x1024")
    assert header["peak_flops_per_device"] > 1e8
    for report in metrics["train"]:
        assert 0 < report["mfu"] < 1, report
        assert report["tokens_per_s_per_device"] == pytest.approx(report["tokens_per_s"])
    final = metrics["final"]
    assert 0 < final["mfu"] < 1
    assert final["model_flops_per_s"] == pytest.approx(
        header["flops_per_step"] * final["steps_per_s"])
    # The progress records (payload.training.progress) carry them, and the live view shows the MFU.
    said = [r for r in map(progress.parse, capsys.readouterr().out.splitlines())
            if r and r["kind"] == "train" and r["tokens_per_s"]]
    assert said and all(0 < r["mfu"] < 1 and "MFU" in progress.describe(r) for r in said)
    assert any("peak: CPU probe" in r.getMessage() for r in caplog.records)
    tags = _tensorboard_tags(out / "logs" / "tensorboard")
    assert {"train/mfu", "train/tokens_per_s_per_process", "train/model_flops_per_s"} <= tags


def _tensorboard_tags(folder) -> set[str]:
    from tensorflow.core.util import event_pb2
    from tensorflow.python.lib.io import tf_record

    tags = set()
    for path in folder.rglob("events.out.tfevents.*"):
        for raw in tf_record.tf_record_iterator(str(path)):
            event = event_pb2.Event.FromString(raw)
            tags.update(value.tag for value in event.summary.value)
    return tags

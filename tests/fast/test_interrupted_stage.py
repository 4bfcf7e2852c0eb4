"""Ctrl-C on a stage run by hand (`python -m payload prepare`) ends it with one line saying what
is kept and how to go on, not a KeyboardInterrupt traceback (issue 38, item 8)."""

from __future__ import annotations

import pytest

import payload.__main__ as stage_main
from tests.support.runners import payload_main


@pytest.mark.parametrize("stage, kept", [
    ("prepare", "the shards finished so far stay; run it again to continue after the last one"),
    ("train", "the newest checkpoint stays; --resume continues from it"),
])
def test_ctrl_c_is_one_line(monkeypatch, stage, kept):
    def run_stage(args):
        raise KeyboardInterrupt  # where Ctrl-C lands: anywhere inside the stage

    monkeypatch.setattr(stage_main, "run_stage", run_stage)
    result = payload_main(stage, "--config", "unused.yaml")
    assert result.returncode == 130
    assert result.stderr.splitlines() == [f"error: {stage} interrupted (Ctrl-C): {kept}"]
    with pytest.raises(KeyboardInterrupt):  # TPUCTL_DEBUG asks for the traceback
        payload_main(stage, "--config", "unused.yaml", env={"TPUCTL_DEBUG": "1"})

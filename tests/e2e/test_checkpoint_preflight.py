"""The launcher's pre-flight of a job's checkpoints (issue 38 item 4): `tpuctl train --local
--resume` onto a truncated newest step is refused before any stage runs, in one line, once,
exit 2, with output_dir as it was (no run lock, no logs/, the tokenizer and prepare not run)."""

import pytest

from tests.support.broken_checkpoints import array_files, tree, truncate
from tests.support.runners import tpuctl
from tests.support.runs import config_beside, trained_run


def test_a_resume_onto_a_truncated_step_is_refused_before_any_stage(tmp_path, tpuctl_home):
    pytest.importorskip("optax")
    out = trained_run(tmp_path, "gpt2", engine="jax", steps=4, checkpoint_every=2,
                      eval_every=2)
    for data in array_files(out / "checkpoints" / "4"):
        truncate(data)
    before = tree(out)
    result = tpuctl("train", "-c", config_beside(out), "--local", "--workers", "2", "--resume",
                    cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in ("error: --resume", "step 4", "cannot be restored", "step 2 is intact"):
        assert needle in lines[0], lines[0]
    assert "tokenizer" not in result.stdout and "prepare" not in result.stdout, result.stdout
    assert tree(out) == before, "output_dir changed"
    assert not list(tpuctl_home.glob("jobs/*/*/config.yaml")), "a job was recorded"

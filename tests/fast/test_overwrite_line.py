"""What a fresh start over an earlier run's checkpoints says it removes: one readable line, the
checkpoints by name and a count of their files, never every internal file of a checkpoint."""

from __future__ import annotations

import logging

from payload.core import ownership, storage
from payload.training.checkpoints import removal_summary, start_fresh


def jax_run_checkpoints(folder, steps=(100, 200, 300)) -> int:
    """checkpoints/ as three saves of the JAX engine leave it (Orbax's OCDBT layout, two
    processes): dozens of files a step. Returns how many files."""
    names = ["run.json", "schedule.json", ".tpuctl-complete"]
    for step in steps:
        names += [f"{step}/commit_success.txt", f"{step}/_CHECKPOINT_METADATA",
                  f"{step}/default/_METADATA", f"{step}/default/_sharding",
                  f"{step}/default/manifest.ocdbt", f"{step}/default/commit_success.txt"]
        for process in (0, 1):
            names += [f"{step}/default/array_metadatas/process_{process}",
                      f"{step}/default/ocdbt.process_{process}/manifest.ocdbt"]
            names += [f"{step}/default/ocdbt.process_{process}/d/{'%032x' % (step * 97 + i)}"
                      for i in range(8)]
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    return len(names) - 3


def test_overwriting_a_jax_run_says_what_goes_in_one_short_line(tmp_path, caplog):
    out = tmp_path / "run"
    ownership.claim_output_dir(str(out))  # what the earlier run made tpuctl's
    files = jax_run_checkpoints(out / "checkpoints")
    assert files > 70
    with caplog.at_level(logging.INFO, logger="payload.training.checkpoints"):
        start_fresh(str(out), {"engine": "jax"})
    [line] = [r.getMessage() for r in caplog.records if "removing" in r.getMessage()]
    assert line.endswith(f": 100/, 200/, 300/ ({files} files) and tpuctl's .tpuctl-complete, "
                         "run.json, schedule.json"), line
    assert len(line) - len(str(out / "checkpoints")) < 150, line
    assert sorted(storage.list_tree(str(out / "checkpoints"))) == [".tpuctl-complete", "run.json"]


def test_tensorflow_checkpoints_are_named_by_checkpoint_not_by_file():
    files = ["checkpoint", "ckpt-20.data-00000-of-00001", "ckpt-20.index",
             "ckpt-40.data-00000-of-00002", "ckpt-40.data-00001-of-00002", "ckpt-40.index"]
    assert removal_summary(files, ["run.json"]) == (
        "ckpt-20, ckpt-40, checkpoint (6 files) and tpuctl's run.json")


def test_many_checkpoints_are_counted_past_the_first_few():
    files = [f"{step}/commit_success.txt" for step in range(10, 210, 10)]
    assert removal_summary(files, []) == "10/, 20/, 30/, 40/, 50/, 60/ and 14 more (20 files)"

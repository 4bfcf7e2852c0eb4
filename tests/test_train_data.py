"""The input pipeline: each pipeline reads its own share, shapes are static, seeds decide."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from payload import records  # noqa: E402
from payload.data import input_pipeline  # noqa: E402

RECORD_LEN, BATCH = 8, 4


def write_shards(folder, num_files: int, rows_per_file: int) -> list[str]:
    paths = []
    for f in range(num_files):
        rows = np.arange(rows_per_file * RECORD_LEN).reshape(rows_per_file, RECORD_LEN)
        rows[:, 0] = f * 1000 + np.arange(rows_per_file)  # file and row, readable back
        path = folder / f"shard-{f}.tfrecord"
        with open(path, "wb") as out:
            records.ShardWriter(out, dtype="int32").write_rows(rows)
        paths.append(str(path))
    return paths


def first_column(ds, batches: int) -> np.ndarray:
    return np.concatenate([b["input_ids"].numpy()[:, 0] for b in ds.take(batches)])


def identity(ids, seed):
    return {"input_ids": ids}


@pytest.mark.parametrize("num_files", [4, 1])
def test_each_pipeline_reads_its_own_share(tmp_path, num_files):
    files = write_shards(tmp_path, num_files, 24)
    seen = []
    for pipeline in range(2):
        ds = input_pipeline(
            files,
            record_len=RECORD_LEN,
            dtype="int32",
            batch_size=BATCH,
            objective=identity,
            seed=0,
            shuffle=False,
            pipeline_id=pipeline,
            num_pipelines=2,
        )
        assert ds.element_spec["input_ids"].shape == (BATCH, RECORD_LEN)
        # One pass over this pipeline's share: 4 files -> 2 files of 24 rows; 1 file -> half.
        seen.append(set(first_column(ds, 12 // (1 if num_files == 4 else 2)).tolist()))
    assert not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) == (96 if num_files == 4 else 24)


def test_shuffling_follows_the_seed(tmp_path):
    files = write_shards(tmp_path, 3, 40)

    def order(seed):
        ds = input_pipeline(
            files,
            record_len=RECORD_LEN,
            dtype="int32",
            batch_size=BATCH,
            objective=identity,
            seed=seed,
        )
        return first_column(ds, 10).tolist()

    assert order(1) == order(1) and order(1) != order(2)

"""The input pipeline: each pipeline reads its own share, shapes are static, seeds decide."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from payload.data import shards  # noqa: E402
from payload.data.pipeline import input_pipeline  # noqa: E402

RECORD_LEN, BATCH = 8, 4


def write_shards(folder, num_files: int, rows_per_file: int) -> list[str]:
    paths = []
    for f in range(num_files):
        rows = np.arange(rows_per_file * RECORD_LEN).reshape(rows_per_file, RECORD_LEN)
        rows[:, 0] = f * 1000 + np.arange(rows_per_file)  # file and row, readable back
        path = folder / f"shard-{f}.tfrecord"
        with open(path, "wb") as out:
            shards.ShardWriter(out, dtype="int32").write_rows(rows)
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


def masked(ids, seed):
    """An objective with randomness, as MLM masking has: the stateless seed decides the mask."""
    noise = tf.random.stateless_uniform(tf.shape(ids), seed, maxval=1000, dtype=tf.int32)
    return {"input_ids": ids, "noise": noise}


@pytest.mark.parametrize(("batch", "start"), [(4, 37), (4, 128), (64, 3), (512, 2)])
def test_a_resumed_pipeline_sees_exactly_what_an_uninterrupted_one_sees_next(
        tmp_path, batch, start):
    """Same records and same masks from `start` on, over epoch ends, for batch sizes that put
    several batches into one parsed group (and a start inside a group) or one."""
    files = write_shards(tmp_path, 3, 300)

    def batches(start_batch, count, pipeline_id=0):
        ds = input_pipeline(files, record_len=RECORD_LEN, dtype="int32", batch_size=batch,
                            objective=masked, seed=7, start_batch=start_batch,
                            pipeline_id=pipeline_id, num_pipelines=2)
        return [(b["input_ids"].numpy(), b["noise"].numpy()) for b in ds.take(count)]

    follow = 6
    for pipeline_id in (0, 1):
        uninterrupted = batches(0, start + follow, pipeline_id)[start:]
        resumed = batches(start, follow, pipeline_id)
        for (ids_a, noise_a), (ids_b, noise_b) in zip(uninterrupted, resumed, strict=True):
            np.testing.assert_array_equal(ids_a, ids_b)
            np.testing.assert_array_equal(noise_a, noise_b)

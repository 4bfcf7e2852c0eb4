"""tpuctl's tf.data input pipeline before the neutral reader (payload.data.stream), kept as the
bench's baseline: shards -> shuffled records -> batches -> parsed -> objective (TensorFlow's).

    ds = input_pipeline(files, record_len=128, dtype="uint16", batch_size=32,
                        objective=masker, seed=0, pipeline_id=0, num_pipelines=2)

Batch first, then parse the whole batch (several times faster than parsing record by record),
then apply the objective to the batch (to several batches at once: in tf.data an op costs
about as much for 32 rows as for 512); every shape is static (`drop_remainder`). Each input
pipeline reads its own share of the files, chosen by `input_pipeline_id`; with fewer files than
pipelines it reads all files and keeps every n-th record instead.
"""

from __future__ import annotations

from payload.core import storage
from payload.data import shards as records

SHUFFLE_RECORDS = 10_000
ROWS_PER_MAP = 512
# Stateless seeds for the objective: (run seed, pipeline * stride + batch index) never repeat
# between pipelines for any realistic run length.
PIPELINE_SEED_STRIDE = 1 << 40


def input_pipeline(
    files: list[str],
    *,
    record_len: int,
    dtype: str,
    batch_size: int,
    objective,
    seed: int,
    shuffle: bool = True,
    pipeline_id: int = 0,
    num_pipelines: int = 1,
    start_batch: int = 0,
):
    """An endless dataset of objective feature dicts with `batch_size` rows each.

    The sequence depends only on the files and `seed`: a run resumed at `start_batch` gets
    exactly the batches an uninterrupted run gets from there on (same records, same masks).
    The records before it are read and dropped, without parsing: resuming costs one pass over
    the data trained on so far."""
    import tensorflow as tf

    if not files:
        raise ValueError("no files to read")
    files = sorted(files)
    shard_records = len(files) < num_pipelines
    if not shard_records:
        files = files[pipeline_id::num_pipelines]
    files_ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle:
        files_ds = files_ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    files_ds = files_ds.repeat()
    # Parallel reads hide Cloud Storage's latency; on a local disk their per-record cost is
    # higher than what they gain (one reader thread was 2-3x faster here).
    parallel = (
        {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": True}
        if storage.is_gcs(files[0])
        else {}
    )
    rows = files_ds.interleave(
        tf.data.TFRecordDataset, cycle_length=min(len(files), 8), block_length=1, **parallel
    )
    if shard_records:
        rows = rows.shard(num_pipelines, pipeline_id)
    if shuffle:
        rows = rows.shuffle(SHUFFLE_RECORDS, seed=seed + 1)

    # Parse and apply the objective to several batches at once, then split them: in tf.data
    # each op costs about the same for 32 rows as for 512, so small batches pay it per row.
    group = max(1, ROWS_PER_MAP // batch_size)
    # A resumed pipeline starts at the group holding `start_batch`, numbered as an
    # uninterrupted run numbers it (the masks' seeds follow the number), and drops the batches
    # of that group that were already trained on.
    first_group, already = divmod(start_batch, group)
    rows = rows.skip(first_group * group * batch_size)
    base = pipeline_id * PIPELINE_SEED_STRIDE + first_group

    def parse(index, serialized):
        ids = records.decode_batch(serialized, record_len=record_len, dtype=dtype)
        ids = tf.ensure_shape(ids, [group * batch_size, record_len])
        stateless = tf.stack([tf.constant(seed, tf.int64), base + index])
        features = objective(ids, stateless)
        return {k: tf.reshape(v, [group, batch_size, *v.shape[1:]]) for k, v in features.items()}

    groups = rows.batch(group * batch_size, drop_remainder=True).enumerate()
    groups = groups.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    batches = groups.flat_map(tf.data.Dataset.from_tensor_slices).skip(already)
    return batches.prefetch(tf.data.AUTOTUNE)

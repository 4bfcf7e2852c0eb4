"""The baseline: the reference approach to TFRecord preparation, rebuilt for comparison.

Tokenize with `datasets.map` over the fast tokenizer, concatenate and chunk with Python lists
in a second `datasets.map`, then write one `tf.train.Example` of int64 lists (input_ids and
attention_mask) per record with `tf.io.TFRecordWriter`.
"""

from __future__ import annotations

import os
import sys
from itertools import chain


def reference_prepare(text_file: str, tokenizer_dir: str, out_dir: str, *, seq_len: int,
                      records_per_shard: int, num_proc: int) -> int:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import datasets
    import tensorflow as tf
    from transformers import AutoTokenizer

    datasets.disable_progress_bars()
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ds = datasets.load_dataset("text", data_files=[text_file], split="train",
                               cache_dir=os.path.join(out_dir, "hf-cache"))

    def tokenize(batch):
        return tok(batch["text"])

    ds = ds.map(tokenize, batched=True, num_proc=num_proc, remove_columns=["text"])

    def group(batch):
        joined = {k: list(chain(*batch[k])) for k in batch}
        total = len(joined["input_ids"]) // seq_len * seq_len
        return {k: [v[i:i + seq_len] for i in range(0, total, seq_len)] for k, v in joined.items()}

    ds = ds.map(group, batched=True, batch_size=1000, num_proc=num_proc)
    tokens = 0
    for shard, start in enumerate(range(0, len(ds), records_per_shard)):
        rows = ds[start:start + records_per_shard]
        path = os.path.join(out_dir, f"shard-{shard:05d}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for ids, mask in zip(rows["input_ids"], rows["attention_mask"], strict=True):
                feature = {
                    "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
                    "attention_mask": tf.train.Feature(int64_list=tf.train.Int64List(value=mask)),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
                tokens += len(ids)
    return tokens


if __name__ == "__main__":
    # python bench/reference_prepare.py TEXT TOKENIZER OUT SEQ_LEN RECORDS NUM_PROC
    import json
    import resource
    import time

    started = time.perf_counter()
    n = reference_prepare(sys.argv[1], sys.argv[2], sys.argv[3], seq_len=int(sys.argv[4]),
                          records_per_shard=int(sys.argv[5]), num_proc=int(sys.argv[6]))
    elapsed = time.perf_counter() - started
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
               resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(json.dumps({"tokens": n, "seconds": elapsed, "peak_rss_mb": peak / 1024}))

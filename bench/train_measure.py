"""Training measurements that each run in their own process (clean TensorFlow state).

    python -m bench.train_measure pipeline-ours CONFIG BATCHES
    python -m bench.train_measure pipeline-reference CONFIG BATCHES
    python -m bench.train_measure fit-reference CONFIG STEPS
Each prints one JSON line.

The reference reproduces the approach of Hugging Face's TF `run_mlm.py` on the same shards:
`parse_single_example` per record, then batch, then `DataCollatorForLanguageModeling`'s masking
(`tf_mask_tokens`, over every position), then `model.fit` with `transformers.create_optimizer`
and the model's own loss over the full vocabulary projection at every position.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import json
import sys
import time

SHUFFLE = 10_000
WARMUP_BATCHES = 5


def _setup(config_path: str):
    from payload.config import load_config
    from payload.data import shards as records
    from payload.training.model import load_tokenizer, token_ids

    config = load_config(config_path)
    manifest = records.load_manifest(config.output_dir)
    files = [
        os.path.join(config.output_dir, "data", s.name) for s in manifest.splits["train"].shards
    ]
    tokenizer, _ = load_tokenizer(config)
    return config, manifest, files, token_ids(tokenizer, config.model.family)


def reference_dataset(config, manifest, files, vocab):
    import tensorflow as tf
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

    from payload.data.shards import FEATURE

    tf_dtype = {"uint16": tf.uint16, "int32": tf.int32}[manifest.dtype]
    record_len = manifest.record_len

    def parse(serialized):
        example = tf.io.parse_single_example(
            serialized, {FEATURE: tf.io.FixedLenFeature([], tf.string)}
        )
        ids = tf.io.decode_raw(example[FEATURE], tf_dtype, little_endian=True)
        return tf.cast(tf.reshape(ids, [record_len]), tf.int32)

    # The collator only needs the tokenizer for its mask token and vocabulary size here.
    collator = DataCollatorForLanguageModeling(
        tokenizer=PreTrainedTokenizerFast(
            tokenizer_object=_tokenizer_object(config), mask_token="<mask>", pad_token="<pad>"
        ),
        mlm_probability=0.15,
        return_tensors="tf",
    )
    special = tf.constant(vocab.special)

    def mask(ids):
        special_mask = tf.reduce_any(ids[..., None] == special, axis=-1)
        inputs, labels = collator.tf_mask_tokens(
            ids,
            vocab_size=vocab.vocab_size,
            mask_token_id=vocab.mask,
            special_tokens_mask=special_mask,
        )
        return {"input_ids": inputs, "attention_mask": tf.ones_like(inputs), "labels": labels}

    ds = tf.data.TFRecordDataset(files).repeat()
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).shuffle(SHUFFLE, seed=0)
    ds = ds.batch(config.train.batch_size, drop_remainder=True)
    return ds.map(mask, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def _tokenizer_object(config):
    from tokenizers import Tokenizer

    from payload.data.tokenizer import TOKENIZER_FILE, tokenizer_source

    return Tokenizer.from_file(os.path.join(tokenizer_source(config), TOKENIZER_FILE))


def ours_dataset(config, manifest, files, vocab):
    """tpuctl's input: the neutral reader's masked batches (payload.data.stream), one host."""
    from payload.training.inputs import check_inputs, with_data_order

    del manifest, files, vocab
    inputs = with_data_order(config, check_inputs(config), resume=False, start=0)
    return inputs.train_batches(0, host=0, num_hosts=1)


def pipeline(kind: str, config_path: str, batches: int) -> dict:
    config, manifest, files, vocab = _setup(config_path)
    make = ours_dataset if kind == "ours" else reference_dataset
    iterator = iter(make(config, manifest, files, vocab))
    for _ in range(WARMUP_BATCHES):
        next(iterator)
    started = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    seconds = time.perf_counter() - started
    examples = batches * config.train.batch_size
    return {"examples": examples, "seconds": seconds, "examples_per_s": examples / seconds}


def fit_reference(config_path: str, steps: int) -> dict:
    import tf_keras
    from transformers import TFRobertaForMaskedLM, create_optimizer

    from payload.training.model import model_config

    config, manifest, files, vocab = _setup(config_path)
    hf_config = model_config(config.model, vocab=vocab, seq_len=config.data.seq_len)
    model = TFRobertaForMaskedLM(hf_config)
    # The schedule of the whole configured run, as ours uses, of which `steps` are timed.
    optimizer, _ = create_optimizer(
        init_lr=config.train.learning_rate,
        num_train_steps=config.train.steps,
        num_warmup_steps=config.train.warmup_steps,
        weight_decay_rate=config.train.weight_decay,
    )
    model.compile(optimizer=optimizer)  # the model's internal MLM loss, as run_mlm.py does

    class Timer(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.marks: list[float] = []
            self.losses: list[float] = []

        def on_train_batch_end(self, batch, logs=None):
            self.marks.append(time.perf_counter())
            self.losses.append(float(logs["loss"]))

    timer = Timer()
    dataset = reference_dataset(config, manifest, files, vocab)
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[timer])
    # Steady state: from the end of the warm-up batches (graph building) to the last step.
    timed = len(timer.marks) - WARMUP_BATCHES
    seconds = timer.marks[-1] - timer.marks[WARMUP_BATCHES - 1]
    # Keras reports the running mean of the epoch: recover each step's own loss.
    means = timer.losses
    losses = [means[0]] + [(i + 1) * means[i] - i * means[i - 1] for i in range(1, len(means))]
    steps_per_s = timed / seconds
    # Utilisation as the train stage measures it: the model FLOPs this model does per step (its
    # MLM head at every position) over a matmul probe run here, after training.
    from payload.engines.tensorflow.trainer import cpu_peak_flops
    from payload.training.runplan import step_flops

    flops = step_flops(hf_config.to_dict(), seq_len=config.data.seq_len,
                       mlm_probability=1.0).total * config.train.batch_size
    peak = cpu_peak_flops()
    return {"steps": timed, "seconds": seconds, "steps_per_s": steps_per_s, "losses": losses,
            "mfu": flops * steps_per_s / peak, "peak_flops": peak}


def main() -> None:
    command, config_path, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if command.startswith("pipeline-"):
        result = pipeline(command.removeprefix("pipeline-"), config_path, count)
    elif command == "fit-reference":
        result = fit_reference(config_path, count)
    else:
        raise SystemExit(f"unknown measurement {command}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""The framework-free reader: global batch s is a function of the manifest, the seed and s; hosts
read their rows from record offsets; resumes with another layout or batch size continue exactly."""

import numpy as np
import pytest

from payload.core.errors import UserError
from payload.core.families import t5_expanded_length
from payload.data import shards
from payload.data.objectives import CausalLM, MaskedLM, SpanCorruption
from payload.data.reader import Permutation, Reader, batch_digest, mix_counts
from payload.data.stream import EvalStream, Segment, TrainStream, resume_segments

RECORD_LEN = 6


def write_manifest(folder, sources: dict[str, list[int]], dtype="uint16") -> shards.Manifest:
    """Shards whose rows say (source, shard, row) in their first tokens; one shard per count."""
    entries = []
    for s, (name, counts) in enumerate(sources.items()):
        for k, count in enumerate(counts):
            rows = np.zeros((count, RECORD_LEN), dtype=np.int64)
            rows[:, 0], rows[:, 1], rows[:, 2] = s, k, np.arange(count)
            rows[:, 3:] = 7 + (np.arange(count)[:, None] * 3 + np.arange(3)) % 50
            rel = f"train/train-w00000of00001-{s:02d}{k:03d}.tfrecord"
            (folder / "train").mkdir(exist_ok=True)
            with open(folder / rel, "wb") as out:
                stats = shards.ShardWriter(out, dtype=dtype).write_rows(rows) or None
            size = (folder / rel).stat().st_size
            entries.append(shards.ShardEntry(rel, count, count * RECORD_LEN, size, "", name))
            del stats
    return shards.Manifest(
        format=shards.FORMAT, seq_len=RECORD_LEN, record_len=RECORD_LEN, dtype=dtype,
        family="gpt2", vocab_size=60, tokenizer_fingerprint="t", data_fingerprint="d",
        num_workers=1, documents=1, invalid_utf8_lines=0,
        splits={"train": shards.SplitSummary(shards=entries)})


def stream_of(manifest, folder, *, batch=8, seed=0, weights=None, segments=None, objective=None):
    reader = Reader.of(manifest, str(folder), "train")
    weights = weights or dict.fromkeys(reader.sources, 1.0)
    segments = segments or [Segment(step=0, consumed=dict.fromkeys(weights, 0), batch_size=batch,
                                    weights=weights, seed=seed, data="d")]
    return TrainStream(reader, segments, objective or CausalLM(pad_id=0), seed)


def test_the_permutation_is_a_bijection_for_every_size_and_differs_by_key():
    for n in (1, 2, 3, 5, 16, 17, 1000, 4097):
        out = Permutation(n, key=3)(np.arange(n))
        assert sorted(out.tolist()) == list(range(n))
    a, b = Permutation(1000, key=1)(np.arange(1000)), Permutation(1000, key=2)(np.arange(1000))
    assert (a != b).mean() > 0.9 and (a != np.arange(1000)).mean() > 0.9


def test_a_huge_permutation_needs_no_table():
    # 10^12 records: a few entries of it cost what a few of a small one cost.
    out = Permutation(10**12, key=5)(np.array([0, 1, 10**12 - 1]))
    assert ((out >= 0) & (out < 10**12)).all() and len(set(out.tolist())) == 3


def test_every_record_once_per_epoch_and_each_epoch_a_new_order(tmp_path):
    manifest = write_manifest(tmp_path, {"": [7, 5, 12]})  # 24 records, batches of 8
    stream = stream_of(manifest, tmp_path)
    epochs = [np.concatenate([stream.global_ids(s) for s in range(e * 3, e * 3 + 3)])
              for e in range(2)]
    keys = [[(r[1], r[2]) for r in ids.tolist()] for ids in epochs]
    assert sorted(keys[0]) == sorted(keys[1]) and len(set(keys[0])) == 24
    assert keys[0] != keys[1]


def test_hosts_read_their_rows_and_together_the_global_batch(tmp_path):
    manifest = write_manifest(tmp_path, {"": [9, 9, 9]})
    stream = stream_of(manifest, tmp_path, batch=12)
    for step in (0, 5):
        whole = stream.global_ids(step)
        for hosts in (1, 2, 3, 4):
            parts = [stream.host_features(step, h, hosts)["input_ids"] for h in range(hosts)]
            assert (np.concatenate(parts) == whole).all()


def test_the_order_follows_the_seed_alone(tmp_path):
    manifest = write_manifest(tmp_path, {"": [40]})
    one = [batch_digest(stream_of(manifest, tmp_path, seed=1).global_ids(s)) for s in range(3)]
    again = [batch_digest(stream_of(manifest, tmp_path, seed=1).global_ids(s)) for s in range(3)]
    other = [batch_digest(stream_of(manifest, tmp_path, seed=2).global_ids(s)) for s in range(3)]
    assert one == again and one != other


def test_masks_depend_on_the_step_and_the_row_not_on_the_host_layout(tmp_path):
    manifest = write_manifest(tmp_path, {"": [30]})
    masker = MaskedLM(seq_len=RECORD_LEN, vocab_size=60, special_ids=(0, 1, 2), mask_id=2,
                      pad_id=0, mlm_probability=0.5)
    stream = stream_of(manifest, tmp_path, objective=masker)
    whole = stream.host_features(4, 0, 1)
    halves = [stream.host_features(4, h, 2) for h in range(2)]
    for key, value in whole.items():
        assert (np.concatenate([h[key] for h in halves]) == value).all(), key
    assert (stream.host_features(5, 0, 1)["masked_positions"] != whole["masked_positions"]).any()


def test_the_batches_of_a_resume_are_those_of_an_uninterrupted_run(tmp_path):
    manifest = write_manifest(tmp_path, {"": [10, 13]})
    stream = stream_of(manifest, tmp_path)
    batches = stream.host_batches(0, 0, 1, digest=True)
    first = [next(batches)["input_ids"] for _ in range(8)]
    resumed = stream_of(manifest, tmp_path).host_batches(5, 1, 2)
    assert (next(resumed)["input_ids"] == first[5][4:]).all()
    assert sorted(stream.digests)[:8] == list(range(8))
    assert stream.digests[3] == batch_digest(first[3])


def test_another_batch_size_continues_from_the_same_example(tmp_path):
    manifest = write_manifest(tmp_path, {"": [50]})
    old = stream_of(manifest, tmp_path, batch=8)
    want = Segment(step=0, consumed={}, batch_size=4, weights={"": 1.0}, seed=0, data="d")
    segments, note = resume_segments(old.segments, want, start=3, allow_change=False)
    assert "example 24" in note and "8 -> 4" in note
    new = stream_of(manifest, tmp_path, segments=segments)
    examples = np.concatenate([old.global_ids(s) for s in range(3, 6)])  # examples 24..47
    assert (np.concatenate([new.global_ids(s) for s in range(3, 9)]) == examples).all()
    assert (new.global_ids(2) == old.global_ids(2)).all()  # the steps taken stay as they were


def test_the_same_settings_add_no_segment_and_another_seed_is_refused(tmp_path):
    want = Segment(step=0, consumed={}, batch_size=8, weights={"": 1.0}, seed=0, data="d")
    fresh, note = resume_segments(None, want, start=0, allow_change=False)
    assert note is None and fresh[0].consumed == {"": 0}
    same, note = resume_segments(fresh, want, start=30, allow_change=False)
    assert same == fresh and note is None
    for changed, word in ((dict(seed=1), "train.seed"), (dict(data="e"), "prepared data")):
        other = Segment(**{**want.__dict__, **changed})
        with pytest.raises(UserError, match=word) as caught:
            resume_segments(fresh, other, start=30, allow_change=False)
        assert "--new-data-order" in caught.value.hint
        segments, note = resume_segments(fresh, other, start=30, allow_change=True)
        assert segments[-1].step == 30 and segments[-1].consumed == {"": 240}


def test_checkpoints_of_an_earlier_tpuctl_continue_from_their_example_offset():
    want = Segment(step=0, consumed={}, batch_size=8, weights={"": 1.0}, seed=0, data="d")
    segments, note = resume_segments(None, want, start=30, allow_change=False)
    assert segments == [Segment(**{**want.__dict__, "step": 30, "consumed": {"": 240}})]
    assert "example 240" in note


def test_a_mixture_draws_by_weight_exactly_and_keeps_its_sources_apart(tmp_path):
    manifest = write_manifest(tmp_path, {"a.txt": [30, 20], "b.txt": [13]})
    stream = stream_of(manifest, tmp_path, batch=10, weights={"a.txt": 0.8, "b.txt": 0.2})
    rows = np.concatenate([stream.global_ids(s) for s in range(20)])
    assert (rows[:, 0] == 0).sum() == 160 and (rows[:, 0] == 1).sum() == 40
    assert stream.consumed(20) == {"a.txt": 160, "b.txt": 40}
    # Other weights on resume: the steps before stay, the counts go on from where they were.
    want = Segment(step=0, consumed={}, batch_size=10, weights={"a.txt": 0.5, "b.txt": 0.5},
                   seed=0, data="d")
    segments, note = resume_segments(stream.segments, want, start=10, allow_change=False)
    assert "weights" in note
    later = stream_of(manifest, tmp_path, segments=segments)
    assert (later.global_ids(9) == stream.global_ids(9)).all()
    assert later.consumed(20) == {"a.txt": 80 + 50, "b.txt": 20 + 50}


def test_mix_counts_never_go_back_and_add_up():
    weights = [0.5, 0.3, 0.15, 0.05]
    previous = [0] * 4
    for examples in range(0, 500):
        counts = mix_counts(examples, weights)
        assert sum(counts) == examples
        assert all(c >= p for c, p in zip(counts, previous, strict=True))
        assert all(abs(c - examples * w) <= 4 for c, w in zip(counts, weights, strict=True))
        previous = counts


def test_the_eval_batches_are_the_validation_records_in_order(tmp_path):
    manifest = write_manifest(tmp_path, {"": [5, 6]})
    reader = Reader.of(manifest, str(tmp_path), "train")
    evals = EvalStream(reader, CausalLM(pad_id=0), seed=0, batch_size=4)
    ids = np.concatenate([evals.host_features(k, 0, 1)["input_ids"] for k in range(3)])
    assert [tuple(r[1:3]) for r in ids[:11].tolist()] == (
        [(0, i) for i in range(5)] + [(1, i) for i in range(6)])
    assert (evals.host_features(1, 1, 2)["input_ids"] == ids[6:8]).all()


def test_a_shard_shorter_than_the_manifest_says_is_an_error(tmp_path):
    manifest = write_manifest(tmp_path, {"": [10]})
    path = tmp_path / manifest.splits["train"].shards[0].name
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(OSError, match="short read"):
        for step in range(3):
            stream_of(manifest, tmp_path).global_ids(step)


def test_objectives_keep_static_shapes_and_exact_counts():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 1000, size=(64, 32)).astype(np.int32)
    ids[:, 0] = 2
    masker = MaskedLM(seq_len=32, vocab_size=1000, special_ids=(0, 1, 2, 3, 4), mask_id=4,
                      pad_id=0, dense_labels=True)
    draw = rng.random((64, masker.draws), dtype=np.float32)
    out = masker(ids, draw)
    chosen = out["labels"] != -100
    assert (chosen.sum(axis=1) == round(31 * 0.15)).all() and not chosen[:, 0].any()
    assert (out["input_ids"][~chosen] == ids[~chosen]).all()
    expanded = t5_expanded_length(28, 0.15, 3.0)
    ids = rng.integers(5, 1000, size=(64, expanded)).astype(np.int32)
    corrupt = SpanCorruption(expanded_len=expanded, seq_len=28, noise_density=0.15,
                             mean_noise_span_length=3.0, eos_id=2, pad_id=0,
                             sentinel_ids=tuple(range(1000, 1100)))
    out = corrupt(ids, rng.random((64, corrupt.draws), dtype=np.float32))
    assert out["input_ids"].shape == (64, 28) and out["labels"].shape[1] == corrupt.target_len
    noise = (out["labels"] < 1000) & (out["labels"] != 2)
    assert (noise.sum(axis=1) == corrupt.num_noise).all()

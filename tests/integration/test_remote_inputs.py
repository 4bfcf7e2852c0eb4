"""gs:// corpora and outputs (against a local Cloud Storage emulator) and hf: datasets."""

from __future__ import annotations

from payload.data import shards as records
from tests.support.configs import base_config, write_config
from tests.support.runners import assert_user_error, payload_env, run_payload


def test_tokenizer_and_prepare_on_cloud_storage(gcs_emulator, tmp_path, small_corpus):
    from payload.core import storage

    text = small_corpus.read_text()
    half = len(text) // 2
    cut = text.index("\n", half) + 1
    storage.write_text("gs://tpuctl-test/texts/part-0.txt", text[:cut])
    storage.write_text("gs://tpuctl-test/texts/part-1.txt", text[cut:])
    config = base_config("gs://tpuctl-test/runs/one", "gs://tpuctl-test/texts/*.txt",
                         tokenizer={"kind": "wordpiece", "vocab_size": 700},
                         model={"family": "bert"})
    path = write_config(tmp_path / "run.yaml", config)
    env = {**payload_env(), "STORAGE_EMULATOR_HOST": gcs_emulator}
    run_payload("tokenizer", "--config", str(path), env=env)
    for index in range(2):
        run_payload("prepare", "--config", str(path), "--worker-index", str(index),
                    "--num-workers", "2", env=env)
    manifest = records.load_manifest("gs://tpuctl-test/runs/one")
    records.verify_shards("gs://tpuctl-test/runs/one", manifest)
    assert manifest.num_workers == 2 and manifest.splits["train"].records > 0
    assert manifest.documents == len([line for line in text.splitlines() if line.strip()])
    assert storage.exists("gs://tpuctl-test/runs/one/tokenizer/tokenizer.json")
    assert storage.exists("gs://tpuctl-test/runs/one/config.yaml")
    # The same run on a local disk makes the same shards, byte for byte.
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "part-0.txt").write_text(text[:cut])
    (tmp_path / "texts" / "part-1.txt").write_text(text[cut:])
    local = base_config(tmp_path / "local", tmp_path / "texts" / "*.txt",
                        tokenizer={"path": str(tmp_path / "tok")}, model={"family": "bert"})
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (tok_dir / name).write_bytes(storage.read_bytes(f"gs://tpuctl-test/runs/one/tokenizer/{name}"))
    local_path = write_config(tmp_path / "local.yaml", local)
    for index in range(2):
        run_payload("prepare", "--config", str(local_path), "--worker-index", str(index),
                    "--num-workers", "2")
    here = records.load_manifest(str(tmp_path / "local"))
    assert here.tokenizer_fingerprint == manifest.tokenizer_fingerprint
    for split in records.SPLITS:
        assert [(e.name, e.sha256) for e in here.splits[split].shards] == [
            (e.name, e.sha256) for e in manifest.splits[split].shards]


def test_missing_cloud_inputs(gcs_emulator, tmp_path):
    config = base_config("gs://tpuctl-test/runs/two", "gs://tpuctl-test/nothing/*.txt")
    path = write_config(tmp_path / "run.yaml", config)
    env = {**payload_env(), "STORAGE_EMULATOR_HOST": gcs_emulator}
    proc = run_payload("tokenizer", "--config", str(path), env=env, check=False)
    assert_user_error(proc, "no file matches", "gs://tpuctl-test/nothing/*.txt")



"""gs:// corpora and outputs (against a local Cloud Storage emulator) and hf: datasets."""

from __future__ import annotations

import json

import pytest

from payload.config import DataConfig
from payload.core.errors import UserError
from payload.data import corpus


def test_a_local_hugging_face_dataset_is_shared_by_stride(tmp_path):
    folder = tmp_path / "dataset"
    folder.mkdir()
    with (folder / "train.jsonl").open("w") as f:
        for i in range(60):
            f.write(json.dumps({"text": f"document {i}", "n": i}) + "\n")
    data = DataConfig(corpus=[f"hf:{folder}"])
    sources = corpus.resolve_sources(data)
    seen = []
    for index in range(3):
        pieces = corpus.share(sources, worker_index=index, num_workers=3)
        texts = [t for b in corpus.iter_batches(sources, pieces, data) for t in b.texts]
        assert len(texts) == 20
        seen += texts
    assert sorted(seen) == sorted(f"document {i}" for i in range(60))


def test_an_unreachable_hugging_face_dataset(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    data = DataConfig(corpus=["hf:someone/not-a-dataset"])
    sources = corpus.resolve_sources(data)
    with pytest.raises(UserError) as info:
        list(corpus.iter_batches(sources, corpus.share(sources, worker_index=0, num_workers=1),
                                 data))
    assert "cannot load Hugging Face dataset 'someone/not-a-dataset'" in str(info.value)
    assert "\n" not in str(info.value)

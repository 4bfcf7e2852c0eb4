"""A broken weights file or config.json in a model folder (issue 27, item 5) is one line naming
the file and what is wrong, before anything starts and nothing written: every entry of a
model.safetensors header is checked as the safetensors reader checks it (the launcher's
pre-flight and the train stage's readers alike), and config.json must be a JSON object whose
sizes are whole numbers. A well-formed file still loads, to the byte."""

from __future__ import annotations

import pytest

from payload.core.errors import UserError
from tests.support.weights_files import (
    model_folder,
    run_config,
)


def test_a_broken_tf_model_h5_is_one_line(tmp_path):
    """The TF engine's other weights file: not HDF5 at all (integration: builds the TF
    model)."""
    pytest.importorskip("tensorflow")
    from payload.engines.tensorflow.model import build_model
    from payload.engines.tensorflow.pretrained import load_weights
    from payload.training.model import TokenIds, model_config

    folder = model_folder(tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "tf_model.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    settings = run_config(tmp_path, folder)
    vocab = TokenIds(vocab_size=600, special=(0, 1, 2, 3, 4), pad=1, unk=3, mask=4, bos=0, eos=2)
    model = build_model(model_config(settings.model, vocab=vocab, seq_len=32))
    with pytest.raises(UserError, match=r"tf_model\.h5 cannot be read"):
        load_weights(model, str(folder))

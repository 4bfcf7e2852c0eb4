"""Named sizes: one description of the architecture per config, parameter counts from the shapes
that agree with the real models (TensorFlow's and PyTorch's) for every family and size, and the
T5 v1.1 shape (gated-GELU, untied head, 64-wide heads) trained, exported and loaded in PyTorch."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from payload.config import parse_config
from payload.core.families import FAMILIES
from payload.core.sizes import SIZES, architecture, parameter_count
from tests.support.paths import SCRIPTS, TORCH_PYTHON, TORCH_READY
from tests.support.sizes import PUBLISHED_VOCAB, run_config


def every_size():
    return [(family, size) for family, sizes in SIZES.items() for size in sizes]


# --- one description of the architecture ---------------------------------------------------


# --- parameter counts ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tensorflow_counts():
    """The TF models' own counts for tiny and small of every family (vocabulary 1000), and an
    explicit shape, with the configs they were built from."""
    pytest.importorskip("tensorflow")
    from payload.engines.tensorflow.model import build_model
    from payload.training.model import TokenIds, model_config

    vocab = TokenIds(vocab_size=1000, special=(0, 1, 2, 3, 4), pad=1, unk=3, mask=4, bos=0,
                     eos=2)
    found = []
    for family in (f for f in SIZES if "tensorflow" in FAMILIES[f].engines):
        for model in ({"family": family, "size": "tiny"}, {"family": family, "size": "small"},
                      {"family": family, "hidden_size": 48, "num_layers": 3, "num_heads": 4,
                       "intermediate_size": 80}):
            config = run_config(model, seq_len=64)
            hf = model_config(config.model, vocab=vocab, seq_len=64)
            found.append((config, hf.to_dict(), build_model(hf).count_params()))
    return found


def test_the_count_from_shapes_is_the_tensorflow_model_s_own(tensorflow_counts):
    for config, hf, real in tensorflow_counts:
        assert parameter_count(config, 1000) == real, config.model
        assert parameter_count(hf) == real, config.model  # from its transformers config


def pytorch_counts(configs: list[dict], tmp_path: Path) -> list[int]:
    if not TORCH_READY.exists():
        pytest.skip("no transformers 5.x environment (.venv-torch; `make setup-torch`)")
    path = tmp_path / "configs.json"
    path.write_text(json.dumps(configs))
    result = subprocess.run(
        [str(TORCH_PYTHON), str(SCRIPTS / "torch_param_count.py"), str(path)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.torch
def test_every_size_counts_as_the_pytorch_model_does(tmp_path):
    # The big sizes are built on PyTorch's meta device: shapes only, no memory.
    configs = [architecture(run_config({"family": family, "size": size}),
                            PUBLISHED_VOCAB[family]) for family, size in every_size()]
    real = pytorch_counts(configs, tmp_path)
    ours = [parameter_count(c) for c in configs]
    assert ours == real, [(fs, o, r) for fs, o, r in zip(every_size(), ours, real, strict=True)
                          if o != r]


@pytest.mark.torch
def test_tensorflow_and_pytorch_models_of_one_config_have_the_same_count(tensorflow_counts,
                                                                         tmp_path):
    real = pytorch_counts([hf for _, hf, _ in tensorflow_counts], tmp_path)
    assert real == [count for _, _, count in tensorflow_counts]


# --- T5 v1.1 end to end ------------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.slow  # the default suite's export of a T5 v1.1: tests/integration/test_export.py
def test_t5_v1_1_trains_exports_and_gives_the_same_logits_in_pytorch(tmp_path):
    pytest.importorskip("tensorflow")
    from safetensors.numpy import load_file

    from payload.stages.export import run_export
    from payload.stages.train import run_train
    from payload.training.model import load_tokenizer
    from tests.support.configs import training_config
    from tests.support.runs import prepared_run
    from tests.support.tf_models import checkpoint_model

    out = prepared_run(tmp_path, "t5")
    raw = training_config(out, "t5", steps=4, warmup_steps=0, checkpoint_every=4, eval_every=4)
    raw["model"] = {"family": "t5", "size": "tiny", "dropout": 0.0}
    config = parse_config(raw)
    run_train(config)
    run_export(config)
    folder = out / "model"
    saved = json.loads((folder / "config.json").read_text())
    assert (saved["feed_forward_proj"], saved["tie_word_embeddings"], saved["d_kv"],
            saved["num_heads"], saved["d_model"]) == ("gated-gelu", False, 64, 4, 256)
    weights = load_file(str(folder / "model.safetensors"))
    assert {"encoder.block.0.layer.1.DenseReluDense.wi_0.weight",
            "decoder.block.3.layer.2.DenseReluDense.wi_1.weight"} <= set(weights)
    assert weights["lm_head.weight"].shape == weights["shared.weight"].shape == (600, 256)
    assert not np.array_equal(weights["lm_head.weight"], weights["shared.weight"])

    model, (tokenizer, _) = checkpoint_model(config), load_tokenizer(config)
    ids = np.array(tokenizer(["The interpreter reads the module and runs it.", "A list"],
                             padding="longest")["input_ids"], dtype=np.int64)
    logits = model(ids, decoder_input_ids=ids[:, :5], training=False).logits.numpy()
    np.save(tmp_path / "ids.npy", ids)
    if not TORCH_READY.exists():
        pytest.skip("no transformers 5.x environment (.venv-torch; `make setup-torch`)")
    result = subprocess.run(
        [str(TORCH_PYTHON), str(SCRIPTS / "torch_logits.py"), str(folder), "t5",
         str(tmp_path / "ids.npy"), str(tmp_path / "logits.npy")],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert not json.loads(result.stdout.strip().splitlines()[-1])["problems"]
    torch_logits = np.load(tmp_path / "logits.npy")
    # Relative: the untied head's logits are large (no d_model**-0.5 scaling before it).
    np.testing.assert_allclose(torch_logits, logits, atol=1e-4 * np.abs(logits).max())
    assert (torch_logits.argmax(-1) == logits.argmax(-1)).mean() > 0.99

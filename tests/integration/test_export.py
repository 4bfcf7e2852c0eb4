"""The export stage: a model folder that loads back in TensorFlow, and in PyTorch
transformers 5.x, with the trained model's outputs."""

import json
import subprocess

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from payload.config import parse_config
from payload.core.errors import UserError
from payload.stages.export import run_export
from payload.stages.train import run_train
from payload.training.model import load_tokenizer
from tests.support.configs import training_config, training_run_config
from tests.support.paths import SCRIPTS, TORCH_PYTHON, TORCH_READY
from tests.support.runs import prepared_run
from tests.support.tf_models import checkpoint_model

TEXT = ["The interpreter reads the module and runs it.", "A list of numbers, then a dict."]


@pytest.fixture(scope="module", params=["bert", "roberta", "gpt2", "t5", "t5-v1.1"])
def exported(request, tmp_path_factory):
    family = request.param.split("-")[0]
    out = prepared_run(tmp_path_factory.mktemp("export"), family)
    raw = training_config(out, family, steps=6, checkpoint_every=3, eval_every=6)
    if request.param == "t5-v1.1":  # a published size: gated GELU and the untied head
        raw["model"] = {"family": "t5", "size": "tiny", "dropout": 0.0}
    config = parse_config(raw)
    run_train(config)
    run_export(config)
    model, (tokenizer, _) = checkpoint_model(config), load_tokenizer(config)
    ids = np.array(tokenizer(TEXT, padding="longest")["input_ids"], dtype=np.int64)[:, :12]
    extra = {"decoder_input_ids": ids[:, :5]} if family == "t5" else {}
    logits = model(ids, **extra, training=False).logits.numpy()
    return family, out / "model", ids, extra, logits


def test_model_folder_loads_back_in_tensorflow_with_the_same_logits(exported):
    import transformers

    family, folder, ids, extra, logits = exported
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tf_model.h5", "tokenizer.json"} <= names
    auto = {
        "bert": transformers.TFAutoModelForMaskedLM,
        "roberta": transformers.TFAutoModelForMaskedLM,
        "gpt2": transformers.TFAutoModelForCausalLM,
        "t5": transformers.TFAutoModelForSeq2SeqLM,
    }[family]
    loaded = auto.from_pretrained(str(folder), use_safetensors=False)
    np.testing.assert_allclose(loaded(ids, **extra).logits.numpy(), logits, atol=1e-5)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer(TEXT[0])["input_ids"]


@pytest.mark.torch
def test_model_folder_loads_in_pytorch_transformers_5_with_the_same_logits(exported, tmp_path):
    if not TORCH_READY.exists():
        pytest.skip("no transformers 5.x environment (.venv-torch; `make setup-torch`)")
    family, folder, ids, _, logits = exported
    np.save(tmp_path / "ids.npy", ids)
    result = subprocess.run(
        [
            str(TORCH_PYTHON),
            str(SCRIPTS / "torch_logits.py"),
            str(folder),
            family,
            str(tmp_path / "ids.npy"),
            str(tmp_path / "logits.npy"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["transformers"].startswith("5.") and not report["problems"]
    torch_logits = np.load(tmp_path / "logits.npy")
    np.testing.assert_allclose(torch_logits, logits, atol=1e-4)
    assert (torch_logits.argmax(-1) == logits.argmax(-1)).mean() > 0.99


def test_export_without_a_checkpoint_or_with_other_model_settings_is_refused(tmp_path):
    out = prepared_run(tmp_path, "gpt2")
    with pytest.raises(UserError, match="nothing to export"):
        run_export(training_run_config(out, "gpt2"))
    run_train(training_run_config(out, "gpt2", steps=2, warmup_steps=0))
    raw = training_run_config(out, "gpt2").model_dump(mode="json")
    raw["model"]["num_layers"] = 3
    with pytest.raises(UserError, match="model settings changed"):
        run_export(parse_config(raw))
    assert not (out / "model").exists()

"""Exported models used the way users call them: `generate(**tokenizer(prompt))` for GPT-2 and
T5, a `fill-mask` pipeline for BERT and RoBERTa, in TensorFlow (transformers 4.x) and in PyTorch
(transformers 5.x), on a tiny model trained enough that its predictions are not degenerate."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from payload.config import parse_config
from payload.stages.export import run_export
from payload.stages.train import run_train
from tests.support.configs import training_config
from tests.support.paths import SCRIPTS, TORCH_PYTHON, TORCH_READY
from tests.support.runs import prepared_run

NEW_TOKENS = 12  # as in tests/torch_usage.py
PROMPTS = {
    "gpt2": ["The interpreter reads the module and", "Return a list of the"],
    "t5": ["The interpreter <extra_id_0> the module and runs it.",
           "Return a <extra_id_0> of the <extra_id_1> in the dictionary."],
}
MASK_PROMPTS = ["The interpreter reads the {mask} and runs it.", "Return a list of the {mask}."]


def train_and_export(tmp_path_factory, family: str, size: str | None = None) -> Path:
    out = prepared_run(tmp_path_factory.mktemp("usage"), family)
    if family in PROMPTS:
        # Enough to generate more than one token over and over (~40 s on this machine).
        raw = training_config(out, family, steps=600, batch_size=32, checkpoint_every=600,
                              eval_every=600)
        raw["model"].update(hidden_size=64, intermediate_size=256)
        if size:  # a published size instead (T5's: gated GELU, the untied head)
            raw["model"] = {"family": family, "size": size, "dropout": 0.0}
    else:
        raw = training_config(out, family, steps=80, checkpoint_every=80, eval_every=80)
    config = parse_config(raw)
    run_train(config)
    run_export(config)
    return out / "model"


@pytest.fixture(scope="module", params=[*sorted(PROMPTS),
                                        pytest.param("t5-tiny", marks=pytest.mark.slow)])
def generator(request, tmp_path_factory):
    family, _, size = request.param.partition("-")
    return family, train_and_export(tmp_path_factory, family, size or None)


# BERT's fill-mask in the slow tier: one masked-LM family proves the pipeline's point (both
# families' folders are checked against PyTorch's logits in test_export.py).
@pytest.fixture(scope="module", params=[pytest.param("bert", marks=pytest.mark.slow), "roberta"])
def filler(request, tmp_path_factory):
    return request.param, train_and_export(tmp_path_factory, request.param)


def load_tf(folder: Path, family: str):
    import transformers

    auto = {
        "bert": transformers.TFAutoModelForMaskedLM,
        "roberta": transformers.TFAutoModelForMaskedLM,
        "gpt2": transformers.TFAutoModelForCausalLM,
        "t5": transformers.TFAutoModelForSeq2SeqLM,
    }[family]
    model = auto.from_pretrained(str(folder), use_safetensors=False)
    return model, transformers.AutoTokenizer.from_pretrained(str(folder))


def greedy_by_hand(model, family: str, input_ids, eos: int) -> list[int]:
    """What the model itself predicts, fed nothing but its ids (no tokenizer extras)."""
    import tensorflow as tf

    ids = tf.constant([input_ids], dtype=tf.int32)
    if family == "gpt2":
        new = []
        for _ in range(NEW_TOKENS):
            token = int(tf.argmax(model(ids).logits[0, -1]))
            new.append(token)
            if token == eos:
                break
            ids = tf.concat([ids, [[token]]], axis=1)
        return new
    decoded = [model.config.decoder_start_token_id]
    for _ in range(NEW_TOKENS):
        logits = model(input_ids=ids, decoder_input_ids=tf.constant([decoded])).logits
        token = int(tf.argmax(logits[0, -1]))
        decoded.append(token)
        if token == eos:
            break
    return decoded


def in_pytorch(folder: Path, family: str, prompts: list[str]) -> dict:
    if not TORCH_READY.exists():
        pytest.skip("no transformers 5.x environment (.venv-torch; `make setup-torch`)")
    result = subprocess.run(
        [str(TORCH_PYTHON), str(SCRIPTS / "torch_usage.py"), str(folder), family,
         *prompts],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["transformers"].startswith("5.") and not report["problems"], report
    return report


def tf_generate(folder: Path, family: str) -> tuple[list[list[int]], list[list[int]]]:
    """(generate's new tokens, the by-hand greedy tokens) per prompt, in TensorFlow."""
    model, tokenizer = load_tf(folder, family)
    generated, by_hand = [], []
    for prompt in PROMPTS[family]:
        encoded = tokenizer(prompt, return_tensors="tf")
        # The model's own inputs only: token_type_ids made TF GPT-2 write "the the the".
        assert sorted(encoded) == ["attention_mask", "input_ids"]
        out = model.generate(**encoded, max_new_tokens=NEW_TOKENS, do_sample=False)
        start = encoded["input_ids"].shape[1] if family == "gpt2" else 0
        generated.append(out[0, start:].numpy().tolist())
        ids = encoded["input_ids"][0].numpy().tolist()
        by_hand.append(greedy_by_hand(model, family, ids, model.config.eos_token_id))
    return generated, by_hand


@pytest.mark.torch
def test_greedy_generate_is_the_models_own_prediction_and_the_same_in_both_frameworks(generator):
    family, folder = generator
    generated, by_hand = tf_generate(folder, family)
    print(family, "greedy tokens:", by_hand)
    assert generated == by_hand
    # Trained enough to say something: not one token over and over.
    assert all(len(set(tokens[1:] if family == "t5" else tokens)) > 2 for tokens in by_hand), (
        by_hand)
    report = in_pytorch(folder, family, PROMPTS[family])
    assert report["inputs"] == ["attention_mask", "input_ids"]
    assert report["generated"] == generated


@pytest.mark.torch
def test_fill_mask_pipeline_gives_the_models_prediction_in_both_frameworks(filler):
    import tensorflow as tf
    import transformers

    family, folder = filler
    model, tokenizer = load_tf(folder, family)
    prompts = [p.format(mask=tokenizer.mask_token) for p in MASK_PROMPTS]
    # dtype=None: transformers 4.57's pipeline() reads its "auto" default through torch, which
    # a TensorFlow environment does not have (NameError: name 'torch' is not defined).
    fill = transformers.pipeline("fill-mask", model=model, tokenizer=tokenizer, top_k=5,
                                 framework="tf", dtype=None)
    tf_results = [fill(prompt) for prompt in prompts]
    for prompt, results in zip(prompts, tf_results, strict=True):
        encoded = tokenizer(prompt, return_tensors="tf")
        where = int(np.flatnonzero(encoded["input_ids"][0].numpy() == tokenizer.mask_token_id)[0])
        logits = model(input_ids=encoded["input_ids"]).logits[0, where]
        assert results[0]["token"] == int(tf.argmax(logits))
        assert len({r["token"] for r in results}) == 5
    report = in_pytorch(folder, family, prompts)
    for ours, theirs in zip(tf_results, report["fill_mask"], strict=True):
        assert [r["token"] for r in ours] == [t[0] for t in theirs]
        assert [r["token_str"] for r in ours] == [t[1] for t in theirs]
        np.testing.assert_allclose([r["score"] for r in ours], [t[2] for t in theirs], atol=1e-4)

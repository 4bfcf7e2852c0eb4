"""model.init_from: continued pretraining starts from a model folder's weights and tokenizer,
on another corpus, where the first run ended; mismatches are one line."""

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from payload.config import parse_config
from payload.core.errors import UserError
from payload.stages.export import run_export
from payload.stages.train import run_train
from payload.training.model import load_tokenizer
from tests.support.configs import training_config, write_training_config
from tests.support.corpora import bundled_documents
from tests.support.runners import assert_user_error, run_payload
from tests.support.runs import run_stage
from tests.support.tf_models import checkpoint_model


def corpus_file(folder, documents) -> str:
    path = folder / "corpus.txt"
    path.write_text("\n".join(" ".join(d.split()) for d in documents) + "\n")
    return str(path)


def prepared(out, raw: dict) -> None:
    """Run the tokenizer and prepare stages for a config, as the launcher would."""
    config_path = write_training_config(out, "gpt2")
    config_path.write_text(json.dumps(raw))
    for stage in ("tokenizer", "prepare"):
        result = run_stage(stage, config_path)
        assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """A tiny GPT-2 trained on the first half of the bundled corpus, exported."""
    out = tmp_path_factory.mktemp("first") / "run"
    out.mkdir()
    raw = training_config(out, "gpt2", steps=60)
    raw["data"].update(corpus=[corpus_file(out.parent, bundled_documents()[:2500])],
                       document_split="line")
    prepared(out, raw)
    run_train(parse_config(raw))
    run_export(parse_config(raw))
    return out, raw


def continued_config(out, model_folder, corpus, **train) -> dict:
    raw = training_config(out, "gpt2", **train)
    raw["data"].update(corpus=[str(corpus)], document_split="line")
    raw["model"] = {"family": "gpt2", "init_from": str(model_folder), "dropout": 0.0}
    del raw["tokenizer"]  # the model folder's own
    return raw


@pytest.fixture(scope="module")
def other_corpus(tmp_path_factory):
    # The other half of the bundled corpus: documents the first run never saw.
    return corpus_file(tmp_path_factory.mktemp("other"), bundled_documents()[2500:])


def test_continued_pretraining_starts_where_the_first_run_ended(first_run, other_corpus,
                                                                tmp_path):
    first_run, _ = first_run
    first = json.loads((first_run / "metrics.json").read_text())["evals"]
    out = tmp_path / "second"
    raw = continued_config(out, first_run / "model", other_corpus, steps=20, eval_every=10)
    prepared(out, raw)
    # The model's tokenizer is used, not a new one.
    assert ((out / "tokenizer" / "tokenizer.json").read_bytes()
            == (first_run / "model" / "tokenizer.json").read_bytes())
    assert not (out / "tokenizer" / "model.safetensors").exists()
    run_train(parse_config(raw))
    second = json.loads((out / "metrics.json").read_text())["evals"]
    scratch, ended, started = first[0]["loss"], first[-1]["loss"], second[0]["loss"]
    # From scratch a model starts near ln(vocabulary) = 6.4; this one near where the first
    # ended (another corpus of the same kind of text: a little above or below).
    print(f"losses: from scratch {scratch:.3f}, first run's end {ended:.3f}, "
          f"continued run's start {started:.3f}, its end {second[-1]['loss']:.3f}")
    assert started < scratch - 0.5 and abs(started - ended) < 0.3, (scratch, ended, started)
    assert second[-1]["loss"] < scratch - 0.5

    run_export(parse_config(raw))
    import transformers

    model = checkpoint_model(parse_config(raw))
    tokenizer, _ = load_tokenizer(parse_config(raw))
    ids = np.array([tokenizer("The interpreter reads the module.")["input_ids"]])
    loaded = transformers.TFAutoModelForCausalLM.from_pretrained(str(out / "model"),
                                                                 use_safetensors=False)
    np.testing.assert_allclose(loaded(ids).logits.numpy(), model(ids).logits.numpy(), atol=1e-5)
    before = transformers.TFAutoModelForCausalLM.from_pretrained(str(first_run / "model"),
                                                                 use_safetensors=False)
    assert not np.allclose(before(ids).logits.numpy(), model(ids).logits.numpy(), atol=1e-3)


def test_a_tokenizer_larger_than_the_model_s_vocabulary_is_refused(first_run, tmp_path):
    first_run, _ = first_run
    folder = tmp_path / "model"
    shutil.copytree(first_run / "model", folder)
    settings = json.loads((folder / "config.json").read_text())
    settings["vocab_size"] = 500
    (folder / "config.json").write_text(json.dumps(settings))
    raw = continued_config(first_run, folder, first_run / "run.yaml")
    with pytest.raises(UserError, match=r"its tokenizer has 600 tokens but the model's "
                                        r"embeddings hold 500"):
        run_train(parse_config(raw))


def test_a_folder_without_what_training_needs_is_refused_before_anything_runs(first_run,
                                                                              tmp_path):
    first_run, _ = first_run
    folder = tmp_path / "model"
    shutil.copytree(first_run / "model", folder)
    (folder / "tokenizer.json").unlink()
    out = tmp_path / "out"
    shutil.copytree(first_run, out)  # prepared shards: training gets as far as the tokenizer
    raw = continued_config(out, folder, first_run / "run.yaml")
    with pytest.raises(UserError, match=r"model\.init_from .* has no tokenizer\.json"):
        run_train(parse_config(raw))
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(raw))
    assert_user_error(run_payload("tokenizer", "--config", str(config), check=False),
                      "has no tokenizer.json")
    (folder / "model.safetensors").unlink()
    (folder / "tf_model.h5").unlink()
    from payload.core.stages import Stage
    from payload.training.preflight import check_before_start

    with pytest.raises(UserError, match=r"has neither model\.safetensors nor tf_model\.h5"):
        check_before_start(parse_config(raw), stages={Stage.TRAIN}, resume=False,
                           overwrite=False)
    raw["tokenizer"] = {"path": str(first_run / "tokenizer")}
    with pytest.raises(UserError, match=r"model\.init_from brings its own tokenizer"):
        parse_config(raw)


def test_weights_from_the_tensorflow_file_alone_load_the_same(first_run, tmp_path):
    from payload.engines.tensorflow.model import build_model
    from payload.engines.tensorflow.pretrained import load_weights

    first_run, first_raw = first_run
    folder = tmp_path / "model"
    shutil.copytree(first_run / "model", folder)
    (folder / "model.safetensors").unlink()
    model = checkpoint_model(parse_config(first_raw))
    fresh = build_model(model.config)
    assert load_weights(fresh, str(folder)).endswith("tf_model.h5")
    for a, b in zip(model.weights, fresh.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize(("family", "size", "rename"), [
    ("bert", "tiny", {"LayerNorm.weight": "LayerNorm.gamma", "LayerNorm.bias": "LayerNorm.beta"}),
    ("roberta", "tiny", {}),
    ("gpt2", "tiny", {"transformer.": ""}),  # GPT-2's own checkpoints name the bare model
    ("t5", "tiny", {}),  # v1.1: gated feed-forward, untied head
])
def test_pytorch_layout_weights_load_into_the_tensorflow_model(tmp_path, family, size, rename):
    from safetensors.numpy import save_file

    from payload.core.pytorch_weights import with_tied_copies
    from payload.engines.tensorflow.export import pytorch_state_dict
    from payload.engines.tensorflow.model import build_model
    from payload.engines.tensorflow.pretrained import load_weights
    from payload.training.model import TokenIds, model_config

    vocab = TokenIds(vocab_size=300, special=(0, 1, 2, 3, 4), pad=1, unk=3, mask=4, bos=0, eos=2)
    settings = parse_config({
        "name": "m", "output_dir": str(tmp_path), "data": {"corpus": ["a.txt"]},
        "model": {"family": family, "size": size},
        "train": {"steps": 1, "batch_size": 8, "learning_rate": 1e-3},
    })
    source = build_model(model_config(settings.model, vocab=vocab, seq_len=128))
    state = with_tied_copies(pytorch_state_dict(source), family)  # as a PyTorch file holds it
    for old, new in rename.items():
        state = {key.replace(old, new): value for key, value in state.items()}
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    target = build_model(source.config)
    load_weights(target, str(tmp_path))
    assert len(target.weights) == len(source.weights)
    for a, b in zip(source.weights, target.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)
    del state[next(k for k in state if ".0." in k)]  # one weight of the first layer
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"model\.safetensors lacks"):
        load_weights(build_model(source.config), str(tmp_path))

"""What the run plan and the config say of the JAX engine's speed settings, before anything runs
and without importing JAX: the attention kernel of each attention call and why (a v6e slice, a
GPU-less local run), train.remat and the activations beside the state, model.attention_dropout."""

from __future__ import annotations

import pytest
import yaml

from payload.config import parse_config
from payload.core.errors import UserError
from payload.core.sizes import transformers_config
from tests.support.jax_plans import V6E, config
from tests.support.paths import REPO
from tests.support.runners import invoke


def _dry_run(tmp_path, monkeypatch, raw: dict):
    monkeypatch.setenv("TPUCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    path = tmp_path / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return invoke("train", "-c", path, "--dry-run")




def test_the_dry_run_of_a_v6e_run_names_its_attention_kernel_and_why(tmp_path, monkeypatch):
    # No dropout key at all: the fast program is the default (no attention dropout).
    raw = config(tmp_path, cluster=V6E, data={"seq_len": 1024},
                 tokenizer={"kind": "bpe", "vocab_size": 50257},
                 model={"family": "gpt2", "size": "small"},
                 train={"batch_size": 256, "bf16": True})
    del raw["output_dir"]
    result = _dry_run(tmp_path, monkeypatch, raw)
    assert result.exit_code == 0, result.output
    assert ("attention (causal self-attention): splash; TPU v6e: Pallas splash attention, "
            "blocks of 1024 queries x 1024 keys, a causal block mask") in result.output
    assert "with train.remat none (every activation kept)" in result.output
    # model.dropout is the other layers': the attention stays fused.
    result = _dry_run(tmp_path, monkeypatch, {**raw, "model": {**raw["model"], "dropout": 0.1}})
    assert "attention (causal self-attention): splash;" in result.output
    # Dropout on the attention weights asked for: the reference, and the way out.
    result = _dry_run(tmp_path, monkeypatch, {**raw, "model": {
        **raw["model"], "attention_dropout": 0.1}})
    assert ("attention (causal self-attention): reference; attention dropout 0.1: the "
            "reference attention, as the fused kernel (splash) has no dropout; "
            "model.attention_dropout: 0 lets this run use it") in result.output


def test_the_dry_run_of_a_local_run_names_the_reference_and_why(tmp_path, monkeypatch):
    result = _dry_run(tmp_path, monkeypatch, config(tmp_path))
    assert result.exit_code == 0, result.output
    assert ("attention (self-attention): reference; CPU: the reference attention (einsums, "
            "float32 softmax); the fused kernels are for GPU (cuDNN) and TPU (Pallas)"
            ) in result.output
    # The TensorFlow engine chooses no kernel: nothing said.
    result = _dry_run(tmp_path, monkeypatch, config(tmp_path, train={"engine": "tensorflow"}))
    assert result.exit_code == 0 and "attention (" not in result.output


def test_t5s_self_attentions_say_why_they_take_the_reference(tmp_path, monkeypatch):
    raw = config(tmp_path, cluster={**V6E, "accelerator_type": "v6e-4"},
                  data={"seq_len": 512}, tokenizer={"kind": "unigram", "vocab_size": 32000},
                  model={"family": "t5", "size": "base", "dropout": 0.0},
                  train={"batch_size": 64, "bf16": True})
    del raw["output_dir"]
    result = _dry_run(tmp_path, monkeypatch, raw)
    assert result.exit_code == 0, result.output
    assert "attention (encoder self-attention): reference; T5's learned relative-position " \
           "bias" in result.output
    assert "attention (cross-attention): reference; TPU: a sequence of 114 is not a multiple " \
           "of 128" in result.output


def test_gpt2_xl_on_one_v5e_chip_is_refused_before_anything_runs(tmp_path, monkeypatch):
    raw = config(tmp_path, cluster={**V6E, "zone": "us-central1-a",
                                     "accelerator_type": "v5litepod-1"},
                  data={"seq_len": 1024}, tokenizer={"kind": "bpe", "vocab_size": 50257},
                  model={"family": "gpt2", "size": "xl", "dropout": 0.0},
                  train={"batch_size": 64, "bf16": True})
    del raw["output_dir"]
    # In this process the command raises the UserError the console entry point shows as one
    # line with exit status 2 (launcher.cli.main).
    result = _dry_run(tmp_path, monkeypatch, raw)
    assert isinstance(result.exception, UserError), result.output
    line = str(result.exception)
    assert "20.3 GiB of training state" in line and "use v5litepod-4 or larger" in line
    assert not (tmp_path / "home").exists()  # nothing written
    too_big = {**raw, "cluster": {**raw["cluster"], "accelerator_type": "v5litepod-4"},
               "train": {**raw["train"], "batch_size": 256, "remat": "none"}}
    result = _dry_run(tmp_path, monkeypatch, too_big)
    assert isinstance(result.exception, UserError), result.output
    assert "needs about" in str(result.exception)
    assert "train.remat: full" in str(result.exception)


def test_train_remat_is_checked():
    raw = config(REPO / "unused")
    assert parse_config(raw).train.remat == "auto"
    assert parse_config(config(REPO / "unused", train={"remat": "full"})).train.remat == "full"
    with pytest.raises(UserError) as caught:
        parse_config(config(REPO / "unused", train={"remat": "everything"}))
    assert str(caught.value).endswith("train.remat must be one of 'auto', 'none', 'dots' or 'full' "
                                 "(got 'everything')")
    with pytest.raises(UserError, match="the tensorflow engine has no such setting"):
        parse_config(config(REPO / "unused", train={"engine": "tensorflow", "remat": "full"}))


def test_attention_dropout_is_the_models_own_setting():
    from payload.config import ModelConfig

    bert = ModelConfig(family="bert", size="tiny", dropout=0.1, attention_dropout=0.0)
    arch = transformers_config(bert, vocab_size=100, seq_len=128)
    assert (arch["hidden_dropout_prob"], arch["attention_probs_dropout_prob"]) == (0.1, 0.0)
    gpt2 = transformers_config(ModelConfig(family="gpt2", size="tiny", dropout=0.2),
                               vocab_size=100, seq_len=128)
    # Unset: none on the attention weights (the fused kernels' program), model.dropout elsewhere.
    assert (gpt2["attn_pdrop"], gpt2["resid_pdrop"], gpt2["embd_pdrop"]) == (0.0, 0.2, 0.2)
    roberta = transformers_config(ModelConfig(family="roberta", size="tiny"), vocab_size=100,
                                  seq_len=128)
    assert (roberta["hidden_dropout_prob"], roberta["attention_probs_dropout_prob"]) == (0.1, 0.0)
    gpt2 = transformers_config(ModelConfig(family="gpt2", size="tiny", attention_dropout=0.05),
                               vocab_size=100, seq_len=128)
    assert gpt2["attn_pdrop"] == 0.05
    with pytest.raises(UserError, match="T5 has one dropout rate"):
        parse_config(config(REPO / "unused", model={"family": "t5", "size": "tiny",
                                                     "attention_dropout": 0.0}))



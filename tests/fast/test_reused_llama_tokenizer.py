"""A Llama folder whose tokenizer names its special tokens its own way (SmolLM's: only
<|endoftext|>, <|im_start|>, <|im_end|>; TinyLlama's: no <pad>) continues pretraining: the
tokenizer stage takes it, prepare separates documents with its end token, and the model's
padding, start and end ids are the ones it declares (FamilySpec.tokens_of). One that declares
none of them is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.configs import base_config, line_corpus, write_config
from tests.support.prepared_shards import manifest_of, rows_of
from tests.support.runners import payload_main

SMOLLM = (("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
          {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
           "unk_token": "<|endoftext|>"})
TINYLLAMA = (("<unk>", "<s>", "</s>"),
             {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None})


def llama_folder(root: Path, specials: tuple[str, ...], declared: dict) -> Path:
    """A Llama-architecture folder (config.json, tokenizer files) with a byte-level BPE tokenizer
    whose special tokens are `specials`, and a tokenizer_config.json declaring `declared`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder = root / "pretrained"
    folder.mkdir()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([f"line {i} of a small corpus" for i in range(200)],
                            trainers.BpeTrainer(vocab_size=300, special_tokens=list(specials)))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", **declared}))
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 320,
        "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 256,
        "tie_word_embeddings": True}))
    return folder


def run_config(root: Path, folder: Path) -> Path:
    raw = base_config(root / "out", line_corpus(root), train={"engine": "jax"})
    raw["model"] = {"family": "llama", "init_from": str(folder)}
    del raw["tokenizer"]  # the folder's own
    return write_config(root / "run.yaml", raw)


@pytest.mark.parametrize(("specials", "declared", "end", "pad"), [
    (*SMOLLM, "<|endoftext|>", "<|endoftext|>"),
    (*TINYLLAMA, "</s>", "</s>"),
], ids=["smollm", "tinyllama"])
def test_a_llama_folder_with_its_own_special_tokens_is_taken(tmp_path, specials, declared, end,
                                                            pad):
    from tokenizers import Tokenizer

    from payload.config import load_config
    from payload.training import model as model_lib

    folder = llama_folder(tmp_path, specials, declared)
    config = run_config(tmp_path, folder)
    payload_main("tokenizer", "--config", config, check=True)
    payload_main("prepare", "--config", config, check=True)
    end_id = Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id(end)
    out = tmp_path / "out"
    # Documents (a line of the corpus, a few tokens each) are joined with the end token.
    assert manifest_of(out).documents == 100
    assert (rows_of(out, "train") == end_id).mean() > 0.05
    tokenizer, _ = model_lib.load_tokenizer(load_config(config))
    vocab = model_lib.token_ids(tokenizer, "llama")
    assert vocab.eos == end_id and vocab.pad == tokenizer.convert_tokens_to_ids(pad)
    assert vocab.bos == tokenizer.convert_tokens_to_ids(declared["bos_token"])
    hf = model_lib.model_config(load_config(config).model, vocab=vocab, seq_len=32)
    assert (hf.pad_token_id, hf.eos_token_id) == (vocab.pad, end_id)


def test_a_llama_folder_declaring_no_end_token_is_refused_in_one_line(tmp_path):
    folder = llama_folder(tmp_path, ("<|im_start|>", "<|im_end|>"), {})
    result = payload_main("tokenizer", "--config", run_config(tmp_path, folder))
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert f"model.init_from {folder} lacks llama's special tokens <pad>, <unk>, </s>" in line
    assert "continue from a model whose tokenizer has them" in line
    assert not (tmp_path / "out").exists()
